#!/usr/bin/env bash
# Source on an offline GPU machine (no package index) to make vLLM and the harness importable:
#   source scripts/gpu/offline_env.sh
# Expects the wheelhouse parts (../shared/gpu/build-wheelhouse.sh) in /tmp/parts and the
# harness's few pure-Python dependencies missing from the machine's image in .whl/ (port-for,
# buildkite-sdk, jsoncomparison). Unpacks once, installs the harness (with its vLLM plugins'
# entry points) into the same site-packages once per commit, and exports what every server needs.
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
