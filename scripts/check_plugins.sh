#!/usr/bin/env bash
# Manual real-server check of the harness's vLLM plugins (harness/serve/plugins/).
#
#   scripts/check_plugins.sh [idle|faults|all]      (default: all)
#
# idle:   a P/D pair of the tiny random Llama per IDLE_SETTINGS entry: the nixl_idle plugin on
#         (PD_ACCURACY_NIXL_PTHR_DELAY_US unset -> 1000 us), off (=0) or a given delay in us:
#         latency of N_LATENCY P/D requests (median, quartiles, per hop; RAW_LATENCY=1 prints
#         every sample), then idle CPU% of each server's process tree over IDLE_SECONDS and its
#         busiest threads.
# faults: one prefill server; the decode server restarted per run of FAULT_RUNS
#         (name:fault:block[:value]; default: clean (twice through the same pair), corrupt-block
#         first, corrupt-block last, swap-blocks first): greedy outputs (max_tokens 32) of 8
#         prompts of 330 tokens compared with the first clean run, the decode's transfer
#         counters, and the "pd-accuracy fault:" lines counted in the decode log.
#
# Heavy (two ~2.3 GB vLLM servers): runs under `flock /tmp/pd-accuracy-heavy.lock`, and every
# server is stopped by its process group on every exit path.
# Everything runs from main(), called on the last line, so bash has parsed the whole file
# before anything starts (editing the file during a run cannot derail it).
set -euo pipefail

MODE="${1:-all}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-$ROOT/.venv/bin/python}"
MODEL="${MODEL:-$HOME/.cache/pd-accuracy/models/tiny-llama-random}"
IDLE_SECONDS="${IDLE_SECONDS:-10}"
N_LATENCY="${N_LATENCY:-20}"
IDLE_SETTINGS="${IDLE_SETTINGS:-on off}"   # idle check runs, in order: on | off | <delay in us>
FAULT_RUNS="${FAULT_RUNS:-clean:: corrupt-first:corrupt-block:first corrupt-last:corrupt-block:last swap-first:swap-blocks:first}"
LOCK=/tmp/pd-accuracy-heavy.lock
WORK=""
declare -A PGIDS=()   # server name -> process group id

stop_server() {  # name
  local name="$1" pgid="${PGIDS[$1]:-}"
  [[ -n "$pgid" ]] || return 0
  kill -TERM -- "-$pgid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 -- "-$pgid" 2>/dev/null || break
    sleep 0.2
  done
  kill -KILL -- "-$pgid" 2>/dev/null || true
  unset "PGIDS[$name]"
}

stop_all() {
  local name
  for name in "${!PGIDS[@]}"; do stop_server "$name"; done
}
free_port() { "$PY" -c 'import port_for; print(port_for.select_random())'; }

start_server() {  # name kv_role cores port side_port [ENV=VALUE ...]
  local name="$1" kv_role="$2" cores="$3" port="$4" side_port="$5"
  shift 5
  local ktc="{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"$kv_role\",\"kv_buffer_device\":\"cpu\"}"
  setsid env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 \
      VLLM_CPU_OMP_THREADS_BIND="$cores" VLLM_CPU_KVCACHE_SPACE=1 \
      VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT="$side_port" "$@" \
    "$PY" -m vllm.entrypoints.openai.api_server \
      --model "$MODEL" --served-model-name tiny --host 127.0.0.1 --port "$port" \
      --dtype bfloat16 --max-model-len 4096 --block-size 128 --seed 0 \
      --attention-backend CPU_ATTN --kv-cache-memory-bytes 268435456 \
      --kv-transfer-config "$ktc" \
    >"$WORK/$name.log" 2>&1 &
  PGIDS[$name]=$!   # setsid made it a group leader: its pid is the group id
  sleep 0.5
  [[ "$(ps -o pgid= -p "${PGIDS[$name]}" | tr -d ' ')" == "${PGIDS[$name]}" ]] \
    || { echo "$name: pid ${PGIDS[$name]} is not its group leader" >&2; exit 3; }
  echo "started $name (pgid ${PGIDS[$name]}, port $port) log $WORK/$name.log"
}

write_driver() {
  cat >"$WORK/drive.py" <<'PYEOF'
"""Requests, CPU sampling and output comparison for check_plugins.sh."""
import json, os, random, statistics, sys, time, uuid

import psutil, requests

def wait_healthy(*urls, timeout=300.0):
    deadline = time.time() + timeout
    for url in urls:
        while True:
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline:
                sys.exit(f"not healthy after {timeout:.0f}s: {url}")
            time.sleep(1)

def prompts(n=8, length=330, seed=1234):
    rng = random.Random(seed)
    return [[rng.randrange(4, 500) for _ in range(length)] for _ in range(n)]

def pd_request(prefill, decode, prompt, max_tokens, hop_ms=None):
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    headers = {"X-Request-Id": uuid.uuid4().hex}
    first = dict(body, max_tokens=1, kv_transfer_params={
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None})
    start = time.perf_counter()
    r = requests.post(prefill + "/v1/completions", json=first, headers=headers, timeout=120)
    r.raise_for_status()
    middle = time.perf_counter()
    second = dict(body, kv_transfer_params=r.json()["kv_transfer_params"])
    r = requests.post(decode + "/v1/completions", json=second, headers=headers, timeout=120)
    r.raise_for_status()
    if hop_ms is not None:
        hop_ms.append((1000.0 * (middle - start), 1000.0 * (time.perf_counter() - middle)))
    return r.json()["choices"][0]["text"]

def tree_cpu_seconds(pid):
    procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total

def metric(url, name, **labels):
    """Sum of the samples of one metric whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families
    total = 0.0
    text = requests.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total

cmd, *args = sys.argv[1:]
if cmd == "wait":
    wait_healthy(*args)
elif cmd == "idle":  # seconds label=pid ...
    seconds, pairs = float(args[0]), [a.split("=") for a in args[1:]]
    before = {label: tree_cpu_seconds(int(pid)) for label, pid in pairs}
    time.sleep(seconds)
    for label, pid in pairs:
        used = tree_cpu_seconds(int(pid)) - before[label]
        print(f"idle_cpu_percent {label} {100.0 * used / seconds:.1f} "
              f"(loadavg1 {os.getloadavg()[0]:.1f})")
elif cmd == "threads":  # seconds label=pid ...: the busiest threads of each server's tree
    seconds, pairs = float(args[0]), [a.split("=") for a in args[1:]]
    procs = {label: [psutil.Process(int(pid))] + psutil.Process(int(pid)).children(recursive=True)
             for label, pid in pairs}
    def thread_times():
        times = {}
        for label, plist in procs.items():
            for proc in plist:
                try:
                    for t in proc.threads():
                        times[(label, proc.pid, t.id)] = t.user_time + t.system_time
                except psutil.NoSuchProcess:
                    pass
        return times
    before = thread_times()
    time.sleep(seconds)
    after = thread_times()
    busiest = sorted(((after[k] - before.get(k, after[k]), k) for k in after), reverse=True)[:4]
    for used, (label, pid, tid) in busiest:
        try:
            comm = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            cores = ",".join(map(str, sorted(os.sched_getaffinity(tid))))
        except OSError:
            comm, cores = "?", "?"
        print(f"busiest_thread {label} {comm} tid {tid} cores {cores} "
              f"cpu {100.0 * used / seconds:.1f}%")
elif cmd == "latency":  # prefill decode n
    prefill, decode, n = args[0], args[1], int(args[2])
    # A fresh prompt per request: a repeated one would hit both servers' prefix caches.
    warm_up, *timed = prompts(n + 1, seed=99)
    pd_request(prefill, decode, warm_up, 16)  # NIXL handshake
    hops = []
    load_before = os.getloadavg()[0]
    for prompt in timed:
        pd_request(prefill, decode, prompt, 16, hops)
    totals = [p + d for p, d in hops]
    q = statistics.quantiles(totals, n=4)
    print(f"pd_latency_ms median {statistics.median(totals):.1f} p25 {q[0]:.1f} p75 {q[2]:.1f} "
          f"min {min(totals):.1f} max {max(totals):.1f} n {n} | prefill hop median "
          f"{statistics.median(p for p, _ in hops):.1f} decode hop median "
          f"{statistics.median(d for _, d in hops):.1f} | loadavg1 {load_before:.1f}->"
          f"{os.getloadavg()[0]:.1f}")
    if os.environ.get("RAW_LATENCY"):
        print("raw_hops_ms", " ".join(f"{p:.0f}+{d:.0f}" for p, d in hops))
elif cmd == "outputs":  # prefill decode out.json
    prefill, decode, out = args
    texts = [pd_request(prefill, decode, p, 32) for p in prompts()]
    json.dump(texts, open(out, "w"))
    external = metric(decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    failed = metric(decode, "vllm:nixl_num_failed_transfers_total")
    print(f"decode external_kv_tokens_total {external:.0f} nixl_failed_total {failed:.0f}")
elif cmd == "compare":  # reference.json other.json label
    ref, other = json.load(open(args[0])), json.load(open(args[1]))
    differ = sum(a != b for a, b in zip(ref, other))
    print(f"outputs_differ {args[2]} {differ}/{len(ref)}")
PYEOF
}

drive() { "$PY" "$WORK/drive.py" "$@"; }

check_idle() {
  local setting
  for setting in $IDLE_SETTINGS; do
    local extra=()   # on: the plugin's default delay; off: 0 (NIXL spins); a number: that delay in us
    case "$setting" in
      on) ;;
      off) extra=(PD_ACCURACY_NIXL_PTHR_DELAY_US=0) ;;
      *) extra=(PD_ACCURACY_NIXL_PTHR_DELAY_US="$setting") ;;
    esac
    local pp dp
    pp=$(free_port); dp=$(free_port)
    start_server "idle-$setting-prefill" kv_producer 0 "$pp" "$(free_port)" "${extra[@]}"
    start_server "idle-$setting-decode" kv_consumer 1 "$dp" "$(free_port)" "${extra[@]}"
    drive wait "http://127.0.0.1:$pp" "http://127.0.0.1:$dp"
    drive latency "http://127.0.0.1:$pp" "http://127.0.0.1:$dp" "$N_LATENCY" | sed "s/^/[$setting] /"
    sleep 2  # let the last request's work drain before sampling idle CPU
    drive idle "$IDLE_SECONDS" "prefill=${PGIDS[idle-$setting-prefill]}" \
      "decode=${PGIDS[idle-$setting-decode]}" | sed "s/^/[$setting] /"
    drive threads 3 "prefill=${PGIDS[idle-$setting-prefill]}" \
      "decode=${PGIDS[idle-$setting-decode]}" | sed "s/^/[$setting] /"
    echo "[$setting] delay log lines: $(grep -c 'nixl_idle: agent' "$WORK"/idle-"$setting"-*.log || true)"
    stop_server "idle-$setting-prefill"; stop_server "idle-$setting-decode"
  done
}

check_faults() {
  local pp sp
  pp=$(free_port); sp=$(free_port)
  start_server fault-prefill kv_producer 0 "$pp" "$sp"
  local run name fault block value
  for run in $FAULT_RUNS; do
    IFS=: read -r name fault block value <<<"$run"
    local dp extra=()
    dp=$(free_port)
    [[ -n "$fault" ]] && extra=(PD_ACCURACY_FAULT="$fault" PD_ACCURACY_FAULT_BLOCK="$block"
                                PD_ACCURACY_FAULT_VALUE="${value:-zero}")
    start_server "fault-decode-$name" kv_consumer 1 "$dp" "$(free_port)" "${extra[@]}"
    drive wait "http://127.0.0.1:$pp" "http://127.0.0.1:$dp"
    drive outputs "http://127.0.0.1:$pp" "http://127.0.0.1:$dp" "$WORK/$name.json" | sed "s/^/[$name] /"
    if [[ "$name" == clean ]]; then  # the same prompts again through the same pair
      drive outputs "http://127.0.0.1:$pp" "http://127.0.0.1:$dp" "$WORK/clean-repeat.json" \
        | sed "s/^/[clean-repeat] /"
      drive compare "$WORK/clean.json" "$WORK/clean-repeat.json" clean-repeat
    fi
    stop_server "fault-decode-$name"
    if [[ "$name" != clean ]]; then
      drive compare "$WORK/clean.json" "$WORK/$name.json" "$name"
    fi
    echo "[$name] applied fault lines: $(grep -c 'pd-accuracy fault:' "$WORK/fault-decode-$name.log" || true)," \
         "skipped: $(grep -c 'pd-accuracy fault-skipped:' "$WORK/fault-decode-$name.log" || true)"
    grep -m1 'pd-accuracy fault:' "$WORK/fault-decode-$name.log" | sed "s/^/[$name] e.g. /" || true
  done
  grep -h -m1 'pd-accuracy fault-setup:' "$WORK"/fault-decode-*.log | head -1 | sed 's/^/[layout] /' || true
  stop_server fault-prefill
}

main() {
  case "$MODE" in
    idle|faults|all) ;;
    *) echo "usage: $0 [idle|faults|all]" >&2; exit 2 ;;
  esac
  if [[ "${PD_ACCURACY_HEAVY_LOCKED:-}" != 1 ]]; then
    exec env PD_ACCURACY_HEAVY_LOCKED=1 flock "$LOCK" "$0" "$@"
  fi
  trap stop_all EXIT
  trap 'exit 130' INT TERM
  [[ -d "$MODEL" ]] || "$PY" -m harness.zoo.random_llama
  WORK="$(mktemp -d /tmp/pd-accuracy-check-plugins.XXXXXX)"
  echo "work dir: $WORK"
  write_driver
  case "$MODE" in
    idle) check_idle ;;
    faults) check_faults ;;
    all) check_idle; check_faults ;;
  esac
}

main "$@"; exit
