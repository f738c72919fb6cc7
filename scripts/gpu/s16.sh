#!/usr/bin/env bash
# Session 16's one H200 call (scripts/gpu/s16_plan.md): 20 cells in 12 baseline groups through
# scripts/gpu/run_profile.sh, then the summary table, all under $OUT (files <= 15 MiB each).
#   #36  real-shape random-weight models (harness/zoo/shapes.py), verdict on transfer + bytes + digest
#   #37  fp8 KV on FLASH_ATTN / FLASHINFER / TRITON_ATTN, a P != D dtype pair, an fp8 canary;
#        mixed runners P V1 -> D V2 and P V2 -> D V1, with and without ngram drafts on the decode
#   #35  NIXL push, MultiConnector(NIXL + offloading) and Mooncake, each with a drop-transfer canary
# Expects what run_profile.sh expects (/tmp/parts/part.*, .whl/*.whl). Run from the repo root:
#   bash scripts/gpu/s16.sh            (TAG, PAR, MAX_STARTING, LIMIT, BUDGET_S may be overridden)
set -uo pipefail
CELLS='(v2-FLASHINFER-p128d128-shape-qwen3-0.6b-tp1x1 or v2-FLASH_ATTN-p400d400-shape-granite
 or v1-FLASHMLA-p64d64-shape-deepseek or v1-FLASH_ATTN-p128d128-shape-gemma
 or v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kv_ or v2-FLASHINFER-p128d128-tiny-llama-gsm-tp1x1-kv_fp8
 or v2-TRITON_ATTN-p128d128-tiny-llama-gsm-tp1x1-kv_fp8
 or (FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1 and prunner)
 or v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kvc_) and not e5m2 and not spec_ngram-prunner_v1
 and not kvc_example'
# (kvc_example: a nightly cell since session 18, when the harness began to drive ExampleConnector)
CELLS=$(echo $CELLS)   # one line
# Mooncake (#35) is not in the wheelhouse: its CUDA 13 wheel and libibverbs travel in /tmp/extra
if ls /tmp/extra/*.whl > /dev/null 2>&1 && [ ! -f /tmp/site/.mooncake ]; then
  mkdir -p /tmp/ibv && for d in /tmp/extra/*.deb; do dpkg -x "$d" /tmp/ibv; done
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/extra/*.whl &&
    touch /tmp/site/.mooncake
fi
export LD_LIBRARY_PATH=/tmp/ibv/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PROFILE=nightly LAYOUT=shared NGPU=1 PAR=${PAR:-12} MAX_STARTING=${MAX_STARTING:-8}
export LIMIT=${LIMIT:-50} BUDGET_S=${BUDGET_S:-530} TAG=${TAG:-s16} OUT=${OUT:-/tmp/out}
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
