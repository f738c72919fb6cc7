#!/usr/bin/env bash
# One device call: `pd-accuracy bench` of a profile (it runs the cells exactly as `run` does,
# groups packed on the GPU, and writes where the time went), then the verdict table
# (`pd-accuracy annotate`) and the records pruned for committing, into $OUT:
#   bash scripts/gpu/profile_call.sh NAME BUDGET_S [run arguments...]
# e.g.  bash scripts/gpu/profile_call.sh pr 520 --profile pr
#       bash scripts/gpu/profile_call.sh shapes 530 --profile nightly -k "..." --max-starting 8
# NAME names the files; BUDGET_S bounds the run (SIGINT, then the records written so far return).
set -uo pipefail
name=$1 budget=$2; shift 2
source "$(dirname "$0")/offline_env.sh" "${PD_ACCURACY_GPU_VLLM:-0.34.0}" || exit 3
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
res=/tmp/res-$name
started=$(date +%s)
timeout --signal=INT --kill-after=40 "$budget" pd-accuracy bench --results-dir "$res" \
  --out "$OUT/$name-bench.json" "$@" 2>&1 | tee "$OUT/$name-console.log" | grep -v "^│\|^┃\|^┡\|^└\|^┏"
echo "wall: $(( $(date +%s) - started )) s"
run=$(ls -d "$res"/*/ | head -1)
[ -f "$OUT/$name-bench.json" ] || pd-accuracy bench --from "$run" --out "$OUT/$name-bench.json" > /dev/null 2>&1
pd-accuracy annotate --results-dir "$run" --out "$OUT/$name-summary.md" --agent never
python3 scripts/gpu/keep.py "$run" "/tmp/keep-$name/$(basename "$run")" | cut -c1-120
cp "$OUT/$name-bench.json" "/tmp/keep-$name/$(basename "$run")/bench.json" 2>/dev/null
tar czf "$OUT/$name.tgz" -C "/tmp/keep-$name" .
ls -la "$OUT"
