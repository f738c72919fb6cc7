"""Cell → Deployment → Endpoint.

A Deployment owns the processes of one side of a comparison: either the non-disaggregated
baseline server, or a P/D pair (prefill server(s) + decode server(s)) plus the harness's proxy.
It reserves ports, plans every server's command (harness.serve.launch.server_spec), starts them concurrently in
their own process groups, waits for health with a deadline, and stops them on every exit path.
With host-wide start slots (harness.serve.host.start_slots) a server starts only when it holds a slot, and
its deadline counts from then. A pair of a `network: netns` cell runs in a two-host topology
(harness.serve.net.netns) created at launch and removed after its servers stopped.
The proxy is separate (`ProxyDeployment`) so that cells differing only in a proxy-side fault
reuse one P/D pair. P/D servers write their KV digests next to their logs.
"""
from __future__ import annotations

import shutil
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

from harness.core.cell import Cell
from harness.connectors import DEFAULT_KV_CONNECTOR, connector_for
from harness.weathers import DEFAULT_WEATHER, params_token
from harness.weathers.facts import ServerChanges
from harness.serve.net.netns import TopologyLedger, TwoHostTopology
from harness.serve.launch.placement import Placement
from harness.serve.host.ports import PortAllocator
from harness.serve.supervision import autogroup
from harness.serve.supervision.process import ManagedProcess, ServerStartTimeout
from harness.protocol.faults import BY_REQUEST
from harness.protocol.kv_digest import DIGEST_FILE_ENV
from harness.serve.launch.server_spec import (Features, ServerSpec, build_argv, build_env,
                                       cpu_affinity, engine_settings, forks_engine,
                                       render_command)
from harness.serve.host.start_slots import StartSlots
from harness.serve.template.client import template_for

# Size of the CPU KV cache per server: tiny models need little; never let one server take all RAM.
# (tiny zoo models need a few MiB; a real model on a GPU farm passes --kv-cache-bytes)
DEFAULT_KV_CACHE_BYTES = 512 * 1024 * 1024
GPU_SHARED_UTILIZATION = 0.06
# Ports reserved per server for vLLM's own use (VLLM_PORT and up: the distributed rendezvous)
INTERNAL_PORT_BLOCK = 4
# vLLM's KV connector threads sometimes ignore SIGTERM; no state there is worth waiting for
SERVER_TERM_TIMEOUT_S = 8.0


@dataclass(frozen=True)
class DeployContext:
    """What every server of a run is planned with, the same for each baseline and pair: where
    its ports come from, its cores or GPUs, its logs, how it starts and how long it may take."""

    allocator: PortAllocator
    placement: Placement
    log_dir: Path
    features: Features = field(default_factory=Features)
    startup_timeout_s: float = 300.0
    kv_cache_bytes: int | None = None
    start_slots: StartSlots | None = None
    server_start: str = "exec"
    kv_digest: bool = False             # P/D servers hash every request's prompt KV
    python: str = sys.executable


@dataclass(frozen=True)
class Endpoint:
    """Where an EvalRun sends its requests, and where the evidence of the run lies."""

    role: str                              # "baseline" | "pd"
    base_url: str
    served_model_name: str
    metrics_urls: tuple[str, ...]          # decode servers (pd) or the baseline server
    logs: dict[str, str] = field(default_factory=dict)
    proxy_records: str | None = None


def plan_server(cell: Cell, role: str, index: int, ctx: DeployContext, *, model_path: str,
                hybrid: bool, port: int, side_channel_port: int | None,
                internal_port: int | None = None, arm_faults: bool = False,
                load_format: str | None = None, model_kv_cache_bytes: int | None = None,
                weather: ServerChanges = ServerChanges(), arm_prefill: bool = False) -> ServerSpec:
    """The server of `role` for `cell`. `arm_faults`: a decode server that breaks the KV of the
    requests whose id names a fault (canaries sharing this pair), and of no other request;
    `arm_prefill`: a prefill server likewise, for prefill-side canaries (early-release).
    `weather`: what the cell's weather changes in this (P/D) server.
    KV cache: the run's --kv-cache-bytes, else what the model needs (`model_kv_cache_bytes`: a
    real-shape model), else the tiny models' default."""
    block = {"baseline": cell.baseline_block_size, "prefill": cell.prefill_block_size,
             "decode": cell.decode_block_size}[role]
    tp = {"baseline": cell.baseline_tp, "prefill": cell.prefill_tp, "decode": cell.decode_tp}[role]
    on_gpu = cell.device == "cuda"
    placement = ctx.placement
    return ServerSpec(
        role=role, index=index, model_path=model_path, served_model_name=cell.model_short,
        port=port, backend=cell.backend, block_size=block, device=cell.device,
        runner=(cell.prefill_runner or cell.runner) if role == "prefill" else cell.runner,
        dtype=cell.dtype, tp=tp, max_model_len=cell.max_model_len, compile=cell.compile,
        kv_buffer_device=cell.kv_buffer_device, kv_connector=cell.kv_connector,
        side_channel_port=side_channel_port, internal_port=internal_port,
        kv_cache_bytes=ctx.kv_cache_bytes or model_kv_cache_bytes or DEFAULT_KV_CACHE_BYTES,
        cpu_cores=None if on_gpu else placement.core_for(role, index, tp),
        gpu_ids=placement.gpus_for(role, index, tp, cell.prefill_tp * cell.num_prefill) if on_gpu else (),
        gpu_memory_utilization=GPU_SHARED_UTILIZATION if on_gpu else None,
        hybrid=hybrid, load_format=load_format,
        extra_args=cell.extra_args, extra_env=cell.extra_env,
        fault=BY_REQUEST if ((role == "decode" and arm_faults)
                             or (role == "prefill" and arm_prefill)) else None,
        weather=weather if role != "baseline" else ServerChanges(),
        python=ctx.python, **engine_settings(cell, role),
    )


def pair_key(cell: Cell) -> tuple:
    """Cells with equal pair_key can share one running P/D pair: canaries share their clean
    cell's pair (proxy faults act in the proxy, server faults arrive with each request)."""
    return (cell.baseline_key, cell.runner, cell.prefill_block_size, cell.decode_block_size,
            cell.prefill_tp, cell.decode_tp, cell.num_prefill, cell.num_decode,
            cell.kv_buffer_device, cell.kv_layout, cell.network, cell.kv_connector,
            cell.prefill_kv_cache_dtype, cell.prefill_runner, cell.weather, cell.weather_params)


def uses_template(server_start: str, spec: ServerSpec) -> bool:
    """Whether `spec`'s server forks from a server template (harness.serve.template.server).
    "auto" arms it where it is measured and calibrated: a CPU server pinned to its cores whose
    engine core forks (TP1). GPU servers keep exec: the GPU reference runs do not use the
    template (measurements: docs/startup.md)."""
    if server_start == "auto":
        return spec.device == "cpu" and forks_engine(spec)
    return server_start == "template"


class Deployment:
    """A set of vLLM servers started together and stopped together (context manager)."""

    def __init__(self, name: str, specs: Sequence[ServerSpec], *, log_dir: Path,
                 features: Features = Features(), startup_timeout_s: float = 300.0,
                 allocator: PortAllocator | None = None, reserved_ports: Sequence[int] = (),
                 start_slots: StartSlots | None = None,
                 topology: TwoHostTopology | None = None, kv_digest: bool = False,
                 server_start: str = "exec") -> None:
        self.name = name
        self.server_start = server_start   # "template": servers fork from a warm interpreter
        self.kv_digest = kv_digest         # P/D servers hash every request's prompt KV
        self.topology = topology           # created at launch, removed after the servers stopped
        self.specs = list(specs)
        self.log_dir = Path(log_dir)
        self.features = features
        self.startup_timeout_s = startup_timeout_s
        self.allocator = allocator
        self.reserved_ports = list(reserved_ports)
        self.processes: dict[str, ManagedProcess] = {}
        self.startup_s: float | None = None
        self._launched_at = time.monotonic()
        self.start_slots = start_slots
        self._starters: list[_SlotStarter] = []
        self._cancel = threading.Event()
        self._processes_lock = threading.Lock()
        self.restarted: dict[str, int] = {}   # server name -> times started again (restart)

    def commands(self) -> list[str]:
        """Each server's launch line as `_process` starts it (its env, `ip netns exec`)."""
        return [render_command(s, self.features, env=self._env(s, {})) for s in self.specs]

    def digest_path(self, spec: ServerSpec) -> Path:   # harness.protocol.kv_digest
        return self.log_dir / f"{self.name}-{spec.name}.kv-digest.jsonl"

    def digest_files(self, role: str) -> list[str]:
        """The digest files of this deployment's `role` servers; [] when digests are off."""
        return [str(self.digest_path(s)) for s in self.specs if self.kv_digest and s.role == role]

    def _env(self, spec: ServerSpec, base_env: dict[str, str] | None = None) -> dict[str, str]:
        env = build_env(spec, self.features, base_env)
        env.pop(DIGEST_FILE_ENV, None)
        if self.kv_digest and spec.role in ("prefill", "decode"):
            env[DIGEST_FILE_ENV] = str(self.digest_path(spec))
        return env

    def _process(self, spec: ServerSpec) -> ManagedProcess:
        argv = build_argv(spec, self.features)
        template = None
        if uses_template(self.server_start, spec):
            template = template_for(spec.python, self.log_dir, cpu_affinity(spec))
            if not template.can_run(argv):   # a launch prefix (ip netns exec) execs as before
                template = None
        return ManagedProcess(spec.name, argv, self.log_dir / f"{self.name}-{spec.name}.log",
                              env=self._env(spec), inherit_env=False,
                              cpu_affinity=cpu_affinity(spec), template=template)

    def launch(self) -> "Deployment":
        """Start every server (concurrently, each in its own process group); don't wait.
        With start slots, each server starts from a thread of its own once it holds a slot."""
        self._launched_at = time.monotonic()
        self.empty_shared_dirs()
        if self.topology is not None:
            self.topology.create()         # NetnsError (one line) when it cannot be made
        if self.start_slots is not None:
            self._cancel.clear()
            self._starters = [_SlotStarter(self, spec) for spec in self.specs]
            for starter in self._starters:
                starter.thread.start()
            return self
        yielding = autogroup.enabled()
        try:
            for spec in self.specs:
                self.processes[spec.name] = process = self._process(spec).start()
                # on CPU a server yields its cores until someone waits for it (wait())
                if yielding and cpu_affinity(spec) is not None and process.pid is not None:
                    autogroup.set_autogroup_nice(process.pid, autogroup.YIELD_NICE)
        except BaseException:
            self.stop()
            raise
        return self

    def shared_dirs(self) -> list[Path]:
        """The directories this deployment's servers share (ExampleConnector's KV files)."""
        return sorted({Path(s.kv_shared_path) for s in self.specs if s.kv_shared_path})

    def empty_shared_dirs(self) -> None:
        """Empty the shared directories (at launch, and before each cell's evaluation): a file
        an earlier run or cell saved would be found by prompt hash, and the prefill would load
        it instead of computing and saving the prompt's KV itself."""
        for path in self.shared_dirs():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True)

    def wait(self) -> "Deployment":
        """Wait until every server answers /health; the first to die (or the deadline) raises
        ManagedProcessError naming it and its decisive log line. Servers stay up on error."""
        if self.start_slots is not None:
            return self._wait_for_starters()
        deadline_from = self._launched_at
        # waited for: what the run waits on gets the cores first, and its deadline counts from
        # now (while it yielded, it got only idle cores)
        if autogroup.claim([self.processes[s.name].pid for s in self.specs]):
            deadline_from = time.monotonic()
        pending = list(self.specs)
        while pending:
            # poll every server in turn, so the first one to die fails the wait at once
            for spec in list(pending):
                remaining = self.startup_timeout_s - (time.monotonic() - deadline_from)
                try:
                    self.processes[spec.name].wait_healthy(
                        f"{spec.base_url}/health", deadline_s=max(0.5, min(1.0, remaining)),
                        poll_s=0.25)
                    pending.remove(spec)
                except ServerStartTimeout:
                    if remaining <= 1.0:
                        raise ServerStartTimeout(spec.name, self.startup_timeout_s,
                                                 self.processes[spec.name].log_path,
                                                 self.processes[spec.name].decisive_lines())
        self.startup_s = time.monotonic() - self._launched_at
        return self

    def _wait_for_starters(self) -> "Deployment":
        while True:
            if self._cancel.is_set():
                raise RuntimeError(f"{self.name}: stopped while starting")
            failed = sorted((s for s in self._starters if s.error is not None),
                            key=lambda s: s.finished_at or 0.0)
            if failed:
                raise failed[0].error  # the first server to fail, as without slots
            if all(s.healthy for s in self._starters):
                break
            time.sleep(0.1)
        self.startup_s = time.monotonic() - self._launched_at
        return self

    def start(self) -> "Deployment":
        self.launch()
        try:
            return self.wait()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        with self._processes_lock:  # no starter thread starts a server after this point
            self._cancel.set()
            procs = list(self.processes.values())
        for proc in reversed(procs):
            proc.stop(term_timeout_s=SERVER_TERM_TIMEOUT_S)
        for starter in self._starters:  # each ends once its server is gone (and frees its slot)
            starter.thread.join(timeout=SERVER_TERM_TIMEOUT_S + 5)
        if self.topology is not None:
            self.topology.remove()
        if self.allocator and self.reserved_ports:
            self.allocator.release(self.reserved_ports)
            self.reserved_ports = []

    def kill(self, role: str, index: int = 0) -> ManagedProcess:
        """SIGKILL one server's process group now (the restart weather's crash), reaped;
        its ports stay this deployment's. Returns the dead process."""
        spec = self._spec(role, index)
        with self._processes_lock:
            process = self.processes[spec.name]
        process.kill()
        return process

    def relaunch(self, role: str, index: int = 0) -> ManagedProcess:
        """Start a killed server again from its own spec (same ports, a new log next to the
        first) and wait until it answers /health."""
        spec = self._spec(role, index)
        with self._processes_lock:
            if self._cancel.is_set():
                raise RuntimeError(f"{self.name}: stopped; {spec.name} is not started again")
            old = self.processes[spec.name]
            if old.is_running():
                raise RuntimeError(f"{self.name}: {spec.name} is still running")
            process = self._process(spec)
            process.log_path = old.log_path.with_name(
                f"{old.log_path.stem}.restart{self._restarts(spec.name)}.log")
            self.processes[spec.name] = process.start()
        process.wait_healthy(f"{spec.base_url}/health", deadline_s=self.startup_timeout_s)
        return process

    def _restarts(self, name: str) -> int:
        self.restarted[name] = self.restarted.get(name, 0) + 1
        return self.restarted[name]

    def _spec(self, role: str, index: int) -> ServerSpec:
        found = [s for s in self.specs if s.role == role]
        if index >= len(found):
            raise ValueError(f"{self.name}: no {role} server {index}")
        return found[index]

    def __enter__(self) -> "Deployment":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def urls(self, role: str) -> list[str]:
        return [s.base_url for s in self.specs if s.role == role]

    def logs(self) -> dict[str, str]:
        return {name: str(p.log_path) for name, p in self.processes.items()}

    def rss_bytes(self) -> int:
        return sum(p.rss_bytes() for p in self.processes.values() if p.is_running())

    def baseline_endpoint(self) -> Endpoint:
        spec = self.specs[0]
        return Endpoint("baseline", spec.base_url, spec.served_model_name, (spec.base_url,),
                        self.logs())


class _SlotStarter:
    """Starts one server of a Deployment once it holds a host-wide start slot, waits for its
    health (deadline from its own start) and frees the slot: the slot never outlives start-up,
    whoever calls Deployment.wait() and when, so runs holding slots cannot wait on each other."""

    def __init__(self, deployment: Deployment, spec: ServerSpec) -> None:
        self.deployment, self.spec = deployment, spec
        self.healthy = False
        self.error: BaseException | None = None
        self.finished_at: float | None = None
        self.thread = threading.Thread(target=self._run, name=f"start-{deployment.name}-{spec.name}",
                                       daemon=True)

    def _run(self) -> None:
        d = self.deployment
        slot = None
        try:
            slot = d.start_slots.acquire(cancelled=d._cancel)
            if slot is None:
                return  # the deployment was stopped while waiting
            with d._processes_lock:
                if d._cancel.is_set():
                    return
                proc = d._process(self.spec)
                d.processes[self.spec.name] = proc
                proc.start()
            proc.wait_healthy(f"{self.spec.base_url}/health", deadline_s=d.startup_timeout_s,
                              poll_s=0.25)
            self.healthy = True
        except Exception as exc:  # noqa: BLE001 - becomes the deployment's start-up error
            self.error = exc
        finally:
            if slot is not None:
                slot.release()
            self.finished_at = time.monotonic()


class ProxyDeployment:
    """The harness's P/D router in front of a running pair, for one cell (its own records)."""

    def __init__(self, pair: Deployment, *, port: int, log_dir: Path, fault: str | None,
                 records_path: Path, startup_timeout_s: float = 60.0,
                 allocator: PortAllocator | None = None, python: str = sys.executable,
                 request_tag: str = "", cache_salt: str | None = None,
                 kv_connector: str = DEFAULT_KV_CONNECTOR,
                 forward_authorization: bool = False) -> None:
        self.pair = pair
        self.port = port
        self.records_path = Path(records_path)
        self.fault = fault
        self.allocator = allocator
        argv = [python, "-m", "harness.serve.proxy.app", "--host", "127.0.0.1", "--port", str(port)]
        for url in pair.urls("prefill"):
            argv += ["--prefill", url]
        for url in pair.urls("decode"):
            argv += ["--decode", url]
        argv += ["--kv-connector", kv_connector]   # how the kv_transfer_params travel
        for spec in getattr(pair, "specs", ()):   # a deployment file's upstreams have none
            if spec.role == "prefill" and spec.side_channel_port is not None:
                argv += ["--prefill-side", f"{spec.base_url}="
                         f"{spec.side_channel_host or spec.host}:{spec.side_channel_port}"]
        if fault:
            argv += ["--fault", fault]
        if request_tag:
            argv += ["--request-tag", request_tag]
        if cache_salt:
            argv += ["--cache-salt", cache_salt]
        if forward_authorization:
            argv.append("--forward-authorization")
        argv += ["--records", str(self.records_path)]
        self.process = ManagedProcess(f"proxy-{port}", argv, Path(log_dir) / f"proxy-{port}.log")
        self.startup_timeout_s = startup_timeout_s

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ProxyDeployment":
        try:
            self.process.start()
            self.process.wait_healthy(f"{self.base_url}/healthcheck", self.startup_timeout_s)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.stop()
        if self.allocator:
            self.allocator.release([self.port])

    def endpoint(self) -> Endpoint:
        spec = self.pair.specs[0]
        logs = dict(self.pair.logs())
        logs["proxy"] = str(self.process.log_path)
        return Endpoint("pd", self.base_url, spec.served_model_name,
                        tuple(self.pair.urls("decode")), logs, str(self.records_path))


def plan_baseline(cell: Cell, ctx: DeployContext, *, model_path: str,
                  hybrid: bool, load_format: str | None = None,
                  model_kv_cache_bytes: int | None = None) -> Deployment:
    allocator = ctx.allocator
    port = allocator.reserve(1, owner=f"baseline:{cell.cell_id}")[0]
    internal = allocator.reserve_block(INTERNAL_PORT_BLOCK, owner=f"baseline-vllm:{cell.cell_id}")
    spec = plan_server(cell, "baseline", 0, ctx, model_path=model_path, hybrid=hybrid, port=port,
                       side_channel_port=None, internal_port=internal[0],
                       load_format=load_format, model_kv_cache_bytes=model_kv_cache_bytes)
    return Deployment(f"baseline-{cell.baseline_key}", [spec], log_dir=ctx.log_dir,
                      features=ctx.features, startup_timeout_s=ctx.startup_timeout_s,
                      allocator=allocator, reserved_ports=[port, *internal],
                      start_slots=ctx.start_slots, server_start=ctx.server_start)


def plan_pair(cell: Cell, ctx: DeployContext, *, model_path: str, hybrid: bool,
              arm_faults: bool = False, load_format: str | None = None,
              model_kv_cache_bytes: int | None = None,
              weather: Mapping[str, ServerChanges] | None = None,
              arm_prefill: bool = False) -> Deployment:
    """`cell`'s P/D pair; `weather`: role -> what the cell's weather changes in its servers."""
    specs, reserved = [], []
    allocator = ctx.allocator
    # the topology ledger lives with the port registry (a dry run's: a throwaway one)
    topology = (TwoHostTopology.reserve(f"{ctx.log_dir}/{cell.cell_id}",
                                        ledger=TopologyLedger(allocator.lock_dir))
                if cell.network == "netns" else None)
    for role, count, tp in (("prefill", cell.num_prefill, cell.prefill_tp),
                            ("decode", cell.num_decode, cell.decode_tp)):
        for index in range(count):
            port = allocator.reserve(1, owner=f"{role}:{cell.cell_id}")[0]
            n_side = connector_for(cell.kv_connector).ports.per_rank * max(tp, 1)   # per TP rank
            side = allocator.reserve_block(n_side, owner=f"{role}-kv:{cell.cell_id}") if n_side else []
            internal = allocator.reserve_block(INTERNAL_PORT_BLOCK, owner=f"{role}-vllm:{cell.cell_id}")
            reserved += [port, *side, *internal]
            specs.append(plan_server(cell, role, index, ctx, model_path=model_path, hybrid=hybrid,
                                     port=port, side_channel_port=(side or [None])[0],
                                     internal_port=internal[0], arm_faults=arm_faults,
                                     load_format=load_format,
                                     model_kv_cache_bytes=model_kv_cache_bytes,
                                     weather=(weather or {}).get(role, ServerChanges()),
                                     arm_prefill=arm_prefill))
            if topology is not None:
                specs[-1] = topology.place(specs[-1])
    name = "pair-" + "-".join(str(x) for x in (
        cell.baseline_key, cell.prefill_block_size, cell.decode_block_size, cell.prefill_tp,
        cell.decode_tp, "armed" if arm_faults else "ok", *([topology.tag] if topology else ()),
        # pairs of other instance counts share the rest: their logs must not
        *([f"n{cell.num_prefill}x{cell.num_decode}"]
          if (cell.num_prefill, cell.num_decode) != (1, 1) else ()),
        *([cell.kv_connector] if cell.kv_connector != DEFAULT_KV_CONNECTOR else ()),
        *(["w_" + cell.weather + params_token(cell.weather_params)] if cell.weather != DEFAULT_WEATHER else ())))
    if connector_for(cell.kv_connector).shared_path_key:
        # the pair's own directory: another pair's files would be found by prompt hash
        shared = str(Path(ctx.log_dir) / f"{name}.kv-files")
        specs = [replace(s, kv_shared_path=shared) for s in specs]
    return Deployment(name, specs, log_dir=ctx.log_dir, features=ctx.features,
                      startup_timeout_s=ctx.startup_timeout_s, allocator=allocator,
                      reserved_ports=reserved, start_slots=ctx.start_slots, topology=topology,
                      kv_digest=ctx.kv_digest, server_start=ctx.server_start)
