#!/usr/bin/env bash
# The soak and the GPU expiry cells on one GPU, in at most 4 minutes of wall time:
#   - tiny-llama-gsm x FLASH_ATTN x V1 and V2 under `expiry` (declared upstream failures in the
#     matrix: XFAIL expected, XPASS the day a late read fails loudly or answers right);
#   - a GPU soak of SOAK_REQUESTS requests (default 2,000; the nightly's 20,000 do not fit four
#     minutes with start-up) and the late-fault canary (zeroed blocks from the 401st request on,
#     1,000 requests: must be CAUGHT).
# Each cell is its own `pd-accuracy run` (its own baseline) so that the four run at once, eager
# (no torch.compile, no CUDA graphs: start-up is what the budget cannot spare); the matrix's
# expected failures match them all the same. Results under $OUT (at most 8 files, < 15 MiB each):
# soak-expiry.tgz (records, pruned logs), soak-expiry-summary.md, console.log.
#
# Expects what scripts/gpu/offline_env.sh expects (the wheelhouse parts of the release in
# PD_ACCURACY_GPU_VLLM, default 0.34.0, in /tmp/parts), the harness at $PWD.
#   bash scripts/gpu/soak_and_expiry.sh        (SOAK_REQUESTS, BUDGET_S, OUT may be overridden)
set -uo pipefail
TAG=soak-expiry
OUT=${OUT:-/tmp/out}
BUDGET_S=${BUDGET_S:-215}          # the runs; the rest of the 4 minutes packs the results
SOAK_REQUESTS=${SOAK_REQUESTS:-2000}
started=$(date +%s)

# vLLM and the harness's entry points (RELEASE: 0.34.0 by default); this checkout comes first
# on the path, so an older harness in the site is never the one that runs
source scripts/gpu/offline_env.sh "${PD_ACCURACY_GPU_VLLM:-0.34.0}" || exit 3
export PYTHONPATH=$PWD:$PYTHONPATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
export VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm
export CUDA_VISIBLE_DEVICES=0 PD_ACCURACY_MAX_STARTING=8
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader

res=$PWD/results/gpu/$TAG
mkdir -p "$res/console" "$OUT"
# a profile of its own (not the nightly's cells: those are compiled and soak 20,000 requests)
cat > "$res/matrix.yaml" <<EOF
extends: default
profiles:
  soak-expiry:
    description: GPU expiry cells and a reduced soak, one H200 in four minutes
    defaults: {device: cuda, kv_buffer_device: cuda, backend: FLASH_ATTN, block_size: 128,
               model: tiny-llama-gsm, compile: eager}
    grids:
      - runner: [v1, v2]
        weather: expiry
      - runner: v1
        weather: soak
        weather_params: {requests: $SOAK_REQUESTS}
      - runner: v1
        weather: soak
        weather_params: {requests: 1000}
        fault: corrupt-block
        extra_env: {PD_ACCURACY_FAULT_AFTER: "400"}
EOF
python3 -m harness.cli.main list --matrix "$res/matrix.yaml" --profile soak-expiry \
  --platform cuda:2 --json > "$res/cells.json" || exit 2
python3 -c "import json,sys; [print(c['id']) for c in json.load(open(sys.argv[1]))['cells']]" \
  "$res/cells.json" > "$res/cells.txt"
echo "$(wc -l < "$res/cells.txt") cells: $(tr '\n' ' ' < "$res/cells.txt")"
remaining=$((BUDGET_S - ($(date +%s) - started)))
# shellcheck disable=SC2016
timeout --signal=INT --kill-after=20 "$remaining" xargs -P 4 -I{} bash -c '
  python3 -m harness.cli.main run --matrix "$1/matrix.yaml" --profile soak-expiry --only "$2" \
    --limit 50 --no-noise-floor --results-dir "$1/records" --gpu-layout shared \
    --platform cuda:2 --startup-timeout 180 > "$1/console/$2.log" 2>&1
  echo "cell $2 exit $?"' _ "$res" {} < "$res/cells.txt" | tee "$OUT/console.log"
echo "wall: $(( $(date +%s) - started )) s" | tee -a "$OUT/console.log"

# the verdicts and each soak's line, then the records (KV digest files and samples dropped)
python3 - "$res/records" > "$OUT/$TAG-summary.md" <<'PY'
import json, pathlib, sys
print("| cell | outcome | reason |\n|---|---|---|")
for p in sorted(pathlib.Path(sys.argv[1]).glob("*/*.json")):
    r = json.loads(p.read_text())
    if "verdict" not in r:
        continue
    series = ((r.get("metrics") or {}).get("weather") or {}).get("series") or {}
    line = f"<br>series ({series.get('wall_s', 0):.0f} s): {series['line']}" if series else ""
    print(f"| `{r['cell']['id']}` | {r['verdict']['outcome']} | {r['verdict']['reason'][:400]}{line} |")
PY
cat "$OUT/$TAG-summary.md"
find "$res/records" -name "*.kv-digest.jsonl" -delete
tar czf "$OUT/$TAG.tgz" -C "$PWD/results/gpu" "$TAG"
if [ "$(stat -c %s "$OUT/$TAG.tgz")" -gt $((15 << 20)) ]; then   # cat $TAG.tgz.part.* | tar xz
  split -b 15M -d -a 2 "$OUT/$TAG.tgz" "$OUT/$TAG.tgz.part." && rm "$OUT/$TAG.tgz"
fi
ls -la "$OUT"
