#!/usr/bin/env bash
# Source on an offline GPU machine (no package index) to make vLLM and the harness importable:
#   source scripts/gpu/offline_env.sh
# Expects the wheelhouse parts (../shared/gpu/build-wheelhouse.sh) in /tmp/parts and the
# harness's few pure-Python dependencies missing from the machine's image in .whl/ (port-for,
# buildkite-sdk, jsoncomparison; covertable for the nightly profile's pairwise grids). Unpacks
# once, installs the harness (with its vLLM plugins' entry points) into the same site-packages
# once per commit, and exports what every server needs. Mooncake is not in the wheelhouse:
# where /tmp/extra holds its CUDA 13 wheel and Debian's libibverbs and libnl packages, they are
# installed once too.
site=/tmp/site
if [ ! -f $site/.unpacked ]; then
  mkdir -p $site && cat /tmp/parts/part.* | xz -d -T0 | tar x -C $site && touch $site/.unpacked
fi
export PYTHONPATH=$site CUDA_HOME=/usr/local/cuda PATH=$site/bin:$PATH HF_HUB_OFFLINE=1
stamp=$site/.harness-$(cat harness/*.py harness/*/*.py harness/*/*/*.py 2>/dev/null | sha256sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target $site .whl/*.whl &&
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade \
    --target $site . && touch "$stamp"
fi
if ls /tmp/extra/*.whl > /dev/null 2>&1 && [ ! -f $site/.mooncake ]; then
  mkdir -p /tmp/ibv && for deb in /tmp/extra/*.deb; do dpkg -x "$deb" /tmp/ibv; done
  python3 -m pip install -q --no-index --no-deps --no-compile --target $site /tmp/extra/*.whl &&
    touch $site/.mooncake
fi
if [ -d /tmp/ibv ]; then   # libibverbs for Mooncake's transfer engine
  export LD_LIBRARY_PATH=/tmp/ibv/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
