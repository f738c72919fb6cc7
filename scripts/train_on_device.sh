#!/usr/bin/env bash
# Train the three gsm_synth zoo models on one GPU, in parallel, plus a second tiny-llama-gsm with
# the same seed (to show a rebuild reproduces), each under a hard time limit. Each run ends with
# the PyTorch probe (clean accuracy and accuracy with one 128-token KV block zeroed).
#
#   OUT=/some/dir bash scripts/train_on_device.sh
#
# Writes $OUT/<run>.tar.gz (the checkpoint directory) and $OUT/<run>.log for each of the 4 runs:
# 8 files, as the device tool brings back. Knobs (env): ZOO_TIME_LIMIT (training seconds per
# model, default 200), ZOO_HARD_LIMIT (kill after, default 330), ZOO_PROBE_N (default 150),
# ZOO_DEVICE (default cuda) and ZOO_EXTRA (more train.py flags, e.g. "--steps 3 --batch-size 2"
# for a dry run on CPU).
set -u -o pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-/tmp/zoo-device-out}
WORK=${ZOO_WORK:-/tmp/zoo-device-work}
TIME_LIMIT=${ZOO_TIME_LIMIT:-200}
HARD_LIMIT=${ZOO_HARD_LIMIT:-330}
PROBE_N=${ZOO_PROBE_N:-150}
DEVICE=${ZOO_DEVICE:-cuda}
EXTRA=${ZOO_EXTRA:-}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK"

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
export CUBLAS_WORKSPACE_CONFIG=:4096:8 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TRANSFORMERS_VERBOSITY=error

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PYTHON" -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "cuda", torch.cuda.is_available())'

# run-tag model data-loader-workers [more train.py flags]; ZOO_RUNS (same format, one run per
# line) replaces the default set, e.g. to try recipe variants side by side.
RUNS=(
  "tiny-llama-gsm tiny-llama-gsm 3"
  "tiny-llama-gsm-rerun tiny-llama-gsm 3"
  "tiny-granite-hybrid-gsm tiny-granite-hybrid-gsm 2"
  "tiny-qwen3next-hybrid-gsm tiny-qwen3next-hybrid-gsm 2"
)
if [ -n "${ZOO_RUNS:-}" ]; then
  mapfile -t RUNS < <(printf '%s\n' "$ZOO_RUNS" | grep -v '^[[:space:]]*$')
fi

started=$(date +%s)
pids=()
for run in "${RUNS[@]}"; do
  read -r tag model workers flags <<<"$run"
  # shellcheck disable=SC2086  # flags and EXTRA are word lists
  timeout -k 10 "$HARD_LIMIT" "$PYTHON" -m harness.zoo.train --model "$model" \
      --out "$WORK/$tag" --device "$DEVICE" --time-limit "$TIME_LIMIT" --probe-n "$PROBE_N" \
      --workers "$workers" $EXTRA $flags >"$OUT/$tag.log" 2>&1 &
  pids+=("$!")
done
( sleep 60; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader ) &
monitor=$!

status=0
for i in "${!pids[@]}"; do
  read -r tag _ <<<"${RUNS[$i]}"
  if wait "${pids[$i]}"; then rc=0; else rc=$?; status=1; fi
  echo "== $tag rc=$rc after $(( $(date +%s) - started ))s"
  grep -E '"event": "(start|early_decay|probe|done)"' "$OUT/$tag.log" || tail -n 20 "$OUT/$tag.log"
done
kill "$monitor" 2>/dev/null

for run in "${RUNS[@]}"; do
  read -r tag _ <<<"$run"
  [ -d "$WORK/$tag" ] && tar -C "$WORK" -czf "$OUT/$tag.tar.gz" "$tag"
done

# Rebuild reproducibility: the two same-seed dense runs, weight by weight.
[ -d "$WORK/tiny-llama-gsm-rerun" ] && "$PYTHON" - "$WORK/tiny-llama-gsm" "$WORK/tiny-llama-gsm-rerun" <<'EOF' || true
import sys
from safetensors.torch import load_file
a, b = (load_file(f"{d}/model.safetensors") for d in sys.argv[1:3])
diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
same = sum(bool((a[k] == b[k]).all()) for k in a)
print(f"rerun vs first: {same}/{len(a)} tensors bit-identical, max abs diff {diff:.3g}")
EOF
ls -la "$OUT"
exit $status
