"""Unit tests of the vLLM plugins' pure parts (no servers, no real NIXL agent)."""
from __future__ import annotations

import logging
import types
from dataclasses import dataclass

import pytest
import torch

from harness.protocol import faults as fault_spec

from harness.serve.plugins.faults import decode as faults

from harness.connectors.nixl.in_server import idle as nixl_idle
from harness.protocol.faults import FaultOutcome, FaultSpec
from harness.serve.plugins.kv_events import interface
from harness.serve.plugins.kv_events.interface import KVView


# ---------------------------------------------------------------- nixl_idle

def test_delay_env_parsing():
    assert nixl_idle.parse_delay_us({}) == nixl_idle.DEFAULT_PTHR_DELAY_US
    assert nixl_idle.parse_delay_us({nixl_idle.DELAY_ENV: " 2500 "}) == 2500
    assert nixl_idle.parse_delay_us({nixl_idle.DELAY_ENV: "0"}) == 0
    with pytest.raises(ValueError):
        nixl_idle.parse_delay_us({nixl_idle.DELAY_ENV: "-1"})
    with pytest.raises(ValueError):
        nixl_idle.parse_delay_us({nixl_idle.DELAY_ENV: "1ms"})


def test_apply_progress_delay_only_replaces_the_spinning_zero():
    config = types.SimpleNamespace(pthrDelay=0, lthrDelay=100000)
    assert nixl_idle.apply_progress_delay(config, 1000) is True
    assert config.pthrDelay == 1000 and config.lthrDelay == 100000
    chosen = types.SimpleNamespace(pthrDelay=50)
    assert nixl_idle.apply_progress_delay(chosen, 1000) is False
    assert chosen.pthrDelay == 50
    untouched = types.SimpleNamespace(pthrDelay=0)
    assert nixl_idle.apply_progress_delay(untouched, 0) is False
    assert untouched.pthrDelay == 0


class FakeAgentConfig:
    """Mimics nixlBind.nixlAgentConfig: NIXL's _api sets pthrDelay = 0 after construction."""

    def __init__(self):
        self.pthrDelay = 0


def make_fake_api():
    built = []

    def nixlAgent(name, config):
        built.append((name, config.pthrDelay))
        return object()

    bindings = types.SimpleNamespace(nixlAgent=nixlAgent, nixlAgentConfig=FakeAgentConfig,
                                     NIXL_READ="READ")
    api = types.ModuleType("fake_nixl_api")
    api.nixlBind = bindings
    api.nixl_agent = object
    return api, built


def test_patch_nixl_api_sets_delay_when_the_agent_is_built_and_is_idempotent():
    api, built = make_fake_api()
    assert nixl_idle.patch_nixl_api(api, 1500) is True
    proxy = api.nixlBind
    assert nixl_idle.patch_nixl_api(api, 1500) is True
    assert api.nixlBind is proxy  # not wrapped twice
    assert api.nixlBind.NIXL_READ == "READ"  # everything else still reaches the real bindings
    config = api.nixlBind.nixlAgentConfig()
    api.nixlBind.nixlAgent("agent-1", config)
    assert built == [("agent-1", 1500)]


def test_patch_nixl_api_leaves_an_unknown_module_alone(caplog):
    strange = types.ModuleType("strange")
    with caplog.at_level(logging.WARNING, logger="vllm.pd_accuracy"):
        assert nixl_idle.patch_nixl_api(strange, 1000) is False
    assert not hasattr(strange, "nixlBind")
    assert "progress thread left spinning" in caplog.text


def test_nixl_idle_register_patches_on_import_and_is_idempotent(monkeypatch):
    api, built = make_fake_api()
    hooks = []
    monkeypatch.setattr(nixl_idle.register, "done", False)
    monkeypatch.setattr(nixl_idle.wrapt, "register_post_import_hook",
                        lambda hook, name: hooks.append((name, hook)))
    monkeypatch.setenv(nixl_idle.DELAY_ENV, "3000")
    nixl_idle.register()
    nixl_idle.register()
    assert sorted(name for name, _ in hooks) == sorted(nixl_idle.NIXL_API_MODULES)
    hooks[0][1](api)  # the module gets imported
    api.nixlBind.nixlAgent("a", FakeAgentConfig())
    assert built == [("a", 3000)]


def test_nixl_idle_register_is_a_no_op_when_disabled_or_env_is_bad(monkeypatch):
    hooks = []
    monkeypatch.setattr(nixl_idle.wrapt, "register_post_import_hook",
                        lambda hook, name: hooks.append(name))
    for value in ("0", "not-a-number"):
        monkeypatch.setattr(nixl_idle.register, "done", False)
        monkeypatch.setenv(nixl_idle.DELAY_ENV, value)
        nixl_idle.register()  # must not raise
    assert hooks == []


# ---------------------------------------------------------------- faults: env + selection

def test_fault_env_parsing():
    assert fault_spec.parse_fault_env({}) is None
    assert fault_spec.parse_fault_env({fault_spec.FAULT_ENV: " "}) is None
    assert fault_spec.parse_fault_env({fault_spec.FAULT_ENV: "corrupt-block"}) == FaultSpec(
        "corrupt-block", "first", "zero")
    spec = fault_spec.parse_fault_env({fault_spec.FAULT_ENV: "swap-blocks", fault_spec.BLOCK_ENV: "last",
                                   fault_spec.VALUE_ENV: "noise"})
    assert spec == FaultSpec("swap-blocks", "last", "noise")
    assert fault_spec.parse_fault_env({fault_spec.FAULT_ENV: "corrupt-block",
                                   fault_spec.BLOCK_ENV: "-2"}).block == -2
    for bad in ({fault_spec.FAULT_ENV: "drop-transfer"},
                {fault_spec.FAULT_ENV: "corrupt-block", fault_spec.BLOCK_ENV: "middle"},
                {fault_spec.FAULT_ENV: "corrupt-block", fault_spec.VALUE_ENV: "ones"}):
        with pytest.raises(ValueError):
            fault_spec.parse_fault_env(bad)


@pytest.mark.parametrize("kind, block, num_blocks, expected", [
    ("corrupt-block", "first", 3, (0,)),
    ("corrupt-block", "last", 3, (2,)),
    ("corrupt-block", 1, 3, (1,)),
    ("corrupt-block", -1, 3, (2,)),
    ("corrupt-block", 3, 3, None),
    ("corrupt-block", -4, 3, None),
    ("corrupt-block", "first", 0, None),
    ("corrupt-block", "last", 1, (0,)),
    ("swap-blocks", "first", 3, (0, 2)),
    ("swap-blocks", "last", 3, (2, 0)),
    ("swap-blocks", 1, 3, (1, 2)),
    ("swap-blocks", "first", 2, (0, 1)),
    ("swap-blocks", "first", 1, None),
    ("perturb-kv", "all", 3, (0, 1, 2)),
    ("perturb-kv", "first", 2, (0, 1)),
    ("swap-blocks", "all", 3, None),
])
def test_select_block_positions(kind, block, num_blocks, expected):
    assert fault_spec.select_block_positions(num_blocks, FaultSpec(kind, block)) == expected


# ---------------------------------------------------------------- faults: tensors

def cpu_attn_cache(num_blocks=4, heads=2, block_size=4, head_dim=3):
    """The CPU_ATTN per-layer layout: [num_blocks, num_kv_heads, block_size, 2 * head_size]."""
    numel = num_blocks * heads * block_size * 2 * head_dim
    return torch.arange(1, numel + 1, dtype=torch.float32).to(torch.bfloat16).view(
        num_blocks, heads, block_size, 2 * head_dim)


def test_corrupt_block_zero_touches_only_that_block():
    cache = cpu_attn_cache()
    before = cache.clone()
    faults.corrupt_block(cache, 2, "zero")
    assert torch.count_nonzero(cache[2]) == 0
    for other in (0, 1, 3):
        assert torch.equal(cache[other], before[other])


def test_corrupt_block_noise_changes_the_block_reproducibly():
    first, second = cpu_attn_cache(), cpu_attn_cache()
    before = first.clone()
    faults.corrupt_block(first, 1, "noise", torch.Generator().manual_seed(0))
    faults.corrupt_block(second, 1, "noise", torch.Generator().manual_seed(0))
    assert not torch.equal(first[1], before[1])
    assert torch.equal(first, second)
    assert torch.equal(first[0], before[0]) and torch.equal(first[2], before[2])
    assert torch.isfinite(first.float()).all()


def test_perturb_is_small_relative_noise_on_every_value_of_the_block():
    cache = torch.randn(4, 2, 32, 16, generator=torch.Generator().manual_seed(1))
    before = cache.clone()
    faults.perturb_block(cache, 1, 1e-3, torch.Generator().manual_seed(0))
    ratio = cache[1] / before[1]
    assert (ratio != 1).float().mean() > 0.99           # every value moved ...
    assert float((ratio - 1).abs().max()) < 1e-2        # ... by about 1e-3 of itself
    assert 5e-4 < float((ratio - 1).std()) < 2e-3
    assert torch.equal(cache[0], before[0]) and torch.equal(cache[2], before[2])


def test_perturb_env_defaults_and_scale():
    spec = fault_spec.parse_fault_env({fault_spec.FAULT_ENV: "perturb-kv"})
    assert (spec.block, spec.value) == ("all", "noise")
    assert fault_spec.perturb_scale({}) == 1e-3
    assert fault_spec.perturb_scale({fault_spec.SCALE_ENV: "1e-2"}) == 1e-2
    for bad in ("0", "-1", "x"):
        with pytest.raises(ValueError, match="PD_ACCURACY_FAULT_SCALE"):
            fault_spec.perturb_scale({fault_spec.SCALE_ENV: bad})
    tag = fault_spec.request_tag_for("perturb-kv")
    assert fault_spec.parse_request_fault(f"cmpl-pdacc-{tag}abc") == spec


def test_swap_blocks_on_a_strided_view():
    # A non-contiguous logical view (physical order [H, B, N, C]), as other layouts produce.
    physical = cpu_attn_cache().permute(1, 0, 2, 3).contiguous()
    cache = physical.permute(1, 0, 2, 3)
    assert not cache.is_contiguous()
    before = cache.clone()
    faults.swap_blocks(cache, 0, 3)
    assert torch.equal(cache[0], before[3]) and torch.equal(cache[3], before[0])
    assert torch.equal(cache[1], before[1]) and torch.equal(cache[2], before[2])


def test_blocks_view_of_a_flat_byte_cache():
    page_bytes = 2 * 4 * 6 * 2  # heads * block_size * 2*head_dim * bf16
    logical = cpu_attn_cache()
    flat = logical.view(-1).view(torch.uint8)
    assert flat.ndim == 1
    blocks = faults.blocks_view(flat, page_bytes, torch.bfloat16)
    assert blocks.shape == (4, page_bytes // 2) and blocks.dtype == torch.bfloat16
    faults.corrupt_block(blocks, 1, "zero")
    assert torch.count_nonzero(logical[1]) == 0 and torch.count_nonzero(logical[0]) > 0
    assert faults.blocks_view(logical, None, None) is logical
    with pytest.raises(ValueError):
        faults.blocks_view(flat, None, None)


# ---------------------------------------------------------------- faults: worker glue

class AttentionSpec:  # named like vLLM's classes: the plugin matches by class name
    page_size_bytes = 2 * 4 * 6 * 2
    dtype = torch.bfloat16


class FullAttentionSpec(AttentionSpec):
    pass


class MambaSpec:
    page_size_bytes = 64
    dtype = torch.float32


@dataclass
class FakeGroup:
    layer_names: list[str]
    kv_cache_spec: object


def fake_view(caches, groups, specs=None, ratio=1) -> KVView:
    return KVView(caches=caches, groups=groups, layer_specs=specs or {}, kernel_block_size=4,
                  blocks_per_logical=ratio, num_kernel_blocks=8)


def hybrid_worker():
    ssm_state = torch.arange(8 * 16, dtype=torch.float32).view(8, 16)
    caches = {"attn.0": cpu_attn_cache(8), "attn.1": cpu_attn_cache(8), "mamba.0": ssm_state}
    groups = [FakeGroup(["attn.0", "attn.1"], FullAttentionSpec()), FakeGroup(["mamba.0"], MambaSpec())]
    specs = {"attn.0": FullAttentionSpec(), "attn.1": FullAttentionSpec(), "mamba.0": MambaSpec()}
    return fake_view(caches, groups, specs)


def test_apply_corrupt_touches_attention_layers_and_never_ssm_state():
    view = hybrid_worker()
    before = {name: cache.clone() for name, cache in view.caches.items()}
    outcome = faults.apply_fault(view, [[5, 2, 7], [3]], FaultSpec("corrupt-block", "last"))
    assert outcome == FaultOutcome(applied=True, block_ids=((7,),), num_layers=2)
    for name in ("attn.0", "attn.1"):
        assert torch.count_nonzero(view.caches[name][7]) == 0
        assert torch.equal(view.caches[name][5], before[name][5])
    assert torch.equal(view.caches["mamba.0"], before["mamba.0"])


def test_scheduler_blocks_are_expanded_to_the_kernel_blocks_under_them():
    """A 128-token scheduler block over 64-token kernel blocks: block 2 is kernel blocks 4, 5."""
    cache = cpu_attn_cache(8)
    view = fake_view({"a": cache}, [FakeGroup(["a"], FullAttentionSpec())], ratio=2)
    outcome = faults.apply_fault(view, [[2, 1]], FaultSpec("corrupt-block", "last"))
    assert outcome.block_ids == ((3,),) and torch.count_nonzero(cache[3]) == 0


def test_apply_swap_on_aliased_layers_swaps_once():
    shared = cpu_attn_cache(8)
    before = shared.clone()
    view = fake_view({"a": shared, "b": shared}, [FakeGroup(["a", "b"], FullAttentionSpec())])
    outcome = faults.apply_fault(view, [[4, 6]], FaultSpec("swap-blocks", "first"))
    assert outcome.applied and outcome.block_ids == ((4, 6),) and outcome.num_layers == 1
    assert torch.equal(shared[4], before[6]) and torch.equal(shared[6], before[4])


def test_apply_swap_on_a_single_block_request_is_not_applied():
    view = hybrid_worker()
    before = view.caches["attn.0"].clone()
    outcome = faults.apply_fault(view, [[3], []], FaultSpec("swap-blocks"))
    assert not outcome.applied and "1-blocks" in outcome.reason
    assert torch.equal(view.caches["attn.0"], before)


def test_fault_lines_round_trip():
    spec = FaultSpec("swap-blocks", "first")
    applied = fault_spec.format_fault_line("cmpl-abc-0", spec, FaultOutcome(True, ((4, 6),), 2))
    skipped = fault_spec.format_fault_line("cmpl-def-0", spec, FaultOutcome(False, reason="group0:1-blocks"))
    assert applied.startswith(fault_spec.APPLIED_PREFIX) and skipped.startswith(fault_spec.SKIPPED_PREFIX)
    log = f"INFO noise\nWARNING 11-29 12:00:00 [faults.py:1] {applied}\n(EngineCore pid=1) {skipped}\n"
    lines = fault_spec.parse_fault_log(log)
    assert [(l.applied, l.request_id, l.block_ids, l.num_layers, l.reason) for l in lines] == [
        (True, "cmpl-abc-0", ((4, 6),), 2, ""),
        (False, "cmpl-def-0", (), 0, "group0:1-blocks"),
    ]
    assert all(line.kind == "swap-blocks" for line in lines)


# ---------------------------------------------------------------- faults: on the connector interface

@pytest.fixture
def no_listeners(monkeypatch):
    monkeypatch.setattr(interface, "_listeners", {event: [] for event in interface.EVENTS})


def make_connector(view, finished, failed=(), new_api=True):
    """A connector with only KVConnectorBase_V1's methods; ``finished`` / ``failed`` what its
    completion call reports (``get_transfer_results``, or the older ``get_finished``)."""
    class Connector:
        def __init__(self):
            self.view = view

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            return 8, True

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            pass

        def build_connector_meta(self, scheduler_output):
            return types.SimpleNamespace()

        def register_kv_caches(self, kv_caches):
            pass

        def bind_connector_metadata(self, metadata):
            pass

        def get_finished(self, finished_req_ids):
            return set(), set(finished)

    if new_api:
        def get_transfer_results(self, finished_req_ids):
            return types.SimpleNamespace(finished_sending=set(), finished_recving=set(finished),
                                         failed_recving=set(failed))
        Connector.get_transfer_results = get_transfer_results
    interface.patch_connector_class(Connector)
    return Connector()


def receive(connector, block_ids: dict) -> None:
    """The scheduler's and the worker's calls for requests whose KV is to arrive."""
    connector.register_kv_caches(connector.view.caches)
    for request_id, groups in block_ids.items():
        request = types.SimpleNamespace(request_id=request_id, kv_transfer_params={})
        connector.get_num_new_matched_tokens(request, 0)
        connector.update_state_after_alloc(request, types.SimpleNamespace(
            get_block_ids=lambda groups=groups: groups), 8)
    connector.bind_connector_metadata(connector.build_connector_meta(None))


def test_received_requests_are_corrupted_and_logged_one_line_each(caplog, monkeypatch,
                                                                  no_listeners):
    view = hybrid_worker()
    monkeypatch.setattr(interface, "build_view", lambda connector, caches: connector.view)
    interface.subscribe("registered", faults.on_registered)
    interface.subscribe("received", faults.make_on_received(FaultSpec("corrupt-block", "first")))
    connector = make_connector(view, finished={"ok", "bad"}, failed={"bad"})
    with caplog.at_level(logging.INFO, logger="vllm.pd_accuracy"):
        receive(connector, {"ok": ([1, 2], []), "bad": ([3, 4], []), "later": ([5], [])})
        connector.get_transfer_results(set())
    assert torch.count_nonzero(view.caches["attn.0"][1]) == 0
    assert torch.count_nonzero(view.caches["attn.0"][3]) > 0  # failed transfer: left alone
    assert torch.count_nonzero(view.caches["attn.0"][5]) > 0  # not received yet
    lines = fault_spec.parse_fault_log(caplog.text)
    assert [(l.applied, l.request_id, l.block_ids) for l in lines] == [(True, "ok", ((1,),))]
    assert fault_spec.SETUP_PREFIX in caplog.text and "shape=[8, 2, 4, 6]" in caplog.text


def test_a_broken_request_gives_a_skipped_line_and_the_connectors_result(caplog, monkeypatch,
                                                                         no_listeners):
    monkeypatch.setattr(interface, "build_view", lambda connector, caches: connector.view)
    interface.subscribe("received", faults.make_on_received(FaultSpec("corrupt-block")))
    connector = make_connector(hybrid_worker(), finished={"r"})
    receive(connector, {"r": ([99], [])})               # a block id past the cache
    with caplog.at_level(logging.WARNING, logger="vllm.pd_accuracy"):
        results = connector.get_transfer_results(set())
    assert results.finished_recving == {"r"}
    [line] = fault_spec.parse_fault_log(caplog.text)
    assert not line.applied and line.reason == "IndexError"


def test_faults_register_is_a_no_op_without_env_and_idempotent(monkeypatch, no_listeners):
    hooks = []
    import wrapt

    monkeypatch.setattr(interface, "_installed", False)
    monkeypatch.setattr(wrapt, "register_post_import_hook", lambda hook, name: hooks.append(name))
    monkeypatch.delenv(fault_spec.FAULT_ENV, raising=False)
    monkeypatch.setattr(faults.register, "done", False)
    faults.register()
    assert hooks == [] and not interface._listeners["received"]
    monkeypatch.setenv(fault_spec.FAULT_ENV, "swap-blocks")
    monkeypatch.setattr(faults.register, "done", False)
    faults.register()
    faults.register()
    assert hooks == [interface.FACTORY_MODULE] and len(interface._listeners["received"]) == 1
    monkeypatch.setenv(fault_spec.FAULT_ENV, "melt-gpu")
    monkeypatch.setattr(faults.register, "done", False)
    faults.register()  # a bad value is logged, never raised into vLLM
    assert hooks == [interface.FACTORY_MODULE]


# ---------------------------------------------------------------- faults: older vLLM shapes

def test_kv_first_layout_of_older_vllm_is_indexed_on_dim_1():
    # vLLM <= 0.26 FLASH_ATTN: [2, num_blocks, block_size, heads, head_dim]
    cache = torch.arange(2 * 5 * 4 * 2 * 3, dtype=torch.float32).view(2, 5, 4, 2, 3)
    before = cache.clone()
    assert faults.block_dim(cache, 5) == 1
    assert faults.block_dim(cpu_attn_cache(5), 5) == 0
    blocks = faults.blocks_view(cache, None, None, num_blocks=5)
    faults.swap_blocks(blocks, 1, 4)
    assert torch.equal(cache[:, 1], before[:, 4]) and torch.equal(cache[:, 4], before[:, 1])
    faults.corrupt_block(blocks, 2, "zero")
    assert torch.count_nonzero(cache[:, 2]) == 0 and torch.equal(cache[:, 0], before[:, 0])


def test_an_older_connector_with_flat_block_ids_and_get_finished_only(monkeypatch,
                                                                        no_listeners):
    caches = {"layer.0": cpu_attn_cache(6), "layer.1": cpu_attn_cache(6)}
    view = fake_view(caches, [FakeGroup(list(caches), None)])
    monkeypatch.setattr(interface, "build_view", lambda connector, caches: connector.view)
    interface.subscribe("received", faults.make_on_received(FaultSpec("corrupt-block", "last")))
    connector = make_connector(view, finished={"r"}, new_api=False)
    receive(connector, {"r": [2, 3, 4]})
    assert connector.get_finished(set()) == (set(), {"r"})
    for cache in caches.values():
        assert torch.count_nonzero(cache[4]) == 0 and torch.count_nonzero(cache[3]) > 0


def test_received_request_ids_from_both_completion_apis():
    new_api = types.SimpleNamespace(finished_recving={"a", "b"}, failed_recving={"b"})
    assert interface.received_request_ids(new_api) == {"a"}
    assert interface.received_request_ids(({"x"}, {"c"})) == {"c"}


def test_corrupt_on_groups_sharing_one_tensor_touches_each_groups_block():
    """vLLM's hybrid layout (measured with the Granite zoo model on CPU): each attention layer is
    its own KV-cache group, the groups share one tensor, and each group has its own block ids.
    Both groups' blocks must be zeroed (keying the de-duplication on storage alone zeroed one)."""
    shared = cpu_attn_cache(8)
    ssm_state = torch.ones(8, 16)
    view = fake_view({"attn.1": shared, "attn.2": shared, "mamba.0": ssm_state},
                     [FakeGroup(["attn.1"], FullAttentionSpec()),
                      FakeGroup(["attn.2"], FullAttentionSpec()),
                      FakeGroup(["mamba.0"], MambaSpec())])
    before = shared.clone()
    outcome = faults.apply_fault(view, [[2, 3], [6, 7], [1]],
                                 FaultSpec("corrupt-block", "first"))
    assert outcome == FaultOutcome(applied=True, block_ids=((2,), (6,)), num_layers=2)
    assert torch.count_nonzero(shared[2]) == 0 and torch.count_nonzero(shared[6]) == 0
    assert torch.equal(shared[3], before[3]) and torch.equal(shared[7], before[7])
    assert torch.equal(ssm_state, torch.ones(8, 16))
