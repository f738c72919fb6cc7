"""Unit tests of the vLLM plugins' pure parts (no servers, no real NIXL agent)."""
from __future__ import annotations

import logging
import types
from dataclasses import dataclass, field

import pytest
import torch

from harness.serve.plugins.faults import spec as fault_spec

from harness.serve.plugins.faults import decode as faults

from harness.serve.connectors import nixl_idle
from harness.serve.plugins.faults.spec import FaultOutcome, FaultSpec


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
    monkeypatch.setattr(nixl_idle, "_registered", False)
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
        monkeypatch.setattr(nixl_idle, "_registered", False)
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


@dataclass
class FakeWorker:
    device_kv_caches: dict
    groups: list
    _layer_specs: dict = field(default_factory=dict)
    _physical_blocks_per_logical_kv_block: int = 1

    @property
    def kv_cache_config(self):
        return types.SimpleNamespace(transfer_groups=self.groups)


@dataclass
class FakeMeta:
    local_physical_block_ids: list[list[int]]
    local_block_ids: list[list[int]] = field(default_factory=list)


def hybrid_worker():
    ssm_state = torch.arange(8 * 16, dtype=torch.float32).view(8, 16)
    caches = {"attn.0": cpu_attn_cache(8), "attn.1": cpu_attn_cache(8), "mamba.0": ssm_state}
    groups = [FakeGroup(["attn.0", "attn.1"], FullAttentionSpec()), FakeGroup(["mamba.0"], MambaSpec())]
    specs = {"attn.0": FullAttentionSpec(), "attn.1": FullAttentionSpec(), "mamba.0": MambaSpec()}
    return FakeWorker(caches, groups, specs)


def test_apply_corrupt_touches_attention_layers_and_never_ssm_state():
    worker = hybrid_worker()
    before = {name: cache.clone() for name, cache in worker.device_kv_caches.items()}
    outcome = faults.apply_fault(worker, FakeMeta([[5, 2, 7], [3]]), FaultSpec("corrupt-block", "last"))
    assert outcome == FaultOutcome(applied=True, block_ids=((7,),), num_layers=2)
    for name in ("attn.0", "attn.1"):
        assert torch.count_nonzero(worker.device_kv_caches[name][7]) == 0
        assert torch.equal(worker.device_kv_caches[name][5], before[name][5])
    assert torch.equal(worker.device_kv_caches["mamba.0"], before["mamba.0"])


def test_apply_swap_on_aliased_layers_swaps_once():
    shared = cpu_attn_cache(8)
    before = shared.clone()
    worker = FakeWorker({"a": shared, "b": shared}, [FakeGroup(["a", "b"], FullAttentionSpec())])
    outcome = faults.apply_fault(worker, FakeMeta([[4, 6]]), FaultSpec("swap-blocks", "first"))
    assert outcome.applied and outcome.block_ids == ((4, 6),) and outcome.num_layers == 1
    assert torch.equal(shared[4], before[6]) and torch.equal(shared[6], before[4])


def test_apply_swap_on_a_single_block_request_is_not_applied():
    worker = hybrid_worker()
    before = worker.device_kv_caches["attn.0"].clone()
    outcome = faults.apply_fault(worker, FakeMeta([[3], []]), FaultSpec("swap-blocks"))
    assert not outcome.applied and "1-blocks" in outcome.reason
    assert torch.equal(worker.device_kv_caches["attn.0"], before)


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


# ---------------------------------------------------------------- faults: the patched worker

def make_worker_module():
    module = types.ModuleType(faults.WORKER_MODULE)

    class NixlBaseConnectorWorker:
        def __init__(self, worker):
            self.inner = worker
            self._recving_metadata = {}
            self.finished = set()
            self.failed = set()
            self.registered = None

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def register_kv_caches(self, kv_caches):
            self.registered = kv_caches

        def get_transfer_results(self):
            done = set(self.finished)
            for request_id in done:
                self._recving_metadata.pop(request_id)  # as vLLM does
            return types.SimpleNamespace(finished_sending=set(), finished_recving=done,
                                         failed_recving=set(self.failed))

    module.NixlBaseConnectorWorker = NixlBaseConnectorWorker
    return module


def test_patched_worker_corrupts_received_requests_and_logs_one_line_each(caplog):
    module = make_worker_module()
    spec = FaultSpec("corrupt-block", "first")
    faults._make_hook(spec)(module)
    faults._make_hook(spec)(module)  # idempotent: a second hook call does not wrap again
    worker = module.NixlBaseConnectorWorker(hybrid_worker())
    worker._recving_metadata = {"ok": FakeMeta([[1, 2], []]), "bad": FakeMeta([[3, 4], []]),
                                "later": FakeMeta([[5], []])}
    worker.finished, worker.failed = {"ok", "bad"}, {"bad"}
    with caplog.at_level(logging.INFO, logger="vllm.pd_accuracy"):
        worker.register_kv_caches(worker.device_kv_caches)
        results = worker.get_transfer_results()
    assert results.finished_recving == {"ok", "bad"}
    caches = worker.device_kv_caches
    assert torch.count_nonzero(caches["attn.0"][1]) == 0
    assert torch.count_nonzero(caches["attn.0"][3]) > 0  # failed transfer: left alone
    assert torch.count_nonzero(caches["attn.0"][5]) > 0  # not received yet
    lines = fault_spec.parse_fault_log(caplog.text)
    assert [(l.applied, l.request_id, l.block_ids) for l in lines] == [(True, "ok", ((1,),))]
    assert fault_spec.SETUP_PREFIX in caplog.text and "shape=[8, 2, 4, 6]" in caplog.text


def test_patched_worker_survives_a_broken_request(caplog):
    module = make_worker_module()
    faults._make_hook(FaultSpec("corrupt-block"))(module)
    worker = module.NixlBaseConnectorWorker(hybrid_worker())
    worker._recving_metadata = {"r": FakeMeta([[99], []])}  # a block id past the cache
    worker.finished = {"r"}
    with caplog.at_level(logging.WARNING, logger="vllm.pd_accuracy"):
        results = worker.get_transfer_results()
    assert results.finished_recving == {"r"}
    [line] = fault_spec.parse_fault_log(caplog.text)
    assert not line.applied and line.reason == "IndexError"


def test_faults_register_is_a_no_op_without_env_and_idempotent(monkeypatch):
    hooks = []
    import wrapt

    monkeypatch.setattr(wrapt, "register_post_import_hook", lambda hook, name: hooks.append(name))
    monkeypatch.delenv(fault_spec.FAULT_ENV, raising=False)
    monkeypatch.setattr(faults, "_registered", False)
    faults.register()
    assert hooks == []
    monkeypatch.setenv(fault_spec.FAULT_ENV, "swap-blocks")
    monkeypatch.setattr(faults, "_registered", False)
    faults.register()
    faults.register()
    targets = [module for module, _ in faults.WORKER_TARGETS]
    assert hooks == targets
    monkeypatch.setenv(fault_spec.FAULT_ENV, "melt-gpu")
    monkeypatch.setattr(faults, "_registered", False)
    faults.register()  # a bad value is logged, never raised into vLLM
    assert hooks == targets


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


def test_pre_hma_worker_with_flat_block_ids_and_get_finished():
    module = types.ModuleType("old_nixl_connector")
    caches = {"layer.0": cpu_attn_cache(6), "layer.1": cpu_attn_cache(6)}

    class NixlConnectorWorker:
        def __init__(self):
            self.device_kv_caches = caches
            self.num_blocks = 6
            self._recving_metadata = {"r": types.SimpleNamespace(local_block_ids=[2, 3, 4])}

        def get_finished(self):
            self._recving_metadata.pop("r")
            return set(), {"r"}

    module.NixlConnectorWorker = NixlConnectorWorker
    faults._make_hook(FaultSpec("corrupt-block", "last"), "NixlConnectorWorker")(module)
    assert NixlConnectorWorker().get_finished() == (set(), {"r"})
    for cache in caches.values():
        assert torch.count_nonzero(cache[4]) == 0 and torch.count_nonzero(cache[3]) > 0


def test_received_request_ids_from_both_completion_apis():
    new_api = types.SimpleNamespace(finished_recving={"a", "b"}, failed_recving={"b"})
    assert faults.received_request_ids(new_api) == {"a"}
    assert faults.received_request_ids(({"x"}, {"c"})) == {"c"}


def test_corrupt_on_groups_sharing_one_tensor_touches_each_groups_block():
    """vLLM's hybrid layout (measured with the Granite zoo model on CPU): each attention layer is
    its own KV-cache group, the groups share one tensor, and each group has its own block ids.
    Both groups' blocks must be zeroed (keying the de-duplication on storage alone zeroed one)."""
    shared = cpu_attn_cache(8)
    ssm_state = torch.ones(8, 16)
    worker = FakeWorker({"attn.1": shared, "attn.2": shared, "mamba.0": ssm_state},
                        [FakeGroup(["attn.1"], FullAttentionSpec()),
                         FakeGroup(["attn.2"], FullAttentionSpec()),
                         FakeGroup(["mamba.0"], MambaSpec())])
    before = shared.clone()
    outcome = faults.apply_fault(worker, FakeMeta([[2, 3], [6, 7], [1]]),
                                 FaultSpec("corrupt-block", "first"))
    assert outcome == FaultOutcome(applied=True, block_ids=((2,), (6,)), num_layers=2)
    assert torch.count_nonzero(shared[2]) == 0 and torch.count_nonzero(shared[6]) == 0
    assert torch.equal(shared[3], before[3]) and torch.equal(shared[7], before[7])
    assert torch.equal(ssm_state, torch.ones(8, 16))
