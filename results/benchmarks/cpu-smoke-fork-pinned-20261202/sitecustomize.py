# Experiment shim for results/benchmarks/cpu-smoke-fork-pinned-20261202 (not part of the harness):
# on PYTHONPATH with EXP_PIN=1 / EXP_FORK=1, a vLLM API server pins itself to its
# VLLM_CPU_OMP_THREADS_BIND cores and makes vLLM CPU fork its engine core and worker.
import os, sys
if os.environ.get("EXP_PIN") == "1" and "vllm.entrypoints.openai.api_server" in " ".join(getattr(sys, "orig_argv", sys.argv)):
    spec = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "")
    cores = set()
    for part in spec.replace("|", ",").split(","):
        part = part.strip()
        if "-" in part:
            a, b = part.split("-"); cores.update(range(int(a), int(b) + 1))
        elif part.isdigit():
            cores.add(int(part))
    if cores:
        os.sched_setaffinity(0, cores)
if os.environ.get("EXP_FORK") == "1" and "vllm.entrypoints.openai.api_server" in " ".join(getattr(sys, "orig_argv", sys.argv)):
    try:
        from vllm.platforms.cpu import CpuPlatform
        orig = CpuPlatform.check_and_update_config.__func__
        def patched(cls, vllm_config):
            orig(cls, vllm_config)
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
        CpuPlatform.check_and_update_config = classmethod(patched)
    except Exception as e:
        print("EXP_FORK failed", e)
