"""What one CPU vLLM server costs per request, apart from the harness: start one server as the
harness starts a baseline (pinned to a core, the fork-start plugin), wait for /health, then send
N GSM8K questions (3-shot prompt, exactly 90 generated tokens: ignore_eos) at concurrency C and
print one JSON line: time to ready, wall time, the server tree's CPU seconds under load and idle.

    python scripts/server_step_cost.py --dtype bfloat16             # the smoke cells' dtype
    python scripts/server_step_cost.py --dtype float32
    python scripts/server_step_cost.py --single-process             # VLLM_ENABLE_V1_MULTIPROCESSING=0

Numbers go into results/benchmarks/ (cpu-ci-no-bf16-20261202/README.md). The server is
stopped by its process group on every exit path.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "harness" / "zoo" / "checkpoints" / "tiny-llama-gsm"


def tree_cpu_s(pid: int) -> float:
    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--single-process", action="store_true",
                    help="VLLM_ENABLE_V1_MULTIPROCESSING=0 (engine core and worker in the API server)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("-n", type=int, default=50)
    ap.add_argument("--core", default="0")
    ap.add_argument("--port", type=int, default=31000)
    ap.add_argument("--data", default=os.environ.get("PD_ACCURACY_GSM8K_DIR",
                                                     str(REPO.parent / "shared" / "data" / "gsm8k")))
    args = ap.parse_args()

    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=args.core,
               VLLM_NO_USAGE_STATS="1", VLLM_USE_V2_MODEL_RUNNER="0", PD_ACCURACY_FORK_START="1")
    if args.single_process:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    argv = ["taskset", "-c", args.core, sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(MODEL), "--served-model-name", "m", "--host", "127.0.0.1",
            "--port", str(args.port), "--dtype", args.dtype, "--max-model-len", "2048",
            "--block-size", "128", "--seed", "0", "--attention-backend", "CPU_ATTN",
            "--kv-cache-memory-bytes", str(512 << 20), "--enforce-eager"]
    data = Path(args.data)
    questions = [json.loads(line)["question"] for line in open(data / "test.jsonl")][:args.n]
    shots = "".join(f"Question: {d['question']}\nAnswer: {d['answer']}\n\n"
                    for d in (json.loads(line) for line in list(open(data / "train.jsonl"))[:3]))
    url = f"http://127.0.0.1:{args.port}"
    started = time.monotonic()
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        while True:
            if server.poll() is not None:
                print(f"server exited with {server.returncode} before it was ready", file=sys.stderr)
                return 1
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        ready_s = time.monotonic() - started
        idle0 = tree_cpu_s(server.pid)
        time.sleep(10)
        idle = tree_cpu_s(server.pid) - idle0

        def ask(question: str) -> str:
            body = json.dumps({"model": "m", "prompt": f"{shots}Question: {question}\nAnswer:",
                               "max_tokens": 90, "ignore_eos": True, "temperature": 0}).encode()
            req = urllib.request.Request(f"{url}/v1/completions", body,
                                         {"Content-Type": "application/json"})
            return json.loads(urllib.request.urlopen(req, timeout=600).read())["choices"][0]["text"]

        busy0, t0 = tree_cpu_s(server.pid), time.monotonic()
        with cf.ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(ask, questions))
        wall = time.monotonic() - t0
        print(json.dumps({"dtype": args.dtype, "single_process": args.single_process,
                          "concurrency": args.concurrency, "n": args.n,
                          "ready_s": round(ready_s, 1), "wall_s": round(wall, 1),
                          "server_cpu_s": round(tree_cpu_s(server.pid) - busy0, 1),
                          "idle_cpu_s_per_10s": round(idle, 2)}))
        return 0
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    raise SystemExit(main())
