#!/usr/bin/env bash
# Session 18's H200 call (written for session 17, which had no device time left to run it): the
# connectors session 16 had no time for (#35: MultiConnector of NIXL + offloading, Mooncake, each
# with its drop-transfer canary), the GPU weather cells (#34: load and preemption, runner V1 and
# V2), P V2 -> D V1 with ngram drafts on the decode (#37) and the gemma-3-4b shape whose byte
# expectation session 16 got wrong (re-judged offline since).
# Same machinery as s16.sh: run_profile.sh, then the summary table, all under $OUT.
#   bash scripts/gpu/s18.sh            (TAG, PAR, MAX_STARTING, LIMIT, BUDGET_S may be overridden)
set -uo pipefail
CELLS=${CELLS:-'(FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kvc_multi_nixl_offload
 or FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kvc_mooncake
 or (FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1 and (w_load or w_preemption))
 or v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-spec_ngram-prunner_v2
 or v1-FLASH_ATTN-p128d128-shape-gemma-3-4b-tp1x1)'}
CELLS=$(echo $CELLS)   # one line
# Mooncake (#35) is not in the wheelhouse: its CUDA 13 wheel and libibverbs travel in /tmp/extra
if ls /tmp/extra/*.whl > /dev/null 2>&1 && [ ! -f /tmp/site/.mooncake ]; then
  mkdir -p /tmp/ibv && for d in /tmp/extra/*.deb; do dpkg -x "$d" /tmp/ibv; done
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/extra/*.whl &&
    touch /tmp/site/.mooncake
fi
export LD_LIBRARY_PATH=/tmp/ibv/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PROFILE=nightly LAYOUT=shared NGPU=1 PAR=${PAR:-12} MAX_STARTING=${MAX_STARTING:-8}
export LIMIT=${LIMIT:-50} BUDGET_S=${BUDGET_S:-530} TAG=${TAG:-s18} OUT=${OUT:-/tmp/out}
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
