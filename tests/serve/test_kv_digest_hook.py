"""The digest plugin's flow through the connector interface on a stand-in connector (numpy
caches, no vLLM): the prefill side hashes at the bind after request_finished, the decode side
when the connector reports its read complete, and harness.run.evidence.kv_digest_evidence joins both
through the proxy's records. Evidence that P/D works comes from the real cells (tests/suites);
this checks the plugin's own bookkeeping."""
from __future__ import annotations

import json
import types

import numpy as np
import pytest

from harness.judge.kv_digest_check import describe
from harness.run.evidence.kv_digest_evidence import digest_evidence
from harness.protocol.kv_digest import DIGEST_FILE_ENV, record_line
from harness.serve.plugins.kv_digest import hook as kv_digest_hook
from harness.serve.plugins.kv_digest.layout import layout_from_shape
from harness.serve.plugins.kv_events import interface
from harness.serve.plugins.kv_events.interface import KVView

HEADS, DIM, TOKENS = 2, 8, 100
LAYERS = ("layers.0.attn", "layers.1.attn")
PROXY_ID = "pdacc-" + "ab" * 16


class Meta:
    """Stands in for a connector's metadata: plain attributes, pickled with the step."""


def worker(block_size: int, num_blocks: int = 16, ratio: int = 1, seed: int = 0):
    rng = np.random.default_rng(seed)
    caches = {name: rng.standard_normal((num_blocks, HEADS, block_size, 2 * DIM)).astype(
        np.float32) for name in LAYERS}
    group = types.SimpleNamespace(layer_names=list(LAYERS), kv_cache_spec=None)
    return types.SimpleNamespace(block_size=block_size, ratio=ratio, tp_rank=0, caches=caches,
                                 groups=[group], host=None)


def view_of(w) -> KVView:
    return KVView(caches=w.caches, groups=w.groups, layer_specs={}, kernel_block_size=w.block_size,
                  blocks_per_logical=w.ratio, backend="FLASH_ATTN", tp_rank=w.tp_rank,
                  moved=w.host, draft_layers=getattr(w, "draft_layers", frozenset()))


def write_prompt(w, ids, logical_bs, kv):
    """Token t at kernel block ids[t // logical_bs] * ratio + ..., heads-first packed."""
    ratio = logical_bs // w.block_size
    for t in range(kv.shape[2]):
        block = ids[t // logical_bs] * ratio + (t % logical_bs) // w.block_size
        for name in LAYERS:
            w.caches[name][block, :, t % w.block_size] = np.concatenate(
                [kv[0, :, t], kv[1, :, t]], axis=-1)


def make_connector(w):
    class Connector:
        """Only KVConnectorBase_V1's methods, nothing of one connector's own."""

        def __init__(self):
            self.side = w

        def request_finished(self, request, block_ids):
            return True, {"remote_request_id": request.request_id}

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            return TOKENS - num_computed_tokens, True

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            pass

        def build_connector_meta(self, scheduler_output):
            return Meta()

        def register_kv_caches(self, kv_caches):
            pass

        def bind_connector_metadata(self, metadata):
            self.bound = metadata

        def get_finished(self, finished_req_ids):
            return set(), set(self.done)

    interface.patch_connector_class(Connector)
    connector = Connector()
    connector.register_kv_caches(w.caches)
    return connector


@pytest.fixture(autouse=True, params=["device", "blake2b"])
def hash_function(request, monkeypatch):
    """Every flow here runs with both hashes (PD_ACCURACY_KV_DIGEST_HASH)."""
    monkeypatch.setenv("PD_ACCURACY_KV_DIGEST_HASH", request.param)
    return request.param


@pytest.fixture(autouse=True)
def digest_listeners(monkeypatch):
    """The digest plugin's listeners, each side writing to its own file (one process here)."""
    monkeypatch.setattr(interface, "_listeners", {event: [] for event in interface.EVENTS})
    monkeypatch.setattr(interface, "build_view", lambda connector, caches: view_of(connector.side))
    interface.subscribe("sent", lambda c, v, s: kv_digest_hook.on_sent(str(c.side.path), c, v, s))
    interface.subscribe("arrived", kv_digest_hook.on_arrived)
    interface.subscribe("received",
                        lambda c, v, r: kv_digest_hook.on_received(str(c.side.path), c, v, r))


def blocks(groups):
    """Stands in for vLLM's KVCacheBlocks: the blocks allocated for what arrives."""
    return types.SimpleNamespace(get_unhashed_block_ids_all_groups=lambda: groups)


@pytest.fixture
def kv():
    return np.random.default_rng(7).standard_normal((2, HEADS, TOKENS, DIM)).astype(np.float32)


def run_pair(tmp_path, kv, *, p_bs=32, d_bs=64, d_ratio=1, tamper=None, cached=0,
             post_process=None, host=None, drafts=frozenset()):
    tmp_path.mkdir(parents=True, exist_ok=True)
    p, d = worker(p_bs, seed=1), worker(d_bs // d_ratio, ratio=d_ratio, seed=2)
    p.draft_layers = d.draft_layers = frozenset(drafts)
    p.path, d.path = tmp_path / "p.jsonl", tmp_path / "d.jsonl"
    p_ids, d_ids = [5, 2, 9, 0], [3, 1]
    write_prompt(p, p_ids, p_bs, kv)
    write_prompt(d, d_ids, d_bs, kv)
    if p_bs == d_bs and d_ratio == 1:   # a connector copies whole blocks, the unused tail too
        for name in LAYERS:
            d.caches[name][d_ids] = p.caches[name][p_ids[:len(d_ids)]]
    if host:        # NIXL moves the blocks through host buffers (a GPU's kv_buffer_device cpu)
        host(p, d)
    if tamper:
        tamper(d)
    prefill, decode = make_connector(p), make_connector(d)
    request = types.SimpleNamespace(request_id=f"cmpl-{PROXY_ID}-0-p", num_computed_tokens=TOKENS)
    prefill.request_finished(request, p_ids)
    prefill.bind_connector_metadata(prefill.build_connector_meta({}))
    d_request = types.SimpleNamespace(request_id=f"cmpl-{PROXY_ID}-0-d", kv_transfer_params={
        "remote_request_id": request.request_id})
    decode.get_num_new_matched_tokens(d_request, cached)
    decode.update_state_after_alloc(d_request, blocks((d_ids[cached // d_bs:],)), TOKENS - cached)
    decode.bind_connector_metadata(decode.build_connector_meta({}))
    decode.done = {d_request.request_id}
    interface.arrived(decode, decode.done, set(), lambda r: None)   # a connector's read poll
    if post_process:
        post_process(d)
    decode.get_finished(set())
    records = [{"request_id": PROXY_ID,
                "received_kv_transfer_params": {"remote_request_id": request.request_id}}]
    return digest_evidence(records, [str(p.path)], [str(d.path)], d_bs, "NIXL"), p.path, d.path


def test_same_kv_across_block_sizes_is_identical(tmp_path, kv):
    evidence, p_path, d_path = run_pair(tmp_path, kv, p_bs=32, d_bs=64)
    assert describe(evidence) == (True, "identical on 1/1 requests")
    line = json.loads(p_path.read_text())
    assert line["side"] == "prefill" and line["num_tokens"] == TOKENS and not line["error"]
    assert json.loads(d_path.read_text())["remote_request_id"] == line["request_id"]


def test_kernel_blocks_under_a_logical_block_are_read_in_order(tmp_path, kv):
    evidence, _, _ = run_pair(tmp_path, kv, p_bs=32, d_bs=64, d_ratio=2)   # D kernel 32 < 64
    assert describe(evidence)[0], describe(evidence)


def test_one_changed_value_is_found_at_its_layer_head_tokens_and_block(tmp_path, kv):
    def tamper(d):   # token 70 = decode block id 1 (position 1), offset 6; head 1, a V value
        d.caches[LAYERS[1]][1, 1, 70 - 64, DIM + 3] += 1e-6

    evidence, _, _ = run_pair(tmp_path, kv, tamper=tamper)
    passed, line = describe(evidence)
    assert not passed
    first = evidence["first_mismatch"]
    assert (first["layer"], first["kv"], first["head"]) == (LAYERS[1], "V", 1)
    assert first["token_range"] == [64, 96] and first["decode_block"] == 1
    assert first["differing_entries"] == 1
    assert "layer layers.1.attn V head 1 tokens 64-95 (decode block 1)" in line


def test_the_drafters_layers_are_named_in_the_lines_and_the_verdict(tmp_path, kv):
    """A server with a drafter of its own KV (an EAGLE head's layer after the target's) names
    it in each digest line: a clean pair says the draft's layers were compared, and a
    difference in one is told as the draft's."""
    evidence, p_path, d_path = run_pair(tmp_path, kv, drafts={LAYERS[1]})
    assert json.loads(p_path.read_text())["draft_layers"] == [LAYERS[1]]
    assert json.loads(d_path.read_text())["draft_layers"] == [LAYERS[1]]
    assert evidence["draft_layers"] == [LAYERS[1]]
    assert describe(evidence) == (
        True, "identical on 1/1 requests, the draft's layers among them (layers.1.attn)")

    def zero_draft(d):
        d.caches[LAYERS[1]][1] = 0

    evidence, _, _ = run_pair(tmp_path / "z", kv, tamper=zero_draft, drafts={LAYERS[1]})
    assert evidence["first_mismatch"]["draft"] is True
    assert "first at layer layers.1.attn (the draft's) K head 0" in describe(evidence)[1]
    # a target layer's difference is not the draft's, and a server without a drafter names none
    evidence, p_path, _ = run_pair(tmp_path / "t", kv, tamper=zero_draft)
    assert "draft" not in evidence["first_mismatch"] and "draft_layers" not in evidence
    assert "draft_layers" not in json.loads(p_path.read_text())
    assert "(the draft's)" not in describe(evidence)[1]


def test_where_the_corruption_entered_is_told_from_the_raw_bytes(tmp_path, kv):
    def scramble(d):   # e.g. a block-size re-layout gone wrong: tokens 0-1 of a block swapped
        for name in LAYERS:
            d.caches[name][3, :, [0, 1]] = d.caches[name][3, :, [1, 0]]

    evidence, _, _ = run_pair(tmp_path, kv, p_bs=64, post_process=scramble)
    assert evidence["raw_identical"] == 1 and evidence["first_mismatch"]["raw"] == {}
    assert "entered after the transfer: NIXL wrote the bytes exactly as sent" in describe(evidence)[1]

    evidence, _, _ = run_pair(tmp_path / "t", kv, p_bs=64, tamper=scramble)   # on arrival
    first = evidence["first_mismatch"]["raw"]
    assert evidence["raw_differing"] == 1 and first["layer"] == LAYERS[0]
    assert first["prefill_block"] == 0
    assert "entered in the transfer" in describe(evidence)[1]


def through_host_buffers(stale_tokens=None):
    """Host buffers on both sides; ``stale_tokens`` of the prefill's first block (id 5, 64
    tokens) missing from its device-to-host copy, so the connector sends and the decode receives
    them stale (vLLM 0.26 copies only a step's new blocks under chunked prefill)."""
    def setup(p, d):
        p.host = {name: c.copy() for name, c in p.caches.items()}
        if stale_tokens:
            for name in LAYERS:
                p.host[name][5, :, stale_tokens] = 0.0
                d.caches[name][3, :, stale_tokens] = 0.0      # received, synced
        d.host = {name: c.copy() for name, c in d.caches.items()}
    return setup


def test_through_host_buffers_intact_kv_is_identical(tmp_path, kv):
    evidence, p_path, _ = run_pair(tmp_path, kv, p_bs=64, host=through_host_buffers())
    assert describe(evidence) == (True, "identical on 1/1 requests")
    assert set(json.loads(p_path.read_text())["host_layers"]) == set(LAYERS)


def test_a_prefill_host_buffer_missing_tokens_is_named_before_the_transfer(tmp_path, kv):
    evidence, _, _ = run_pair(tmp_path, kv, p_bs=64,
                              host=through_host_buffers(stale_tokens=slice(40, 64)))
    passed, line = describe(evidence)
    assert not passed and evidence["host_copy_differing"] == 1
    assert evidence["first_mismatch"]["token_range"] == [32, 64]
    assert ("entered on the prefill, before the transfer: its host buffer (what NIXL sends) "
            "differs from its KV cache from layer layers.0.attn tokens 32-63 on") in line


def test_through_host_buffers_the_raw_bytes_are_the_buffers(tmp_path, kv):
    def unsynced(p, d):  # the connector wrote the decode's host buffer; its cache is not synced
        through_host_buffers()(p, d)
        for name in LAYERS:
            d.caches[name][[3, 1]] = 0.0

    def sync_then_break(d):   # the host-to-device sync, then a post-processing that breaks it
        for name in LAYERS:
            d.caches[name][[3, 1]] = d.host[name][[3, 1]]
            d.caches[name][3, :, [0, 1]] = d.caches[name][3, :, [1, 0]]

    evidence, _, _ = run_pair(tmp_path, kv, p_bs=64, host=unsynced,
                              post_process=sync_then_break)
    assert evidence["raw_identical"] == 1 and evidence["host_copy_differing"] == 0
    assert "entered after the transfer" in describe(evidence)[1]


def test_a_decode_prefix_hit_compares_the_received_tail_only(tmp_path, kv):
    def tamper(d):   # garbage where the local prefix cache would be: not received, not compared
        for name in LAYERS:
            d.caches[name][3] = 0
    evidence, _, d_path = run_pair(tmp_path, kv, tamper=tamper, cached=64)
    assert json.loads(d_path.read_text())["token_offset"] == 64
    assert describe(evidence) == (True, "identical on 1/1 requests")


def test_no_decode_digest_fails_the_check(tmp_path, kv):
    evidence, _, d_path = run_pair(tmp_path, kv)
    d_path.write_text("")
    records = [{"request_id": PROXY_ID, "received_kv_transfer_params": {
        "remote_request_id": json.loads((tmp_path / "p.jsonl").read_text())["request_id"]}}]
    evidence = digest_evidence(records, [str(tmp_path / "p.jsonl")], [str(d_path)], 64)
    passed, line = describe(evidence)
    assert not passed and "compared on 0/1 requests only" in line and "from decode on 1" in line


def test_a_line_names_its_hash_and_the_parts_of_its_cost(tmp_path, kv, hash_function):
    evidence, p_path, d_path = run_pair(tmp_path, kv)
    for path in (p_path, d_path):
        line = json.loads(path.read_text())
        assert line["hash"] == {"device": "fmix64-sum", "blake2b": "blake2b-64"}[hash_function]
        assert line["elapsed_s"] >= line["step_s"] > 0 and line["device_s"] == 0.0
    assert evidence["hash_functions"] == {line["hash"]: 2}
    assert set(evidence["cost_parts_s"]) == {"step_s", "device_s", "resolve_s"}


def test_sides_that_hashed_with_different_functions_are_not_compared(tmp_path, kv, monkeypatch,
                                                                     hash_function):
    other = "blake2b" if hash_function == "device" else "device"
    flip = lambda d: monkeypatch.setenv("PD_ACCURACY_KV_DIGEST_HASH", other)  # noqa: E731
    evidence, _, _ = run_pair(tmp_path, kv, post_process=flip)   # the decode hashes with other
    passed, line = describe(evidence)
    assert not passed and evidence["differing"] == 0 and evidence["not_digested"] == 1
    assert "compared on 0/1 requests only" in line and "set PD_ACCURACY_KV_DIGEST_HASH alike" in line


def test_patching_twice_wraps_once():
    class Connector:
        def build_connector_meta(self, scheduler_output):
            return Meta()

    interface.patch_connector_class(Connector)
    wrapped = Connector.build_connector_meta
    interface.patch_connector_class(Connector)
    assert Connector.build_connector_meta is wrapped


@pytest.mark.parametrize("shape, backend, expect", [
    ((10, 2, 64, 16), "FLASH_ATTN", ("content", True, 64, 128)),
    ((10, 64, 2, 16), "FLASH_ATTN", ("content", False, 64, 128)),
    ((10, 2, 32, 16), "CPU_ATTN", ("head_pages", True, 32, 128)),
    ((2, 10, 64, 2, 8), "FLASH_ATTN", ("stacked_outer", False, 64, 128)),
    ((10, 2, 2, 128, 8), "FLASHINFER", ("stacked_inner", True, 128, None)),
    ((1213, 128, 576), "TRITON_MLA", ("latent", True, 128, None)),   # vLLM 0.26 CUDA MLA
    ((1213, 64, 576), "FLASHMLA", ("latent", True, 64, 128)),
])
def test_layout_is_read_off_the_tensor_shape(shape, backend, expect):
    kernel = expect[2]
    layout = layout_from_shape(shape, backend, kernel, 128)
    assert (layout.kv_split, layout.heads_before_tokens, layout.block_size,
            layout.ids_block_size) == expect


def test_an_ambiguous_or_unknown_shape_is_refused():
    with pytest.raises(ValueError, match="cannot tell tokens from heads"):
        layout_from_shape((10, 64, 64, 16), "FLASH_ATTN", 64)
    with pytest.raises(ValueError, match="axis 1 is not a block size"):
        layout_from_shape((10, 48, 16), "FLASH_ATTN", 64)
    with pytest.raises(ValueError, match="no known paged KV layout"):
        layout_from_shape((2, 2, 10, 64, 16, 1), "FLASH_ATTN", 64)


def test_a_latent_cache_is_read_whole_in_token_order():
    """An MLA latent cache [B, N, L]: every byte of the request's blocks, tokens in order
    (a logical 128-token block id expands to its two 64-token kernel blocks)."""
    import numpy as np

    from harness.serve.plugins.kv_digest.layout import canonical_kv

    cache = np.arange(6 * 64 * 8, dtype=np.int16).reshape(6, 64, 8)
    layout = layout_from_shape(cache.shape, "FLASHMLA", 64, 128)
    kv = canonical_kv(cache, [1], 100, layout)        # logical block 1 = kernel blocks 2, 3
    assert kv.shape == (2, 1, 100, 4)
    tokens = np.concatenate([cache[2], cache[3]])[:100]
    assert (np.concatenate([kv[0, 0], kv[1, 0]], axis=-1) == tokens).all()


class MambaSpec:
    """Named like vLLM's: the plugin tells recurrent layers by their spec's class name."""


def test_a_recurrent_layers_state_is_hashed_and_a_changed_byte_named(tmp_path, kv):
    state = "layers.2.mixer"

    def hybrid(seed, slot):
        w = worker(64, seed=seed)
        w.groups.append(
            types.SimpleNamespace(layer_names=[state], kv_cache_spec=MambaSpec()))
        w.caches[state] = np.random.default_rng(seed).integers(
            -128, 127, (16, 1, 1, 40), dtype=np.int8)
        w.caches[state][slot] = np.arange(40, dtype=np.int8)   # the request's state
        return w

    p, d = hybrid(1, 7), hybrid(2, 3)
    write_prompt(p, [5, 2], 64, kv)
    write_prompt(d, [3, 1], 64, kv)
    lines = []
    for side, w, ids in (("prefill", p, [[5, 2], [7]]), ("decode", d, [[3, 1], [3]])):
        digests, skipped, _ = kv_digest_hook.digest_request(view_of(w), ids, 0, TOKENS)
        assert state in digests and not skipped
        lines.append(record_line(
            side, f"cmpl-{PROXY_ID}-{side}", remote_request_id="r", token_offset=0,
            num_tokens=TOKENS, layers=digests, skipped=skipped, elapsed_s=0.0))
    (tmp_path / "p.jsonl").write_text(lines[0].replace(f"cmpl-{PROXY_ID}-prefill", "r") + "\n")
    (tmp_path / "d.jsonl").write_text(lines[1] + "\n")
    records = [{"request_id": PROXY_ID, "received_kv_transfer_params": {"remote_request_id": "r"}}]
    files = ([str(tmp_path / "p.jsonl")], [str(tmp_path / "d.jsonl")])
    assert describe(digest_evidence(records, *files, 64)) == (True, "identical on 1/1 requests")

    line = json.loads(lines[1])
    line["states"][state] = kv_digest_hook.state_digest(
        np.where(np.arange(40) == 9, 0, np.arange(40)).astype(np.int8)[None, None, None], [0])
    (tmp_path / "d.jsonl").write_text(json.dumps(line) + "\n")
    evidence = digest_evidence(records, *files, 64)
    assert (evidence["first_mismatch"]["layer"], evidence["first_mismatch"]["kv"]) == (state, "state")
    assert "first at layer layers.2.mixer state" in describe(evidence)[1]


def test_a_tp2_decode_is_merged_across_its_ranks_before_it_is_compared(tmp_path, kv):
    full = worker(64, seed=1)
    write_prompt(full, [5, 2], 64, kv)
    lines = []
    digests, _, _ = kv_digest_hook.digest_request(view_of(full), [[5, 2]], 0, TOKENS)
    lines.append(("p.jsonl", record_line(
        "prefill", "r", remote_request_id=None, token_offset=0, num_tokens=TOKENS,
        layers=digests, skipped={}, elapsed_s=0.0)))
    for rank in (1, 0):                       # each decode rank holds one of the two KV heads
        part = worker(64, seed=rank + 3)
        part.tp_rank = rank
        for name in LAYERS:
            part.caches[name] = np.ascontiguousarray(
                full.caches[name][:, rank:rank + 1])
        digests, _, _ = kv_digest_hook.digest_request(view_of(part), [[5, 2]], 0, TOKENS)
        lines.append(("d.jsonl", record_line(
            "decode", f"cmpl-{PROXY_ID}-d", remote_request_id="r", token_offset=0,
            num_tokens=TOKENS, layers=digests, skipped={}, elapsed_s=0.0, tp_rank=rank)))
    for name, line in lines:
        with open(tmp_path / name, "a") as out:
            out.write(line + "\n")
    records = [{"request_id": PROXY_ID, "received_kv_transfer_params": {"remote_request_id": "r"}}]
    files = ([str(tmp_path / "p.jsonl")], [str(tmp_path / "d.jsonl")])
    assert describe(digest_evidence(records, *files, 64)) == (True, "identical on 1/1 requests")
    # rank 0's line missing: head 0 counts as differing (absent), never a crash
    (tmp_path / "d.jsonl").write_text(lines[1][1] + "\n")
    passed, line = describe(digest_evidence(records, *files, 64))
    assert not passed and "K head 0 tokens 0-31" in line


def test_a_connector_without_params_joins_the_prefill_the_proxy_sent_the_request_to(tmp_path, kv):
    """ExampleConnector: no params either way; the decode's prompt KV is compared with that of
    the prefill the proxy sent the same request to. A connector that owes params does not get
    this join: without them its prefill side is missing."""
    _, p_path, d_path = run_pair(tmp_path, kv, p_bs=64, d_bs=64)
    files = [str(p_path)], [str(d_path)]
    example = [{"request_id": PROXY_ID, "kv_connector": "example",
                "received_kv_transfer_params": None, "kv_transfer_handle": None}]
    assert describe(digest_evidence(example, *files, 64)) == (True, "identical on 1/1 requests")
    other = [{**example[0], "request_id": "pdacc-" + "cd" * 16}]   # another request: no join
    assert not describe(digest_evidence(other, *files, 64))[0]
    nixl = [{**example[0], "kv_connector": "nixl"}]
    passed, line = describe(digest_evidence(nixl, *files, 64))
    assert not passed and "compared on 0/1 requests only" in line


def test_a_server_with_an_unknown_hash_says_so_and_digests_nothing(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(DIGEST_FILE_ENV, str(tmp_path / "d.jsonl"))
    monkeypatch.setenv("PD_ACCURACY_KV_DIGEST_HASH", "md5")
    monkeypatch.setattr(kv_digest_hook.register, "done", False)
    before = {event: list(found) for event, found in interface._listeners.items()}
    with caplog.at_level("ERROR", logger="vllm.pd_accuracy.kv_digest"):
        kv_digest_hook.register()
    assert interface._listeners == before
    assert "register() failed; no digests" in caplog.text and "must be one of" in caplog.text


@pytest.mark.parametrize("hash_function", ["device"], indirect=True)   # blake2b: no thread
def test_lines_waiting_for_a_gpu_copy_are_written_off_the_step(tmp_path, kv, monkeypatch,
                                                               hash_function):
    """On a GPU the line is written by the digest's thread once the copy lands (here the copy
    is a CPU one, told to take the GPU's way); the judge reads the same lines."""
    from harness.serve.plugins.kv_digest.digest import DeviceHasher

    monkeypatch.setattr(DeviceHasher, "on_gpu", property(lambda self: True))
    submitted = []
    real_submit = kv_digest_hook._writer.submit
    monkeypatch.setattr(kv_digest_hook._writer, "submit",
                        lambda job: (submitted.append(job), real_submit(job)))
    _, p_path, d_path = run_pair(tmp_path, kv)
    kv_digest_hook._writer.drain()
    assert len(submitted) == 2
    records = [{"request_id": PROXY_ID, "received_kv_transfer_params": {
        "remote_request_id": json.loads(p_path.read_text())["request_id"]}}]
    evidence = digest_evidence(records, [str(p_path)], [str(d_path)], 64)
    assert describe(evidence) == (True, "identical on 1/1 requests")


@pytest.mark.parametrize("hash_function", ["device"], indirect=True)
def test_a_hash_that_fails_on_the_step_gives_a_line_saying_why(tmp_path, kv, monkeypatch,
                                                               hash_function):
    from harness.serve.plugins.kv_digest.digest import DeviceHasher

    def broken(self):
        raise RuntimeError("no device memory")

    monkeypatch.setattr(DeviceHasher, "start", broken)
    evidence, p_path, _ = run_pair(tmp_path, kv)
    line = json.loads(p_path.read_text())
    assert line["error"] == "RuntimeError: no device memory" and not line["layers"]
    assert not describe(evidence)[0] and evidence["not_digested"] == 1
