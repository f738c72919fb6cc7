#!/usr/bin/env bash
# The KV digest's cost on one GPU: the real-shape cells whose blake2b digest cost more than their
# P/D evaluation (shape-qwen3-0.6b 117 %, shape-gemma-3-4b 119 % on the H200, 2026-12-04), run
# with the device hash (PD_ACCURACY_KV_DIGEST_HASH=device, the default). Per cell it reports
# the seconds both sides spent on the digest (on the engine's step, GPU time of the hash kernels
# and copies, resolving off the step) against the P/D evaluation's wall time, and the verdict
# (the qwen3 zeroed-block canary must still be CAUGHT on kv-digest).
#
#   bash scripts/gpu/digest_cost.sh                 # from the repository root, <= 4 min wall
#
# Expects what scripts/gpu/offline_env.sh expects (PD_ACCURACY_GPU_VLLM, default 0.34.0) and the
# harness in this checkout; writes under $OUT (default /tmp/out): digest-cost.md, digest-cost.json, the records
# (records.tgz, digest lines left out) and one console log per group. COMPARE=1 also runs the
# qwen3 cell with blake2b at the same time (the old path, for a same-machine comparison).
set -uo pipefail
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-50}
BUDGET_S=${BUDGET_S:-225}          # the records must be back within 4 minutes
started=$(date +%s)
root=$PWD
source scripts/gpu/offline_env.sh "${PD_ACCURACY_GPU_VLLM:-0.34.0}" || exit 3
export PYTHONPATH=$root:$PYTHONPATH   # this checkout's harness first
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm CUDA_VISIBLE_DEVICES=${GPUS:-0}
python3 -c "import harness, sys; sys.exit(not harness.__file__.startswith('$root'))" || {
  echo "digest_cost.sh: harness is not imported from $root" >&2; exit 2; }
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader
res=$(mktemp -d /tmp/digest-cost.XXXX)
mkdir -p "$OUT"
QWEN=v1-FLASH_ATTN-p128d128-shape-qwen3-0.6b-tp1x1
GEMMA=v1-FLASH_ATTN-p128d128-shape-gemma-3-4b-tp1x1
groups=("device $QWEN,$QWEN-fault-corrupt-block" "device $GEMMA")
[ "${COMPARE:-0}" = 1 ] && groups+=("blake2b $QWEN")
pids=()
for group in "${groups[@]}"; do
  read -r hash ids <<< "$group"
  name=$hash-$(echo "$ids" | md5sum | cut -c1-6)
  PD_ACCURACY_KV_DIGEST_HASH=$hash timeout --signal=INT --kill-after=20 \
    $((BUDGET_S - ($(date +%s) - started))) \
    python3 -m harness.cli.main run --profile nightly --only "$ids" --limit "$LIMIT" \
      --results-dir "$res/$hash" --gpu-layout shared --platform cuda:2 --startup-timeout 180 \
      > "$OUT/console-$name.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
echo "wall: $(( $(date +%s) - started )) s"
python3 - "$res" "$OUT" <<'PY'
import json, pathlib, sys
res, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
rows = []
for path in sorted(res.glob("*/*/*.json")):
    rec = json.loads(path.read_text())
    if "verdict" not in rec:
        continue
    digest = ((rec.get("metrics") or {}).get("transfer") or {}).get("kv_digest") or {}
    spent = sum((digest.get("cost_s") or {}).values())
    pd = (rec.get("timings") or {}).get("pd_eval_s") or 0.0
    rows.append({"cell": rec["cell"]["id"], "hash": path.parts[-3],
                 "outcome": rec["verdict"]["outcome"],
                 "hash_functions": digest.get("hash_functions"),
                 "compared": digest.get("compared"), "identical": digest.get("identical"),
                 "differing": digest.get("differing"), "digest_s": round(spent, 3),
                 "parts_s": digest.get("cost_parts_s"), "pd_eval_s": round(pd, 2),
                 "share": round(spent / pd, 4) if pd else None,
                 "reason": rec["verdict"]["reason"][:200]})
(out / "digest-cost.json").write_text(json.dumps(rows, indent=1))
lines = ["| cell | hash | outcome | compared | digest s (step / GPU / resolve) | P/D eval s | share |",
         "|---|---|---|---|---|---|---|"]
for r in rows:
    p = r["parts_s"] or {}
    lines.append(f"| `{r['cell']}` | {r['hash']} | {r['outcome']} | {r['compared']} | "
                 f"{r['digest_s']:.2f} ({p.get('step_s', 0):.2f} / {p.get('device_s', 0):.2f} / "
                 f"{p.get('resolve_s', 0):.2f}) | {r['pd_eval_s']:.1f} | "
                 + ("-" if r["share"] is None else f"{100 * r['share']:.1f} %") + " |")
text = "\n".join(lines) + "\n\nreasons:\n" + "\n".join(f"- {r['cell']} ({r['hash']}): {r['reason']}"
                                                         for r in rows)
(out / "digest-cost.md").write_text(text + "\n")
print(text)
print(f"{len(rows)} records")
PY
tar czf "$OUT/records.tgz" --exclude='*.kv-digest.jsonl' -C "$res" . 2>/dev/null
ls -la "$OUT"
