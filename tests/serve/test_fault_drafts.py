"""The canaries of speculative decoding, their pure parts: wrong-drafts replaces a tagged request's
draft tokens in the model runner's proposer output (lists from ngram, tensors from a draft
model); corrupt-draft-kv zeroes only the draft model's received KV layers."""
from __future__ import annotations

import dataclasses
import types

import pytest

import torch

from harness.protocol import faults as protocol
from harness.protocol.faults import FaultOutcome, FaultSpec
from harness.serve.plugins.faults import decode as faults
from harness.serve.plugins.faults import wrong_drafts
from tests.serve.test_plugins import FakeGroup, FullAttentionSpec, cpu_attn_cache, fake_view

TAGGED = "cmpl-pdacc-fault.wrong-drafts.first.zero.abc-0"
OTHER = "cmpl-pdacc-fault.corrupt-block.2.zero.abc-0"
CLEAN = "cmpl-plain-0"


def test_a_tagged_request_gets_other_tokens_and_the_rest_keep_theirs():
    wanted = wrong_drafts.wants_wrong_drafts(FaultSpec(protocol.BY_REQUEST))
    drafts = [[5, 6, 7], [5, 6, 7], [1, 2]]
    out, hit = wrong_drafts.corrupt_drafts(drafts, [CLEAN, TAGGED, OTHER], wanted, 100)
    assert hit == [TAGGED]
    assert out[0] == [5, 6, 7] and out[2] == [1, 2]
    assert out[1] == [55, 56, 57] and all(a != b for a, b in zip(out[1], drafts[1]))
    assert drafts[1] == [5, 6, 7]       # the proposer's own list is not written


def test_a_draft_models_tensor_is_copied_not_written_in_place():
    wanted = wrong_drafts.wants_wrong_drafts(FaultSpec(protocol.WRONG_DRAFTS))
    drafts = torch.tensor([[1, 2, 3], [98, 99, 0]])
    out, hit = wrong_drafts.corrupt_drafts(drafts, ["a", "b"], wanted, 100)
    assert hit == ["a", "b"]
    assert out.tolist() == [[51, 52, 53], [48, 49, 50]]
    assert drafts.tolist() == [[1, 2, 3], [98, 99, 0]]


def test_a_batch_wider_than_its_drafts_and_no_tagged_request_leave_them_alone():
    wanted = wrong_drafts.wants_wrong_drafts(FaultSpec(protocol.BY_REQUEST))
    drafts = [[4]]
    out, hit = wrong_drafts.corrupt_drafts(drafts, [CLEAN, TAGGED], wanted, 10)
    assert out is drafts and hit == []


def test_the_runner_is_wrapped_once_and_logs_one_line_a_request(caplog):
    class Runner:
        def __init__(self, req_ids):
            self.input_batch = types.SimpleNamespace(req_ids=req_ids)
            self.model_config = types.SimpleNamespace(get_vocab_size=lambda: 10)

        def propose_draft_token_ids(self, scheduler_output, sampled_token_ids):
            return [[1, 2] for _ in self.input_batch.req_ids]

    module = types.SimpleNamespace(GPUModelRunner=Runner)
    spec = FaultSpec(protocol.BY_REQUEST)
    assert wrong_drafts.patch_runner(module, spec) and wrong_drafts.patch_runner(module, spec)
    runner = Runner([CLEAN, TAGGED])
    with caplog.at_level("WARNING", logger="vllm.pd_accuracy.wrong_drafts"):
        assert runner.propose_draft_token_ids(None, None) == [[1, 2], [6, 7]]
        runner.propose_draft_token_ids(None, None)
    lines = protocol.parse_fault_log(caplog.text)
    assert [(line.kind, line.request_id, line.applied) for line in lines] == [
        (protocol.WRONG_DRAFTS, TAGGED, True)]


def test_runner_v2s_speculator_proposes_wrongly_for_the_tagged_request_only(caplog):
    """Model runner V2 (vLLM 0.33/0.34): the runner makes one speculator in __init__; its
    propose(input_batch, ...) returns a [requests, k] tensor, row i for input_batch.req_ids[i]."""
    class Speculator:
        def propose(self, input_batch, attn_metadata=None, dummy_run=False, **kwargs):
            return torch.tensor([[1, 2]] * len(input_batch.req_ids))

    class RunnerV2:
        def __init__(self, with_drafts=True):
            self.vocab_size = 10
            self.speculator = Speculator() if with_drafts else None

    module = types.SimpleNamespace(GPUModelRunner=RunnerV2)
    spec = FaultSpec(protocol.BY_REQUEST)
    assert wrong_drafts.patch_runner_v2(module, spec) and wrong_drafts.patch_runner_v2(module, spec)
    assert RunnerV2(with_drafts=False).speculator is None      # nothing to wrap, no error
    runner = RunnerV2()
    batch = types.SimpleNamespace(req_ids=[CLEAN, TAGGED])
    with caplog.at_level("WARNING", logger="vllm.pd_accuracy.wrong_drafts"):
        drafts = runner.speculator.propose(batch, {})
        runner.speculator.propose(input_batch=batch)
        dummy = runner.speculator.propose(input_batch=batch, dummy_run=True)
    assert drafts.tolist() == [[1, 2], [6, 7]]
    assert dummy.tolist() == [[1, 2], [1, 2]]                   # warm-up drafts left alone
    lines = protocol.parse_fault_log(caplog.text)
    assert [(line.kind, line.request_id, line.applied) for line in lines] == [
        (protocol.WRONG_DRAFTS, TAGGED, True)]
    assert "fault=wrong-drafts on Speculator.propose" in caplog.text


def test_a_speculator_that_fails_leaves_the_drafts_as_proposed(caplog):
    class Batch:
        @property
        def req_ids(self):
            raise RuntimeError("no ids")

    speculator = types.SimpleNamespace(propose=lambda input_batch, **kw: [[3]])
    wanted = wrong_drafts.wants_wrong_drafts(FaultSpec(protocol.WRONG_DRAFTS))
    assert wrong_drafts.wrap_speculator(speculator, wanted, 10, wrong_drafts._Lines())
    with caplog.at_level("WARNING", logger="vllm.pd_accuracy.wrong_drafts"):
        assert speculator.propose(Batch()) == [[3]]
    assert protocol.SKIPPED_PREFIX in caplog.text


def test_a_runner_without_the_proposer_method_is_not_patched():
    assert not wrong_drafts.patch_runner(types.SimpleNamespace(GPUModelRunner=object),
                                         FaultSpec(protocol.WRONG_DRAFTS))


def test_the_wrong_token_is_never_the_draft():
    assert all(protocol.wrong_draft_token(t, 7) != t for t in range(7))
    assert all(protocol.wrong_draft_token(t, 32000) != t for t in range(0, 32000, 97))


def test_the_tag_of_wrong_drafts_round_trips():
    tag = protocol.request_tag_for(protocol.WRONG_DRAFTS)
    assert protocol.parse_request_fault(f"cmpl-pdacc-{tag}x-0").kind == protocol.WRONG_DRAFTS
    assert protocol.parse_fault_env({protocol.FAULT_ENV: "corrupt-draft-kv"}).block == "all"


def test_corrupt_draft_kv_zeroes_the_draft_layers_only():
    caches = {"model.layers.0.self_attn.attn": cpu_attn_cache(8),
              "draft_model.model.layers.0.self_attn.attn": cpu_attn_cache(8),
              "draft_model.model.layers.1.self_attn.attn": cpu_attn_cache(8)}
    view = fake_view(caches, [FakeGroup(list(caches), FullAttentionSpec())])
    before = {name: cache.clone() for name, cache in caches.items()}
    outcome = faults.apply_fault(view, [[2, 5]], FaultSpec(protocol.DRAFT_KV, "all"))
    assert outcome == FaultOutcome(applied=True, block_ids=((2, 5),), num_layers=2)
    assert torch.equal(caches["model.layers.0.self_attn.attn"],
                       before["model.layers.0.self_attn.attn"])
    for name in list(caches)[1:]:
        assert torch.count_nonzero(caches[name][2]) == 0 and torch.count_nonzero(caches[name][5]) == 0
        assert torch.equal(caches[name][3], before[name][3])


def test_corrupt_draft_kv_zeroes_an_eagle_heads_layer_named_after_the_targets():
    """An EAGLE head's layer continues the target's numbering (model.layers.4 after 0-3): the
    view names it the drafter's, and only it is zeroed."""
    caches = {f"model.layers.{i}.self_attn.attn": cpu_attn_cache(8) for i in range(5)}
    drafts = protocol.draft_layer_names(caches, "eagle", 4)
    assert drafts == {"model.layers.4.self_attn.attn"}
    view = dataclasses.replace(
        fake_view(caches, [FakeGroup(list(caches), FullAttentionSpec())]), draft_layers=drafts)
    before = {name: cache.clone() for name, cache in caches.items()}
    outcome = faults.apply_fault(view, [[2, 5]], FaultSpec(protocol.DRAFT_KV, "all"))
    assert outcome == FaultOutcome(applied=True, block_ids=((2, 5),), num_layers=1)
    for i in range(4):
        name = f"model.layers.{i}.self_attn.attn"
        assert torch.equal(caches[name], before[name])
    assert torch.count_nonzero(caches["model.layers.4.self_attn.attn"][2]) == 0
    # the same names without the view's drafter: nothing is the draft's
    view = fake_view(caches, [FakeGroup(list(caches), FullAttentionSpec())])
    outcome = faults.apply_fault(view, [[2, 5]], FaultSpec(protocol.DRAFT_KV, "all"))
    assert not outcome.applied and outcome.reason == "no-draft-layers"


def test_which_layers_are_the_drafters():
    names = [f"model.layers.{i}.self_attn.attn" for i in range(5)]
    draft_model = ["draft_model.model.layers.0.self_attn.attn"]
    assert protocol.draft_layer_names(names + draft_model, "draft_model", 4) == set(draft_model)
    assert protocol.draft_layer_names(names, "eagle", 4) == {names[4]}
    assert protocol.draft_layer_names(names, "mtp", 3) == set(names[3:])
    assert protocol.draft_layer_names(names, "ngram", 4) == set()
    assert protocol.draft_layer_names(names, None, None) == set()
    assert protocol.draft_layer_names(names, "eagle", None) == set()   # target count unknown
    # Qwen3-Next's MTP head numbers its own layers under mtp.* (vLLM 0.32's Qwen3NextMTP)
    hybrid = ["model.layers.1.self_attn.attn", "model.layers.2.self_attn.attn",
              "model.layers.0.linear_attn", "mtp.layers.0.self_attn.attn"]
    assert protocol.draft_layer_names(hybrid, "mtp", 3) == {"mtp.layers.0.self_attn.attn"}
    assert protocol.draft_layer_names(hybrid, "mtp", None) == {"mtp.layers.0.self_attn.attn"}
    assert protocol.draft_layer_names(hybrid, "eagle", 3) == set()
    assert protocol.draft_layer_names(hybrid, None, None) == set()


def test_corrupt_draft_kv_without_a_draft_breaks_nothing_and_says_why():
    caches = {"model.layers.0.self_attn.attn": cpu_attn_cache(8)}
    view = fake_view(caches, [FakeGroup(list(caches), FullAttentionSpec())])
    before = caches["model.layers.0.self_attn.attn"].clone()
    outcome = faults.apply_fault(view, [[1]], FaultSpec(protocol.DRAFT_KV, "all"))
    assert not outcome.applied and outcome.reason == "no-draft-layers"
    assert torch.equal(caches["model.layers.0.self_attn.attn"], before)
