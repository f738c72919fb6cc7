#!/usr/bin/env bash
# Source on an offline GPU machine (no package index) to make one vLLM release and the harness
# importable:
#   source scripts/gpu/offline_env.sh [RELEASE]        # RELEASE: 0.34.0 (default) or 0.26.0
# Expects the wheelhouse parts that `scripts/gpu/build_wheelhouse.sh RELEASE` made in /tmp/parts
# (or $PD_ACCURACY_PARTS). Installs its wheels once into /tmp/site-RELEASE, the harness (with its
# vLLM plugins' entry points) into the same place once per commit, and exports what every server
# needs. Mooncake is not in the wheelhouse: where /tmp/extra holds its CUDA 13 wheel and Debian's
# libibverbs and libnl packages, they are installed once too.
release=${1:-${PD_ACCURACY_GPU_VLLM:-0.34.0}}
parts=${PD_ACCURACY_PARTS:-/tmp/parts}
site=/tmp/site-$release
if [ ! -f "$site/.unpacked" ]; then
  mkdir -p "$site" /tmp/wheels-$release
  first=$(ls "$parts"/part.* 2>/dev/null | head -1)
  [ -n "$first" ] || { echo "offline_env: no wheelhouse parts in $parts" >&2; return 3 2>/dev/null || exit 3; }
  if [ "$(head -c 5 "$first" | od -An -tx1 | tr -d ' ')" = "fd377a585a" ]; then
    cat "$parts"/part.* | xz -d -T0 | tar x -C "$site"          # an unpacked site, as tar.xz
  else
    cat "$parts"/part.* | tar x -C /tmp/wheels-$release &&      # the wheels as they are
      python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" \
        /tmp/wheels-$release/wheels/*.whl $(ls /tmp/wheels-$release/built/*.whl 2>/dev/null)
  fi && touch "$site/.unpacked"
fi
# A PYTHONPATH folder never reads its .pth files (nvidia-cutlass-dsl puts `cutlass` on sys.path
# with one; without it FLASHINFER engines die with "No module named 'cutlass'"): add what they add.
pth_paths=$(PYTHONPATH=$site python3 -c "
import site, sys
before = set(sys.path)
site.addsitedir('$site')
print(':'.join(p for p in sys.path if p not in before and p != '$site'))" 2>/dev/null)
export PYTHONPATH=$site${pth_paths:+:$pth_paths} CUDA_HOME=/usr/local/cuda PATH=$site/bin:$PATH HF_HUB_OFFLINE=1
stamp=$site/.harness-$(cat harness/*.py harness/*/*.py harness/*/*/*.py 2>/dev/null | sha256sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  if ls .whl/*.whl > /dev/null 2>&1; then   # the harness's own few, where the set lacks them
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl
  fi
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade \
    --target "$site" . && touch "$stamp"
fi
if ls /tmp/extra/*.whl > /dev/null 2>&1 && [ ! -f "$site/.mooncake" ]; then
  mkdir -p /tmp/ibv && for deb in /tmp/extra/*.deb; do dpkg -x "$deb" /tmp/ibv; done
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" /tmp/extra/*.whl &&
    touch "$site/.mooncake"
fi
if [ -d /tmp/ibv ]; then   # libibverbs for Mooncake's transfer engine
  export LD_LIBRARY_PATH=/tmp/ibv/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
