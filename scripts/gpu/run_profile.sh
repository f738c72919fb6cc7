#!/usr/bin/env bash
# Runs a matrix profile on an offline GPU machine and leaves the records in $OUT.
#
# Expects, in the repository root on that machine:
#   /tmp/parts/part.*  the wheelhouse parts (../shared/gpu/build-wheelhouse.sh), copied in first
#   .whl/*.whl         the harness's own pure-Python deps missing from the image (port-for, ...)
# Then:  PROFILE=pr LAYOUT=shared NGPU=1 PAR=12 LIMIT=30 scripts/gpu/run_profile.sh [-k EXPR]
#
# Every baseline group (cells sharing one baseline) is one `pd-accuracy run --only ...` process;
# PAR of them run at once, all tiny-model servers sharing the GPUs with explicit memory budgets.
# SPLIT=1 makes every cell its own process (its own baseline): more GPU time, less wall time for
# groups whose pairs would otherwise start one after another. GPUS picks the physical GPUs
# (default 0..NGPU-1), so two runs can use different GPUs of one machine. MAX_STARTING=N lets at
# most N servers of the machine be in start-up at once (PD_ACCURACY_MAX_STARTING; default: no cap).
# The whole run is bounded by BUDGET_S so the records always come back.
set -uo pipefail
PROFILE=${PROFILE:-pr}
LAYOUT=${LAYOUT:-shared}           # shared: all servers on the first GPU; split: prefill / decode GPUs
NGPU=${NGPU:-1}                    # GPUs the servers may use (CUDA_VISIBLE_DEVICES is set to 0..NGPU-1)
PAR=${PAR:-12}
LIMIT=${LIMIT:-30}
BUDGET_S=${BUDGET_S:-500}
TAG=${TAG:-$PROFILE-$LAYOUT-${NGPU}gpu}
OUT=${OUT:-/tmp/out}
started=$(date +%s)

site=/tmp/site
if [ ! -f $site/.unpacked ]; then
  mkdir -p $site && cat /tmp/parts/part.* | xz -d -T0 | tar x -C $site && touch $site/.unpacked
fi
export PYTHONPATH=$site CUDA_HOME=/usr/local/cuda PATH=$site/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1
export VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm   # vLLM's "auto" = mnnvl = cuMulticastCreate (see harness/serve/launch/server_spec.py)
export CUDA_VISIBLE_DEVICES=${GPUS:-$(seq -s, 0 $((NGPU - 1)))}
export PD_ACCURACY_MAX_STARTING=${MAX_STARTING:-0}
if [ ! -f $site/.harness ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target $site .whl/*.whl &&
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target $site . &&
  touch $site/.harness
fi
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader
res=$PWD/results/gpu/$TAG
mkdir -p "$res" "$res/console"
python3 -m harness.cli.main list --profile "$PROFILE" --platform cuda:2 --json "$@" > "$res/cells.json" || exit 2
python3 - "$res/cells.json" "${SPLIT:-0}" > "$res/groups.txt" <<'PY'
import json, sys
cells = json.load(open(sys.argv[1]))["cells"]
groups = {}
for c in cells:
    # a connector's pairs run apart from the default connector's: one group runs its pairs in turn
    key = c["id"] if sys.argv[2] == "1" else (c["baseline_key"], c.get("kv_connector", "nixl") != "nixl")
    groups.setdefault(key, []).append(c["id"])
for ids in groups.values():
    print(",".join(ids))
PY
echo "$(wc -l < "$res/groups.txt") baseline groups, $(python3 -c "import json;print(len(json.load(open('$res/cells.json'))['cells']))") cells, PAR=$PAR"
remaining=$((BUDGET_S - ($(date +%s) - started)))
# shellcheck disable=SC2016
timeout --signal=INT --kill-after=30 "$remaining" xargs -P "$PAR" -I{} bash -c '
  ids="$1"; name=$(echo "$ids" | md5sum | cut -c1-10)
  python3 -m harness.cli.main run --profile "'"$PROFILE"'" --only "$ids" --limit '"$LIMIT"' \
    --results-dir "'"$res"'/records" --gpu-layout '"$LAYOUT"' --platform cuda:2 \
    --startup-timeout 420 > "'"$res"'/console/$name.log" 2>&1
  echo "group $name exit $?: $ids"' _ {} < "$res/groups.txt"
echo "wall: $(( $(date +%s) - started )) s"
# where each group's start-up went (imports, engine init, weights, compile, KV cache, ready)
for run in "$res"/records/*/; do
  [ -d "$run/logs" ] && python3 -m harness.cli.main bench --from "$run" --json "$run/bench.json" > /dev/null 2>&1
done
python3 - "$res/records" <<'PY'
import json, pathlib, statistics, sys
totals = [s["total_s"] for p in pathlib.Path(sys.argv[1]).glob("*/bench.json")
          for s in json.loads(p.read_text())["servers"] if s.get("total_s")]
if totals:
    print(f"server start-up: {len(totals)} servers, median {statistics.median(totals):.0f} s, "
          f"range {min(totals):.0f}-{max(totals):.0f} s")
PY
mkdir -p "$OUT"
tar czf "$OUT/$TAG.tgz" -C "$PWD/results/gpu" "$TAG"
python3 - "$res/records" <<'PY'
import json, sys, pathlib
rows = []
for p in sorted(pathlib.Path(sys.argv[1]).rglob("*.json")):
    r = json.loads(p.read_text())
    if "verdict" not in r: continue
    m = r.get("metrics") or {}
    rows.append((r["cell"]["id"], r["verdict"]["outcome"], m.get("baseline_accuracy"), m.get("pd_accuracy"),
                 (m.get("transfer") or {}).get("prompt_tokens_external"), r["verdict"]["reason"][:150]))
for row in rows: print(*row, sep=" | ")
print(len(rows), "records")
PY
