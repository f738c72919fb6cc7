#!/usr/bin/env bash
# One H200 call: the nightly cells of `-k "$1"` through run_profile.sh (the shared layout on one
# GPU), then the summary table, all under $OUT (files <= 15 MiB each). A call's script
# (shapes_fp8_connectors.sh, connectors_weather.sh) names its cells and calls this:
#   TAG=connectors-weather bash scripts/gpu/nightly_cells.sh "$CELLS"
# Expects what run_profile.sh expects (/tmp/parts/part.*, .whl/*.whl), and Mooncake's extras in
# /tmp/extra where a cell needs them. TAG, PAR, MAX_STARTING, LIMIT, BUDGET_S may be overridden.
set -uo pipefail
CELLS=$(echo $1)   # one line
# Mooncake is not in the wheelhouse: its CUDA 13 wheel and libibverbs travel in /tmp/extra
if ls /tmp/extra/*.whl > /dev/null 2>&1 && [ ! -f /tmp/site/.mooncake ]; then
  mkdir -p /tmp/ibv && for d in /tmp/extra/*.deb; do dpkg -x "$d" /tmp/ibv; done
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/extra/*.whl &&
    touch /tmp/site/.mooncake
fi
export LD_LIBRARY_PATH=/tmp/ibv/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PROFILE=nightly LAYOUT=shared NGPU=1 PAR=${PAR:-12} MAX_STARTING=${MAX_STARTING:-8}
export LIMIT=${LIMIT:-50} BUDGET_S=${BUDGET_S:-530} TAG=${TAG:?TAG names the call} OUT=${OUT:-/tmp/out}
bash scripts/gpu/run_profile.sh -k "$CELLS"
rc=$?
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site
python3 scripts/gpu/summarize.py "results/gpu/$TAG:1" > "$OUT/$TAG-summary.md" 2>&1
tgz="$OUT/$TAG.tgz"
if [ -f "$tgz" ] && [ "$(stat -c %s "$tgz")" -gt $((15 << 20)) ]; then
  split -b 15M -d -a 2 "$tgz" "$tgz.part." && rm "$tgz"   # cat $TAG.tgz.part.* | tar xz
fi
ls -la "$OUT"
exit $rc
