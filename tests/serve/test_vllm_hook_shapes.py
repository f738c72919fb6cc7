"""Every hook of the compatibility table on the shape a vLLM release ships, read statically from
its wheel (scripts/vllm_hook_shapes.py -> tests/data/vllm_hook_shapes/RELEASE.json): fake modules
of exactly those classes, functions and parameters, asked by the table (does it attach, on which
alternative) and by the hooks' own code where a release changed a signature they call."""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from harness.core import vllm_hooks
from harness.connectors.nixl import NIXL_WORKER
from harness.core.vllm_hooks import hooks, missing, shapes
from harness.connectors.nixl.in_server import kv_events as nixl

SHAPES = Path(__file__).resolve().parents[1] / "data" / "vllm_hook_shapes"
RELEASES = sorted(p.stem for p in SHAPES.glob("*.json"))
# NIXL's bindings are compiled: not in a vLLM wheel's source; 1.5.1 serves every release here
NIXL_151 = {"nixl_cu13._api": types.SimpleNamespace(nixlBind=types.SimpleNamespace(
    nixlAgent=type("nixlAgent", (), {})))}
# the alternative each hook runs on, per release (doctor prints these)
_ON_033_034 = {"kv-events": ["get_transfer_results(finished_req_ids)"],
               "nixl-read-poll": ["_handle_failed_transfer(req_id, handle, failed_req_ids)"],
               "nixl-leases": ["_reap_expired_send_leases"],
               "nixl-idle": ["nixlAgent"]}
_ON_033_034["wrong-drafts"] = ["propose(input_batch, dummy_run)"]   # runner V2's speculator
# hooks a release cannot take, with what it lacks (none of 0.33.0 and 0.34.0's)
NOT_ON_RELEASE: dict[tuple[str, str], str] = {}
EXPECTED_SHAPES = {"0.33.0": _ON_033_034, "0.34.0": _ON_033_034}


def _function(name: str, params: list[str]):
    """A function named `name` taking exactly `params` (as the wheel's source declares them)."""
    plain = [p for p in params if not p.startswith("*")]
    star = [p for p in params if p.startswith("*")]
    signature = ", ".join([*(f"{p}=None" for p in plain), *star])
    scope: dict = {}
    exec(f"def {name}({signature}): return None", scope)   # noqa: S102 - test fake
    return scope[name]


def fake_release(release: str) -> dict[str, object]:
    """module name -> a fake module holding every need the wheel has, at its signature."""
    table = json.loads((SHAPES / f"{release}.json").read_text())
    modules: dict[str, object] = dict(NIXL_151)
    for needs in table["hooks"].values():
        for need in needs:
            if not need.get("exists"):
                continue
            node = modules.setdefault(need["module"], types.SimpleNamespace())
            parts = [p for p in need["path"].split(".") if p]
            for part in parts[:-1]:
                if not hasattr(node, part):
                    setattr(node, part, type(part, (), {}))
                node = getattr(node, part)
            if parts:
                leaf = (_function(parts[-1], need["params"]) if need.get("kind") == "function"
                        else type(parts[-1], (), {}))
                setattr(node, parts[-1], leaf)
    return modules


def importer(modules):
    def load(name):
        if name not in modules:
            raise ModuleNotFoundError(name)
        return modules[name]
    return load


def test_there_is_a_release_shape():
    assert {"0.33.0", "0.34.0"} <= set(RELEASES)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("hook", [row.name for row in hooks()])
def test_every_hook_attaches_on_the_release_shape(release, hook):
    load = importer(fake_release(release))
    lacks = NOT_ON_RELEASE.get((release, hook))
    if lacks is not None:
        assert lacks in (missing(hook, load) or "")
        return
    assert missing(hook, load) is None
    expected = EXPECTED_SHAPES.get(release, {}).get(hook)
    if expected is not None:
        assert shapes(hook, load) == expected


@pytest.mark.parametrize("release", RELEASES)
def test_no_need_of_the_table_is_absent_from_the_wheel(release):
    """Each need is in the wheel, or (for an any_of) one of its alternatives is."""
    table = json.loads((SHAPES / f"{release}.json").read_text())
    for row in hooks():
        found = {(n["module"], n["path"]) for n in table["hooks"][row.name] if n.get("exists")}
        unknown = {(n["module"], n["path"]) for n in table["hooks"][row.name]
                   if n.get("exists") is None}
        if (release, row.name) in NOT_ON_RELEASE:
            assert not found, (release, row.name)
            continue
        for need in row.needs:
            alts = need.needs if isinstance(need, vllm_hooks.AnyOf) else (need,)
            assert any((a.module, a.path) in found | unknown for a in alts), (row.name, str(need))


def test_a_failed_read_on_034_is_recorded_once_through_the_four_argument_handler():
    """0.34.0's _handle_failed_transfer(req_id, handle, failed_req_ids, record_failed_transfer)
    returns True for a handle already released (None) and lists the request as failed; the
    harness's fail-transfer canary calls it with (request, None, failed)."""
    calls = []

    class Worker034:
        def _handle_failed_transfer(self, req_id, handle, failed_req_ids=None,
                                    record_failed_transfer=True):
            calls.append((req_id, handle, record_failed_transfer))
            if failed_req_ids is not None:
                failed_req_ids.add(req_id)
            return handle is None

    failed: set[str] = set()
    nixl.report_failed(Worker034(), "d1", failed)
    assert failed == {"d1"} and calls == [("d1", None, True)]


def test_the_034_poll_returns_done_and_failed_and_the_wrapper_keeps_both():
    """0.34.0's _pop_done_transfers returns (done, failed); the read-poll wrapper announces the
    done reads and hands both sets back unchanged."""
    announced = []

    def pop(self, transfers):
        return {"d1"}, {"d2"}

    wrapped = nixl.wrap_poll(pop, lambda connector, request_id, *a: announced.append(request_id))
    worker = types.SimpleNamespace()
    result = wrapped(worker, {"d1": [], "d2": []})
    assert result == ({"d1"}, {"d2"})


def test_the_table_names_the_nixl_worker_module_034_ships():
    table = json.loads((SHAPES / "0.34.0.json").read_text())
    modules = {n["module"] for needs in table["hooks"].values() for n in needs if n.get("exists")}
    assert NIXL_WORKER in modules
