"""The engine-setting axes (async scheduling, speculative decoding, prefix reuse, chunked prefill,
CUDA-graph mode, decode KV layout): YAML forms and their one-line errors, expansion, selectors,
the messages of their rules, and where the shipped profiles run them."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from harness.core.catalog import ModelCatalog, ModelInfo
from harness.core.cell import Cell
from harness.core.platform import PlatformInfo
from harness.matrix import MatrixError, expand, load_matrix
from harness.matrix.rules import RULES, check_cell

CPU = PlatformInfo()
GPU2 = PlatformInfo.from_spec("cuda:2")
CATALOG = ModelCatalog({
    "dense": ModelInfo("dense", kind="dense"),
    "gdn": ModelInfo("gdn", kind="hybrid", ssm="gdn", family="qwen3next"),
})
DS = (("VLLM_SSM_CONV_STATE_LAYOUT", "DS"),)
ENGINE_TOKENS = re.compile(r"-(async_|spec_|prefix_reuse|chunk\d|cg_|dlayout_)")
ENGINE_RULES = {r.name for r in RULES} & {
    "async-scheduling-not-on-cpu", "async-scheduling-spec-decode", "cudagraph-mode-cuda-only",
    "cudagraph-mode-needs-compile", "cudagraph-full-downgraded", "kv-layout-cuda-only",
    "kv-layout-nhd-not-hybrid", "draft-model-zoo-target"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    return path


# ---- YAML forms -----------------------------------------------------------------------------

def test_engine_axes_expand_into_cells(tmp_path):
    spec = load_matrix(write(tmp_path, """
        models: {d: {kind: dense}}
        profiles:
          p:
            defaults: {device: cuda, kv_buffer_device: cuda, backend: TRITON_ATTN}
            grids:
              - model: d
                async_scheduling: [default, "on", "off"]
                spec_decode: [null, ngram]
              - {model: d, prefix_reuse: [false, true], chunked_prefill: [null, 64]}
              - {model: d, cudagraph_mode: [FULL, PIECEWISE, NONE]}
              - {model: d, kv_layout: [HND, NHD]}
    """))
    e = expand(spec, "p", GPU2)
    ids = set(e.by_id())
    assert "v1-TRITON_ATTN-p128d128-d-tp1x1" in ids            # all defaults: the plain cell, once
    assert {"v1-TRITON_ATTN-p128d128-d-tp1x1-async_off-spec_ngram",
            "v1-TRITON_ATTN-p128d128-d-tp1x1-prefix_reuse-chunk64",
            "v1-TRITON_ATTN-p128d128-d-tp1x1-cg_FULL",
            "v1-TRITON_ATTN-p128d128-d-tp1x1-dlayout_NHD"} <= ids
    assert [x.rule for x in e.excluded] == ["async-scheduling-spec-decode"]   # on + ngram
    assert len(e.cells) == 1 + 4 + 3 + 3 + 2
    cell = e.by_id()["v1-TRITON_ATTN-p128d128-d-tp1x1-prefix_reuse-chunk64"]
    assert cell.prefix_reuse is True and cell.chunked_prefill == 64


def test_selectors_match_engine_fields(tmp_path):
    spec = load_matrix(write(tmp_path, """
        models: {d: {kind: dense}}
        profiles:
          p:
            defaults: {device: cpu, backend: CPU_ATTN}
            grids: [{model: d, prefix_reuse: [false, true], chunked_prefill: [null, 64]}]
            expected_failures:
              - {match: {chunked_prefill: 64, prefix_reuse: true}, reason: both at once}
            exclude:
              - {match: {prefix_reuse: false, chunked_prefill: null}, reason: the plain cell runs elsewhere}
    """))
    e = expand(spec, "p", CPU)
    xfail = {c.cell_id: c.expected_failure for c in e.cells}
    assert xfail == {"v1-CPU_ATTN-p128d128-d-tp1x1-prefix_reuse": None,
                     "v1-CPU_ATTN-p128d128-d-tp1x1-chunk64": None,
                     "v1-CPU_ATTN-p128d128-d-tp1x1-prefix_reuse-chunk64": "both at once"}
    assert [x.reason for x in e.excluded] == ["the plain cell runs elsewhere"]


@pytest.mark.parametrize("axes,message", [
    ("async_scheduling: [default, on]",
     "m.yaml: profiles.p.grids[0].async_scheduling[1]: True is not a string: write \"on\" and \"off\" "
     "in quotes (YAML reads bare on/off as true/false)"),
    ("async_scheduling: off",
     "m.yaml: profiles.p.grids[0].async_scheduling: False is not a string: write \"on\" and \"off\" "
     "in quotes (YAML reads bare on/off as true/false)"),
    ("prefix_reuse: yes-please", "m.yaml: profiles.p.grids[0].prefix_reuse: 'yes-please' is not true or false"),
    ("chunked_prefill: [64, 64.5]",
     "m.yaml: profiles.p.grids[0].chunked_prefill[1]: 64.5 is neither an integer nor null"),
    ("chunked_prefill: []", "m.yaml: profiles.p.grids[0].chunked_prefill: empty list gives no cells"),
    ("cudagraph_mode: [FULL, 2]", "m.yaml: profiles.p.grids[0].cudagraph_mode[1]: 2 is not a string"),
    ("spec_decode: [null, 3]", "m.yaml: profiles.p.grids[0].spec_decode[1]: 3 is not a string or null"),
])
def test_engine_axis_schema_errors_are_one_line(tmp_path, axes, message):
    path = write(tmp_path, f"profiles:\n  p:\n    grids:\n      - model: d\n        {axes}\n")
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert str(info.value) == message


def test_a_bare_on_in_a_selector_is_a_one_line_error(tmp_path):
    path = write(tmp_path, "profiles: {p: {exclude: [{match: {async_scheduling: on}, reason: r}]}}")
    with pytest.raises(MatrixError, match=r"^m\.yaml: profiles\.p\.exclude\[0\]\.match\.async_scheduling: "
                                          r"True is not a string: write \"on\""):
        load_matrix(path)


# ---- rule messages: what vLLM does, and the fix -----------------------------------------------

def _problem(cell: Cell, rule: str, platform=GPU2):
    return next(p for p in check_cell(cell, platform, CATALOG) if p.rule == rule)


def gpu(**kw) -> Cell:
    return Cell(**{"model": "dense", "device": "cuda", "kv_buffer_device": "cuda",
                   "backend": "FLASH_ATTN", **kw})


def test_exclusions_name_the_vllm_code_and_the_fix():
    cpu_async = _problem(Cell(model="dense", async_scheduling="on"), "async-scheduling-not-on-cpu", CPU)
    assert "vllm/platforms/cpu.py" in cpu_async.message and "use device cuda" in cpu_async.message
    full = _problem(gpu(backend="FLASHINFER", cudagraph_mode="FULL"), "cudagraph-full-downgraded")
    assert "FULL_AND_PIECEWISE" in full.message and "use PIECEWISE or NONE" in full.message
    gdn = _problem(gpu(model="gdn", extra_env=DS, cudagraph_mode="FULL"), "cudagraph-full-downgraded")
    assert "the gdn layers of gdn" in gdn.message
    eager = _problem(gpu(compile="eager", cudagraph_mode="PIECEWISE"), "cudagraph-mode-needs-compile")
    assert "use compile default" in eager.message
    nhd = _problem(gpu(model="gdn", extra_env=DS, kv_layout="NHD"), "kv-layout-nhd-not-hybrid")
    assert "HMA does not support" in nhd.message
    layout = _problem(Cell(model="dense", kv_layout="NHD"), "kv-layout-cuda-only", CPU)
    assert "LBHNC" in layout.message
    chunk = _problem(Cell(model="dense", chunked_prefill=2048), "chunked-prefill-budget", CPU)
    assert "splits no prompt" in chunk.message
    spec = _problem(gpu(async_scheduling="on", spec_decode="ngram"), "async-scheduling-spec-decode")
    assert "async_scheduling default with spec_decode ngram" in spec.message


def test_a_cpu_cell_is_told_the_cpu_reason_first():
    """On CPU the CUDA-graph mode fails for the CPU, whatever the compile mode says."""
    cell = Cell(model="dense", compile="eager", cudagraph_mode="FULL")
    excluding = [p.rule for p in check_cell(cell, CPU, CATALOG) if p.kind == "invalid"]
    assert excluding[0] == "cudagraph-mode-cuda-only"


def test_engine_settings_a_cpu_runs_are_clean():
    for cell in (Cell(model="dense", spec_decode="ngram"), Cell(model="dense", chunked_prefill=64),
                 Cell(model="gdn", extra_env=DS, chunked_prefill=64)):
        assert check_cell(cell, CPU, CATALOG) == []
    notes = check_cell(Cell(model="gdn", extra_env=DS, prefix_reuse=True), CPU, CATALOG)
    assert [(p.kind, p.rule) for p in notes] == [("note", "prefix-reuse-evidence")]
    assert 'source=local_cache_hit' in notes[0].message


def test_a_draft_on_the_decode_only_expects_the_measured_refusal():
    """The reason of the CPU run of 2026-12-03 (results/reference/cpu-draft-20261203): all
    50 requests HTTP 500, the decode's handshake asserting on the prefill's fewer KV layers."""
    from harness.connectors.facts import KV_LAYERS_MIX
    from harness.connectors.nixl import NIXL_REFUSALS
    DRAFT_LAYERS_REFUSAL = NIXL_REFUSALS[KV_LAYERS_MIX].fails_with

    cell = Cell(model="tiny-llama-gsm", spec_decode="draft_p0_d3")
    problems = check_cell(cell, CPU, CATALOG)
    assert [(p.kind, p.rule) for p in problems] == [("xfail", "draft-model-decode-only")]
    measured = ("P/D evaluation failed: RequestsFailed: requests failed on 50 of 50 questions: "
                "HTTP 500 Internal Server Error x50; decode-0 (running): (Worker pid=23168) ERROR "
                "12-03 19:54:21 [base_worker.py:1354] AssertionError: Number of KV layers must "
                "match between prefill and decode")
    assert re.search(DRAFT_LAYERS_REFUSAL, measured)
    assert not re.search(DRAFT_LAYERS_REFUSAL, measured.replace("Number of KV layers", "NIXL_ERR"))


def test_an_eagle_head_on_the_decode_only_expects_the_measured_refusal():
    """The reason of the CPU run of 2026-12-07 (results/reference/cpu-eagle-20261207): all 50
    requests HTTP 500, the decode's handshake refusing the prefill on NIXL's compatibility hash
    (vLLM hashes an EAGLE head into it); a draft model's refusal pattern does not take it."""
    import json

    from harness.connectors.facts import KV_HEAD_MIX, KV_LAYERS_MIX
    from harness.connectors.nixl import NIXL_REFUSALS

    cell = Cell(model="tiny-llama-gsm", compile="eager", spec_decode="eagle_p0_d3")
    problems = check_cell(cell, CPU, CATALOG)
    assert [(p.kind, p.rule) for p in problems] == [("xfail", "eagle-decode-only")]
    record = json.loads((Path(__file__).resolve().parents[2] / "results/reference/"
                         "cpu-eagle-20261207/20261207T220052Z-75dc35/"
                         f"{cell.cell_id}.json").read_text())
    measured = record["verdict"]["reason"]
    assert re.search(NIXL_REFUSALS[KV_HEAD_MIX].fails_with, measured)
    assert not re.search(NIXL_REFUSALS[KV_LAYERS_MIX].fails_with, measured)


def test_a_draft_model_needs_a_zoo_target_and_says_where_it_runs():
    """Both ways: a zoo target is valid (with the note on P 1 / D 3), a hub model is not."""
    zoo = check_cell(Cell(model="tiny-llama-gsm", spec_decode="draft_p1_d3"), CPU, CATALOG)
    assert [(p.kind, p.rule) for p in zoo] == [("note", "draft-model-on-both-sides")]
    assert "1 speculative token" in zoo[0].message and "with 3" in zoo[0].message
    hub = _problem(gpu(model="dense", spec_decode="draft_p1_d3"), "draft-model-zoo-target")
    assert hub.kind == "invalid" and "use a zoo model, or ngram" in hub.message
    eagle = check_cell(Cell(model="tiny-llama-gsm", spec_decode="eagle_p1_d3"), CPU, CATALOG)
    assert [(p.kind, p.rule) for p in eagle] == [("note", "draft-model-on-both-sides")]
    other = _problem(gpu(model="tiny-llama-swa-gsm", spec_decode="eagle_p1_d3"),
                     "eagle-head-target")
    assert other.kind == "invalid" and "use tiny-llama-gsm" in other.message
    assert not [p for p in check_cell(gpu(spec_decode="ngram"), GPU2, CATALOG)
                if p.rule.startswith("draft-model")]


# ---- the shipped profiles -------------------------------------------------------------------

MTP = "v1-CPU_ATTN-p128d128-tiny-qwen3next-hybrid-gsm-mtp-tp1x1-eager-spec_mtp_p3_d3"
MTP_P1 = "v1-CPU_ATTN-p128d128-tiny-qwen3next-hybrid-gsm-mtp-tp1x1-eager-spec_mtp_p1_d3-x62f261"


def engine_cells(cells) -> set[str]:
    return {c.cell_id for c in cells if ENGINE_TOKENS.search(c.cell_id)}


def test_smoke_has_no_engine_setting_cells():
    assert not engine_cells(expand(load_matrix(), "smoke", CPU).cells)


def test_cpu_full_runs_the_cpu_engine_settings_and_says_why_not_the_others():
    e = expand(load_matrix(), "cpu-full", CPU)
    assert engine_cells(e.cells) == {
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_ngram",
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-prefix_reuse",
        "v1-CPU_ATTN-p128d128-tiny-qwen3next-hybrid-gsm-tp1x1-eager-prefix_reuse-xa3ac39",
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-chunk64",
        "v1-CPU_ATTN-p128d128-tiny-qwen3next-hybrid-gsm-tp1x1-eager-chunk64-xa3ac39",
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_draft_p1_d3",
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_draft_p1_d3-fault-corrupt-block-2",
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_draft_p0_d3",
        # the canaries of speculative decoding (judged on spec-acceptance and kv-digest)
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_ngram-fault-wrong-drafts",
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_draft_p1_d3-fault-wrong-drafts",
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_draft_p1_d3-fault-corrupt-draft-kv",
        # the zoo's EAGLE head on both sides, and the same two canaries
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_eagle_p1_d3",
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_eagle_p0_d3",
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_eagle_p1_d3-fault-wrong-drafts",
        "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_eagle_p1_d3-fault-corrupt-draft-kv",
        # the zoo's MTP head (in the hybrid's own checkpoint), prefix caching off: P 3 / D 3 and
        # the same two canaries, P 1 / D 3 (an expected failure: the GDN state)
        MTP_P1,
        # two canaries
        f"{MTP}-x62f261",
        f"{MTP}-x62f261-fault-wrong-drafts",
        f"{MTP}-x62f261-fault-corrupt-draft-kv",
    }
    xfail = {c.cell_id for c in e.cells if ENGINE_TOKENS.search(c.cell_id) and c.expected_failure}
    assert xfail == {"v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_draft_p0_d3",
                     "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_eagle_p0_d3", MTP_P1}
    why = {x.cell.cell_id: x.rule for x in e.excluded if ENGINE_TOKENS.search(x.cell.cell_id)}
    assert sorted(set(why.values())) == ["async-scheduling-not-on-cpu", "cudagraph-mode-cuda-only",
                                         "hybrid-spec-decode-cpu-prefix-caching",
                                         "kv-layout-cuda-only"]
    assert len(why) == 2 + 3 + 2 + 1
    # the MTP cell with prefix caching on: vLLM CPU 0.32 crashes it on the first request
    assert why[f"{MTP}-xa3ac39"] == "hybrid-spec-decode-cpu-prefix-caching"


def test_the_mtp_head_runs_on_its_own_checkpoint_only_and_without_prefix_caching():
    zoo = load_matrix().models          # the zoo's facts (config.json): the hybrid, its block
    ok = check_cell(Cell(model="tiny-qwen3next-hybrid-gsm-mtp", spec_decode="mtp_p3_d3",
                         compile="eager", extra_env=DS,
                         extra_args=("--no-enable-prefix-caching",)), CPU, zoo)
    assert [(p.kind, p.rule) for p in ok] == [("note", "draft-model-on-both-sides")]
    other = _problem(Cell(model="tiny-qwen3next-hybrid-gsm", spec_decode="mtp_p1_d3"),
                     "mtp-head-model")
    assert other.kind == "invalid" and "use tiny-qwen3next-hybrid-gsm-mtp" in other.message
    cached = next(p for p in check_cell(
        Cell(model="tiny-qwen3next-hybrid-gsm-mtp", spec_decode="mtp_p3_d3", extra_env=DS),
        CPU, zoo) if p.rule == "hybrid-spec-decode-cpu-prefix-caching")
    assert cached.kind == "invalid" and "precopy_mamba_align_fused_kernel" in cached.message
    assert "--no-enable-prefix-caching" in cached.message


def test_nightlys_cpu_queue_runs_the_mtp_head_and_its_canaries():
    e = expand(load_matrix(), "nightly", CPU)
    assert {f"{MTP}-x62f261", f"{MTP}-x62f261-fault-wrong-drafts",
            f"{MTP}-x62f261-fault-corrupt-draft-kv", MTP_P1} <= set(e.by_id())
    assert e.by_id()[MTP_P1].expected_failure


def test_pr_adds_the_two_cheapest_gpu_engine_cells_on_both_runners():
    e = expand(load_matrix(), "pr", GPU2)
    assert engine_cells(e.cells) == {f"{r}-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-{axis}"
                                     for r in ("v1", "v2") for axis in ("dlayout_NHD", "cg_NONE")}
    plain = e.by_id()["v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1"]
    # the decode's layout is not the baseline's: the NHD cell starts no baseline of its own
    assert e.by_id()["v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-dlayout_NHD"].baseline_key == plain.baseline_key


@pytest.mark.parametrize("token", ["async_", "spec_", "prefix_reuse", "chunk64", "cg_", "dlayout_"])
def test_nightly_runs_every_engine_axis_on_both_seed_cells(token):
    e = expand(load_matrix(), "nightly", GPU2)
    ids = [cid for cid in e.by_id() if f"-{token}" in cid]
    assert any(cid.startswith("v2-FLASHINFER-p128d128-tiny-llama-gsm-") for cid in ids)
    assert any(cid.startswith("v1-FLASH_ATTN-p128d128-tiny-llama-gsm-") for cid in ids)


def test_nightly_lists_what_it_cannot_run_with_the_rule():
    e = expand(load_matrix(), "nightly", GPU2)
    rules = {x.rule for x in e.excluded if ENGINE_TOKENS.search(x.cell.cell_id)}
    assert rules == {"async-scheduling-spec-decode", "cudagraph-mode-needs-compile",
                     "cudagraph-full-downgraded", "kv-layout-nhd-not-hybrid",
                     "draft-model-zoo-target"}
    assert rules <= ENGINE_RULES
    drafts = {x.cell.cell_id for x in e.excluded if x.rule == "draft-model-zoo-target"}
    assert drafts == {f"{r}-{b}-p128d128-Qwen3-0.6B-tp1x1-spec_draft_p1_d3"
                      for r in ("v1", "v2") for b in ("FLASH_ATTN", "FLASHINFER")}
    # FULL runs where attention graphs every batch: V1 FLASH_ATTN (FA3 on the H200), dense model
    full = [cid for cid in e.by_id() if cid.endswith("-cg_FULL")]
    assert full == ["v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-cg_FULL"]
    assert "kv-layout-is-connector-default" in " ".join(
        e.notes["v2-FLASHINFER-p128d128-tiny-llama-gsm-tp1x1-dlayout_HND"])


# ---- the CLI's ad-hoc cell ------------------------------------------------------------------

def test_adhoc_flags_reach_the_cell_and_the_server_commands(capsys):
    from harness.cli.main import main as cli_main

    code = cli_main(["run", "--model", "tiny-llama-gsm", "--platform", "cpu", "--compile", "eager",
                     "--spec-decode", "ngram", "--prefix-reuse", "--chunked-prefill", "64", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0
    assert "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-spec_ngram-prefix_reuse-chunk64" in out
    decode = [line for line in out.splitlines() if '"kv_role":"kv_consumer"' in line]
    assert decode and "--speculative-config" in decode[0] and "--max-num-batched-tokens 64" in decode[0]


@pytest.mark.parametrize("flags,rule", [
    (["--async-scheduling", "on"], "async-scheduling-not-on-cpu"),
    (["--cudagraph-mode", "FULL"], "cudagraph-mode-cuda-only"),
    (["--kv-layout", "NHD"], "kv-layout-cuda-only"),
    (["--chunked-prefill", "4"], "chunked-prefill-budget"),
])
def test_adhoc_cells_a_cpu_cannot_run_are_one_line_exit_2(capsys, flags, rule):
    from harness.cli.main import main as cli_main

    code = cli_main(["run", "--model", "tiny-llama-gsm", "--platform", "cpu", *flags, "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"({rule})" in err


def test_an_mtp_head_drafting_fewer_tokens_on_the_prefill_is_an_expected_failure():
    """mtp_p1_d3 on the hybrid (vLLM CPU 0.32): the decode's GDN state is not the prefill's and
    the answers go wrong; the rule's pattern matches the reason of the record that measured it
    (results/reference/cpu-mtp-20261208), which another failure's does not."""
    import json

    from harness.matrix.rules_models import STATE_DIFFERS

    zoo = load_matrix().models
    cell = Cell(model="tiny-qwen3next-hybrid-gsm-mtp", spec_decode="mtp_p1_d3", compile="eager",
                extra_env=DS, extra_args=("--no-enable-prefix-caching",))
    found = [p for p in check_cell(cell, CPU, zoo) if p.rule == "hybrid-spec-token-count-mix"]
    assert [p.kind for p in found] == ["xfail"] and "48 of 50 lost" in found[0].message
    assert not [p for p in check_cell(cell.replace(spec_decode="mtp_p3_d3"), CPU, zoo)
                if p.rule == "hybrid-spec-token-count-mix"]
    record = json.loads((Path(__file__).resolve().parents[2] / "results/reference/"
                         "cpu-mtp-20261208/20261208T004417Z-327698" / f"{MTP_P1}.json").read_text())
    assert re.search(STATE_DIFFERS, record["verdict"]["reason"])
    assert not re.search(STATE_DIFFERS, "the decode's prompt KV is not the prefill's [kv-digest]: "
                         "prompt KV differs on 50/50 requests (100%); first at layer "
                         "mtp.layers.0.self_attn.attn (the draft's) K head 0 tokens 0-31")
