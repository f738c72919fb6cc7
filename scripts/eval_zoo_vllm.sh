#!/usr/bin/env bash
# Measure a zoo model's accuracy through a real vLLM CPU server (greedy, lm-eval gsm_synth) and
# write it into the model card:
#
#   scripts/eval_zoo_vllm.sh tiny-granite-hybrid-gsm [LIMIT]
#
# One server on core 0 (its KV cache sized), lm-eval local-completions against it, then
# `pd-accuracy zoo card NAME --vllm-results ...`. The server runs in its own process group and is
# stopped by PGID on every exit path.
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=${1:?usage: scripts/eval_zoo_vllm.sh ZOO_NAME [LIMIT]}
LIMIT=${2:-200}
PY=${PYTHON:-.venv/bin/python}
WORK=$(mktemp -d /tmp/pd-zoo-eval.XXXXXX)
CKPT=$("$PY" -m harness.cli zoo path "$NAME")
PORT=$("$PY" -c 'import port_for; print(port_for.select_random())')
HYBRID=$("$PY" -c "from harness.zoo.registry import is_hybrid; print(int(is_hybrid('$NAME')))")

EXTRA=()
ENVS=(VLLM_CPU_OMP_THREADS_BIND=0 VLLM_CPU_KVCACHE_SPACE=1)
if [ "$HYBRID" = 1 ]; then
  BLOCK=$("$PY" -c "from harness.zoo.registry import required_block_size as r; print(r('$NAME', 'cpu'))")
  EXTRA+=(--block-size "$BLOCK" --no-enable-prefix-caching)
  ENVS+=(VLLM_SSM_CONV_STATE_LAYOUT=DS)
fi
SERVER=(python -m vllm.entrypoints.openai.api_server --model "$CKPT" --served-model-name "$NAME"
        --dtype bfloat16 --max-model-len 2048 --kv-cache-memory-bytes 268435456
        --port "$PORT" "${EXTRA[@]}")

pgid=""
cleanup() { [ -n "$pgid" ] && kill -TERM -- "-$pgid" 2>/dev/null; sleep 2;
            [ -n "$pgid" ] && kill -KILL -- "-$pgid" 2>/dev/null; true; }
trap cleanup EXIT INT TERM

env "${ENVS[@]}" setsid "${PY%/python}/python" "${SERVER[@]:1}" >"$WORK/server.log" 2>&1 &
pgid=$!
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 "$pgid" 2>/dev/null || { tail -n 30 "$WORK/server.log"; exit 3; }
  sleep 1
done

DATA=$("$PY" -c 'from harness.zoo.task import write_splits; print(write_splits())')
"$PY" -c "from pathlib import Path; from harness.evaluate import materialize_task as m; m('gsm_synth', '$DATA', Path('$WORK/tasks'))"
LM_EVAL=(lm_eval --model local-completions
         --model_args "model=$NAME,base_url=http://127.0.0.1:$PORT/v1/completions,tokenizer_backend=None,num_concurrent=4,max_retries=1"
         --tasks gsm_synth --include_path "$WORK/tasks" --limit "$LIMIT" --output_path "$WORK/out")
"${PY%/python}/${LM_EVAL[0]}" "${LM_EVAL[@]:1}" 2>&1 | grep -E '^\|' || true
RESULTS=$(find "$WORK/out" -name 'results_*.json' | head -n 1)
VERSION=$("$PY" -c 'import importlib.metadata as m; print("vllm-cpu " + m.version("vllm-cpu"))')
COMMAND="${ENVS[*]} ${SERVER[*]/$CKPT/CKPT}; ${LM_EVAL[*]/$WORK\/tasks/harness\/tasks}"
"$PY" -m harness.cli zoo card "$NAME" --vllm-results "$RESULTS" --vllm-version "$VERSION" \
  --command "$COMMAND"
