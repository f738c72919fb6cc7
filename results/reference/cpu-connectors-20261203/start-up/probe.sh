#!/bin/bash
# usage: probe.sh NAME 'KV_TRANSFER_CONFIG_JSON' [extra args...]
name=$1; cfg=$2; shift 2
log=/work/runs/conn/probe/$name.log
port=$((30000 + RANDOM % 5000))
cd /work/wt-conn
export PYTHONPATH=/work/wt-conn${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}
setsid env VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0 VLLM_NO_USAGE_STATS=1 VLLM_PORT=$((port+100)) \
  /work/main/.venv/bin/python -m vllm.entrypoints.openai.api_server --model /work/wt-conn/harness/zoo/checkpoints/tiny-llama-gsm \
  --served-model-name m --host 127.0.0.1 --port $port --dtype float32 --max-model-len 2048 --block-size 128 --seed 0 \
  --attention-backend CPU_ATTN --kv-cache-memory-bytes 536870912 --enforce-eager --kv-transfer-config "$cfg" "$@" > $log 2>&1 &
pid=$!
up=0
for i in $(seq 1 300); do
  if ! kill -0 $pid 2>/dev/null; then echo "EXITED early" >> $log; break; fi
  if curl -sf http://127.0.0.1:$port/health >/dev/null; then up=1; break; fi
  sleep 1
done
if [ $up = 1 ]; then
  for j in 1 2; do
  curl -s http://127.0.0.1:$port/v1/completions -H 'content-type: application/json' \
    -d '{"model":"m","prompt":"Question: 12 + 7 = ? Answer: the sum of twelve and seven, written out in full detail, is","max_tokens":8,"temperature":0}' >> $log 2>&1; echo >> $log
  done
  curl -s http://127.0.0.1:$port/metrics | grep -i 'offload\|connector\|kv_transfer\|external\|prefix_cache' | grep -v '^#' >> $log
  echo "PROBE UP" >> $log
fi
kill -TERM -- -$pid 2>/dev/null; sleep 5; kill -KILL -- -$pid 2>/dev/null
wait $pid 2>/dev/null
echo "PROBE DONE up=$up" >> $log
