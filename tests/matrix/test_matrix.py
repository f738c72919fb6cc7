"""Matrix YAML → cells: axis forms, profiles and includes, selectors, ids, select and shard."""
from __future__ import annotations

import random
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from harness.core.cell import Cell
from harness.cli.main import main as cli_main
from harness.matrix import (
    DuplicateCellIdError,
    MatrixError,
    UnknownCellError,
    UnknownProfileError,
    expand,
    load_matrix,
    parse_shard,
    select,
    shard,
)
from harness.core.platform import PlatformInfo
from harness.matrix.rules import RULES

CPU = PlatformInfo()
GPU2 = PlatformInfo.from_spec("cuda:2")
GPU8 = PlatformInfo.from_spec("cuda:8")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    return path


MINI = """
models:
  d: {kind: dense, num_kv_heads: 4}
  h: {kind: hybrid, ssm: mamba2, family: granite}
hybrid_block_sizes:
  h: 96
expected_failures:
  - match: {model: d, block_size: [[32, 64]]}
    reason: global xfail
profiles:
  base:
    defaults: {device: cpu, backend: CPU_ATTN}
    grids:
      - model: d
        block_size: [32, [32, 64], {prefill: [64], decode: [128, 256]}]
      - model: h
        block_size: required
        extra_args: [--no-enable-prefix-caching]
  wide:
    include: [base]
    defaults: {device: cpu, backend: CPU_ATTN}
    grids:
      - model: d
        block_size: 32
        runner: [v1, v2]
        fault: [null, drop-transfer]
    expected_failures:
      - match: {id: "*p64d128*"}
        reason: wide xfail
    exclude:
      - match: {fault: drop-transfer}
        reason: not today
"""


# ---- the shipped matrix ---------------------------------------------------------------------

def test_default_matrix_profiles_expand_with_unique_ids():
    spec = load_matrix()
    assert {"smoke", "pr", "nightly"} <= set(spec.profiles)
    for name in spec.profiles:
        for platform in (CPU, GPU2, GPU8):
            e = expand(spec, name, platform)
            ids = [c.cell_id for c in e.cells] + [x.cell.cell_id for x in e.excluded]
            assert len(ids) == len(set(ids)), name
            assert e.cells or e.excluded


def test_smoke_profile_content():
    e = expand(load_matrix(), "smoke", CPU)
    assert not e.excluded
    ids = [c.cell_id for c in e.cells]
    assert all(c.device == "cpu" and c.backend == "CPU_ATTN" and c.runner == "v1" for c in e.cells)
    dense = [c for c in e.cells if c.model == "tiny-llama-gsm" and not c.fault]
    assert {(c.prefill_block_size, c.decode_block_size) for c in dense} >= {(32, 32), (128, 128), (64, 128)}
    assert {c.fault for c in e.cells if c.fault} == {"drop-transfer", "foreign-params", "corrupt-block",
                                                     "perturb-kv"}
    proxy_faults = {"drop-transfer", "foreign-params"}
    assert all(c.model == "tiny-llama-gsm" for c in e.cells if c.fault in proxy_faults)
    kv_canaries = {(c.model, dict(c.fault_env).get("PD_ACCURACY_FAULT_BLOCK", "first"))
                   for c in e.cells if c.fault == "corrupt-block"}
    assert kv_canaries == {("tiny-llama-gsm", "2"), ("tiny-granite-hybrid-gsm", "first"),
                           ("tiny-qwen3next-hybrid-gsm", "last")}
    hybrids = [c for c in e.cells if "hybrid" in c.model]
    assert {c.model for c in hybrids} == {"tiny-granite-hybrid-gsm", "tiny-qwen3next-hybrid-gsm"}
    assert all(dict(c.extra_env)["VLLM_SSM_CONV_STATE_LAYOUT"] == "DS" for c in hybrids)
    assert "v1-CPU_ATTN-p32d32-tiny-llama-gsm-tp1x1-eager" in ids
    assert all(c.gpus_needed["total"] == 0 for c in e.cells)
    # CI runs the eager path (start-up without torch.compile); cpu-full adds the compiled one
    assert {c.compile for c in e.cells} == {"eager"}
    full = expand(load_matrix(), "cpu-full", CPU).cells
    assert {c.compile for c in full} == {"eager", "default"}
    assert {"v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1",
            "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager"} <= {c.cell_id for c in full}
    # the Granite cell avoids the known prefix-caching crash; the only expected failure is the
    # measured CPU heterogeneous-block-size bug (P64 → D128), which still runs
    xfails = [c.cell_id for c in e.cells if c.expected_failure]
    assert xfails == ["v1-CPU_ATTN-p64d128-tiny-llama-gsm-tp1x1-eager"]


def test_pr_profile_content():
    e = expand(load_matrix(), "pr", GPU2)
    assert not e.excluded
    assert all(c.gpus_needed["total"] <= 2 for c in e.cells)
    combos = {(c.runner, c.backend, c.prefill_block_size) for c in e.cells if c.model == "tiny-llama-gsm"}
    assert len(combos) == 2 * 3 * 3
    assert "v2-FLASHINFER-p128d128-tiny-llama-gsm-tp1x1" in e.by_id()
    # upstream failures measured on the H200 are declared, and still run
    xfails = sorted(c.cell_id for c in e.cells if c.expected_failure)
    # (Granite V2 x FLASH_ATTN passed on both layouts on 2026-11-30: only V1 stays declared)
    # (an NHD decode scrambles intact KV in vLLM 0.26's local permute: gpu-h200-engine-axes-20261201)
    # (GPU2 probes no vLLM: release-bounded declarations apply, as for an unknown release)
    assert xfails == ["v1-FLASH_ATTN-p128d128-tiny-granite-hybrid-gsm-tp1x1-xa3ac39",
                      "v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-dlayout_NHD",
                      "v1-FLASH_ATTN-p16d64-tiny-llama-gsm-tp1x1",
                      "v2-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-dlayout_NHD",
                      "v2-FLASH_ATTN-p16d64-tiny-llama-gsm-tp1x1"]
    assert "logical block 128" in " ".join(e.notes["v2-FLASHINFER-p128d128-tiny-llama-gsm-tp1x1"])
    assert sum(c.prefill_block_size != c.decode_block_size for c in e.cells) >= 1
    granite = [c for c in e.cells if c.model == "tiny-granite-hybrid-gsm"]
    assert len(granite) == 6 and all(c.prefill_block_size == 128 for c in granite)
    # on a CPU machine every GPU cell is excluded with a reason, not an error
    on_cpu = expand(load_matrix(), "pr", CPU)
    assert not on_cpu.cells and {x.rule for x in on_cpu.excluded} == {"gpu-count"}


def test_nightly_profile_content():
    e = expand(load_matrix(), "nightly", GPU8)
    models = {c.model for c in e.cells}
    assert {"Qwen/Qwen3-0.6B", "ibm-granite/granite-4.0-h-tiny", "Qwen/Qwen3.5-0.8B"} <= models
    assert any(c.prefill_tp == 2 and c.decode_tp == 2 for c in e.cells)
    assert {c.kv_buffer_device for c in e.cells} == {"cpu", "cuda"}
    assert set(expand(load_matrix(), "pr", GPU8).by_id()) <= set(e.by_id())   # includes pr
    gdn = [c for c in e.cells if c.model in ("Qwen/Qwen3.5-0.8B", "tiny-qwen3next-hybrid-gsm")
           and c.device == "cuda"]
    assert gdn and all("GDN" in c.expected_failure for c in gdn)
    small = expand(load_matrix(), "nightly", PlatformInfo.from_spec("cuda:1"))
    assert any(x.rule == "gpu-count" for x in small.excluded)
    # no platform (pipeline generation on a CPU agent): nothing is dropped for lack of GPUs; what
    # is dropped is invalid anywhere (the engine-setting grids list their impossible cells)
    anywhere = expand(load_matrix(), "nightly", None)
    assert {c.cell_id for c in anywhere.cells} == set(e.by_id())
    kinds = {r.name: r.kind for r in RULES}
    assert anywhere.excluded and all(kinds[x.rule] == "invalid" for x in anywhere.excluded)
    assert {x.cell.cell_id for x in anywhere.excluded} == {x.cell.cell_id for x in e.excluded}


# ---- axis forms, includes, selectors --------------------------------------------------------

def test_axis_forms_and_required_block(tmp_path):
    e = expand(load_matrix(write(tmp_path, MINI)), "base", CPU)
    pairs = sorted((c.prefill_block_size, c.decode_block_size) for c in e.cells if c.model == "d")
    assert pairs == [(32, 32), (32, 64), (64, 128), (64, 256)]
    (h,) = [c for c in e.cells if c.model == "h"]
    assert (h.prefill_block_size, h.decode_block_size) == (96, 96)


def test_required_block_uses_provider_first(tmp_path):
    spec = load_matrix(write(tmp_path, MINI), block_size_provider=lambda model, device: 160)
    (h,) = [c for c in expand(spec, "base", CPU).cells if c.model == "h"]
    assert h.prefill_block_size == 160


def test_required_block_unknown_is_a_matrix_error(tmp_path):
    text = MINI.replace("hybrid_block_sizes:\n  h: 96\n", "")
    with pytest.raises(MatrixError, match="hybrid_block_sizes"):
        expand(load_matrix(write(tmp_path, text)), "base", CPU)


def test_includes_selectors_and_exclusions(tmp_path):
    e = expand(load_matrix(write(tmp_path, MINI)), "wide", CPU)
    by_id = e.by_id()
    # includer's and global xfail selectors reach included cells
    assert by_id["v1-CPU_ATTN-p64d128-d-tp1x1"].expected_failure == "wide xfail"
    assert by_id["v1-CPU_ATTN-p32d64-d-tp1x1"].expected_failure == "global xfail"
    # p32d32 comes from both profiles: kept once
    assert Counter(c.cell_id for c in e.cells)["v1-CPU_ATTN-p32d32-d-tp1x1"] == 1
    excluded = {x.cell.cell_id: (x.rule, x.reason) for x in e.excluded}
    assert excluded["v1-CPU_ATTN-p32d32-d-tp1x1-fault-drop-transfer"] == ("profile-exclude:wide", "not today")
    assert excluded["v2-CPU_ATTN-p32d32-d-tp1x1"][0] == "v2-runner-not-on-cpu"
    # the included profile alone does not see the includer's selectors
    base = expand(load_matrix(write(tmp_path, MINI)), "base", CPU).by_id()
    assert base["v1-CPU_ATTN-p64d128-d-tp1x1"].expected_failure is None


def test_rule_xfail_and_selector_xfail_combine(tmp_path):
    text = MINI + """
  granite:
    defaults: {device: cpu, backend: CPU_ATTN}
    grids:
      - {model: h, block_size: 96}
    expected_failures:
      - match: {family: granite}
        reason: also this
"""
    (cell,) = expand(load_matrix(write(tmp_path, text)), "granite", CPU).cells
    assert "conv_ssm_forward" in cell.expected_failure and "also this" in cell.expected_failure


def test_extra_args_and_env_variants(tmp_path):
    text = """
    profiles:
      p:
        grids:
          - model: d
            extra_args: [[], [--enforce-eager], [--max-num-seqs, "8"]]
            extra_env: [{}, {A: 1}]
    """
    cells = expand(load_matrix(write(tmp_path, text)), "p", CPU).cells
    assert len(cells) == 6
    assert {c.extra_args for c in cells} == {(), ("--enforce-eager",), ("--max-num-seqs", "8")}
    assert {c.extra_env for c in cells} == {(), (("A", "1"),)}


def test_network_axis_puts_netns_in_the_id_and_shares_the_baseline(tmp_path):
    text = """
    profiles:
      p:
        grids:
          - {model: d, network: [local, netns]}
    """
    local, netns = expand(load_matrix(write(tmp_path, text)), "p", CPU).cells
    assert (local.network, netns.network) == ("local", "netns")
    assert netns.cell_id == local.cell_id + "-netns"
    assert netns.baseline_key == local.baseline_key
    root_less = PlatformInfo(netns_unavailable="network: netns needs root")
    excluded = expand(load_matrix(write(tmp_path, text)), "p", root_less)
    assert [c.network for c in excluded.cells] == ["local"]


def test_duplicate_ids_of_different_cells_are_an_error(tmp_path):
    text = """
    profiles:
      p:
        grids:
          - {model: d, max_model_len: 1024}
          - {model: d, max_model_len: 512}
    """
    with pytest.raises(DuplicateCellIdError, match="v1-CPU_ATTN-p128d128-d-tp1x1.*max_model_len"):
        expand(load_matrix(write(tmp_path, text)), "p", CPU)


@pytest.mark.parametrize("text,needle", [
    ("profiles: {p: {grids: [{model: d, blocksize: 16}]}}", "unknown axis ['blocksize']"),
    ("profiles: {p: {include: [q]}}", "unknown profile 'q'"),
    ("profiles: {p: {include: [q]}, q: {include: [p]}}", "include cycle"),
    ("profiles: {p: {grids: [{model: d, block_size: [[1, 2, 3]]}]}}", "neither a size nor"),
    ("profiles: {p: {grids: [{runner: v1}]}}", "no model"),
    ("models: {d: {kind: dense, heads: 2}}\nprofiles: {p: {}}", "unknown key(s) ['heads']"),
    ("hybrid_block_sizes: {x: 64}\nprofiles: {p: {}}", "declare it under models"),
    ("profiles: {p: {expected_failures: [{match: {colour: red}, reason: x}]}}", "unknown selector key"),
    ("profiles: [1]", "non-empty `profiles` mapping"),
    ("profiles: {p: {grids: [{model: d}]}\n  bad", "not valid YAML"),
])
def test_malformed_yaml_gives_one_line_errors(tmp_path, text, needle):
    with pytest.raises(MatrixError) as info:
        expand(load_matrix(write(tmp_path, text)), "p", CPU)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_profile(tmp_path):
    with pytest.raises(UnknownProfileError, match="did you mean 'base'"):
        expand(load_matrix(write(tmp_path, MINI)), "bse", CPU)


# ---- select ---------------------------------------------------------------------------------

@pytest.fixture()
def pr_cells():
    return expand(load_matrix(), "pr", GPU2).cells


def test_select_exact_glob_and_keyword(pr_cells):
    one = "v2-FLASHINFER-p128d128-tiny-llama-gsm-tp1x1"
    assert [c.cell_id for c in select(pr_cells, [one])] == [one]
    glob = select(pr_cells, ["v2-FLASHINFER-*"])
    assert glob and all(c.cell_id.startswith("v2-FLASHINFER-") for c in glob)
    kw = select(pr_cells, None, "flashinfer and (p128 or p16) and not hybrid")
    assert {c.cell_id for c in kw} == {
        f"{r}-FLASHINFER-p{b}d{b}-tiny-llama-gsm-tp1x1" for r in ("v1", "v2") for b in (16, 128)}
    assert select(pr_cells, None, None) == list(pr_cells)


def test_select_unknown_id_suggests(pr_cells):
    with pytest.raises(UnknownCellError, match="closest: v2-FLASHINFER-p128d128-tiny-llama-gsm-tp1x1"):
        select(pr_cells, ["v2-FLASHINFER-p128d128-tiny-lama-gsm-tp1x1"])
    with pytest.raises(MatrixError, match="not valid"):
        select(pr_cells, None, "flashinfer and")


# ---- shard ----------------------------------------------------------------------------------

@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
def test_shards_partition_the_cells(count):
    cells = expand(load_matrix(), "all", GPU8).cells
    shards = [shard(cells, i, count) for i in range(count)]
    ids = [c.cell_id for s in shards for c in s]
    assert sorted(ids) == sorted(c.cell_id for c in cells)          # each cell exactly once
    for s in shards:                                                 # groups never split
        keys = {(c.gpus_needed["total"], c.baseline_key) for c in s}
        others = {(c.gpus_needed["total"], c.baseline_key) for o in shards if o is not s for c in o}
        assert not keys & others
    sizes = [len(s) for s in shards]
    biggest_group = max(Counter((c.gpus_needed["total"], c.baseline_key) for c in cells).values())
    assert max(sizes) - min(sizes) <= biggest_group


def test_shard_is_deterministic_and_order_independent():
    cells = expand(load_matrix(), "all", GPU8).cells
    shuffled = list(cells)
    random.Random(7).shuffle(shuffled)
    for i in range(4):
        assert {c.cell_id for c in shard(cells, i, 4)} == {c.cell_id for c in shard(shuffled, i, 4)}
        assert shard(cells, i, 4) == shard(cells, i, 4)


def test_shard_keeps_baseline_siblings_together():
    a = Cell(model="m", prefill_block_size=64, decode_block_size=128)
    b = Cell(model="m", prefill_block_size=128, decode_block_size=128)   # same baseline as a
    c = Cell(model="n")
    assert a.baseline_key == b.baseline_key
    for count in (2, 3):
        together = [s for s in (shard([a, b, c], i, count) for i in range(count)) if a in s]
        assert b in together[0]


@pytest.mark.parametrize("index,count", [(2, 2), (-1, 2), (0, 0)])
def test_shard_bad_arguments(index, count):
    with pytest.raises(MatrixError):
        shard([], index, count)


@pytest.mark.parametrize("text,expected", [("0/1", (0, 1)), ("3/8", (3, 8)), (" 1 / 2", (1, 2))])
def test_parse_shard(text, expected):
    assert parse_shard(text) == expected


@pytest.mark.parametrize("text,needle", [("5/2", "need 0 <= I < N"), ("0/0", "need 0 <= I < N"),
                                         ("-1/2", "need 0 <= I < N"), ("x", "expected I/N"),
                                         ("1/2/3", "expected I/N"), ("a/b", "expected I/N")])
def test_parse_shard_rejects_with_one_line(text, needle):
    with pytest.raises(MatrixError) as info:
        parse_shard(text)
    assert str(info.value) == f"--shard {text!r}: {needle}" + (", e.g. 0/4" if needle == "expected I/N" else "")


# ---- CLI ------------------------------------------------------------------------------------

def test_cli_list(capsys):
    assert cli_main(["list", "--profile", "smoke", "--platform", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "v1-CPU_ATTN-p32d32-tiny-llama-gsm-tp1x1" in out and "canary drop-transfer" in out


def test_cli_list_excluded_and_json(capsys):
    assert cli_main(["list", "--profile", "nightly", "--platform", "cuda:1", "--show-excluded"]) == 0
    out = capsys.readouterr().out
    assert "gpu-count" in out and "needs 2 GPU(s)" in out
    assert cli_main(["list", "--profile", "pr", "--platform", "cuda:2", "--json", "-k", "v2 and FLASHINFER and 128"]) == 0
    import json
    payload = json.loads(capsys.readouterr().out)
    assert {c["id"] for c in payload["cells"]} >= {"v2-FLASHINFER-p128d128-tiny-llama-gsm-tp1x1"}
    assert all(c["gpus"]["total"] <= 2 for c in payload["cells"])


def test_cli_bad_profile_is_one_line_exit_2(capsys):
    assert cli_main(["list", "--profile", "nope", "--platform", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown profile 'nope'" in err


def test_cli_list_any_platform(capsys):
    assert cli_main(["list", "--profile", "pr", "--platform", "any", "--json"]) == 0
    import json
    payload = json.loads(capsys.readouterr().out)
    assert payload["platform"] == "any machine" and len(payload["cells"]) == 32


@pytest.mark.parametrize("shard_arg", ["5/2", "x"])
def test_cli_run_bad_shard_is_one_line_exit_2(capsys, shard_arg):
    """`run --shard` is parsed by matrix.parse_shard: a usage error, before any server starts."""
    code = cli_main(["run", "--profile", "smoke", "--platform", "cpu", "--shard", shard_arg, "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("pd-accuracy: error: argument --shard: ")


def test_cli_list_bad_shard_is_an_argparse_error(capsys):
    assert cli_main(["list", "--profile", "smoke", "--platform", "cpu", "--shard", "5/2"]) == 2
    assert "pd-accuracy: error: argument --shard: need 0 <= I < N" in capsys.readouterr().err


def test_cli_rules(capsys):
    assert cli_main(["list", "--rules"]) == 0
    assert "hybrid-homogeneous-block" in capsys.readouterr().out


def test_nightly_declares_the_h200_block_and_host_buffer_failures():
    """Measured on the H200 (results/reference/gpu-h200-kv-buffer-20261201 and gpu-h200-kv-digest-20261201): every P<D block pair,
    the hybrid's host-buffer path and the dense host buffer under chunked prefill are expected
    failures on cuda; the unchunked dense host-buffer cells, which passed, are not."""
    e = expand(load_matrix(), "nightly", GPU2)
    combos = set(expand(load_matrix(), "combos", GPU2).by_id())   # its own P != D cells
    llama = [c for c in e.cells if c.model == "tiny-llama-gsm" and c.fault is None
             and c.cell_id not in combos]
    hetero = [c for c in llama if c.prefill_block_size != c.decode_block_size]
    assert len(hetero) == 2 * 3 * 3 and all(c.expected_failure for c in hetero)
    assert "HND" in e.by_id()["v2-FLASH_ATTN-p64d128-tiny-llama-gsm-tp1x1"].expected_failure
    host = [c for c in e.cells if c.kv_buffer_device == "cpu" and c.device == "cuda"
            and c.model in ("tiny-llama-gsm", "tiny-granite-hybrid-gsm")]
    dense = [c for c in host if c.model == "tiny-llama-gsm"]
    # 8 block/runner/backend cells plus the host-buffer x chunked-prefill pair (#30419)
    assert len(dense) == 10 and sum(c.chunked_prefill == 64 for c in host) == 2
    assert {c.chunked_prefill for c in dense if c.expected_failure} == {64}
    assert all("_build_save_meta" in c.expected_failure for c in dense if c.chunked_prefill)
    assert any(c.expected_failure for c in host if c.model == "tiny-granite-hybrid-gsm")
    assert all("initialize_host_xfer_buffer" in c.expected_failure
               for c in host if c.model == "tiny-granite-hybrid-gsm" and c.runner == "v2")


def test_cpu_full_has_a_heterogeneous_tp_pair_that_a_cpu_machine_runs():
    e = expand(load_matrix(), "cpu-full", CPU)
    tp = [c for c in e.cells if (c.prefill_tp, c.decode_tp) != (1, 1)]
    assert [c.cell_id for c in tp] == ["v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x2",
                                       "v1-CPU_ATTN-p128d128-tiny-llama-swa-gsm-tp1x2-eager"]
    assert all(not c.expected_failure and c.gpus_needed["total"] == 0 for c in tp)


def test_expected_failures_carry_their_reason_pattern(tmp_path):
    smoke = {c.cell_id: c for c in expand(load_matrix(), "smoke", CPU).cells}
    xfail = smoke["v1-CPU_ATTN-p64d128-tiny-llama-gsm-tp1x1-eager"]
    assert "generations diverge" in xfail.expected_failure_match
    assert smoke["v1-CPU_ATTN-p32d32-tiny-llama-gsm-tp1x1-eager"].expected_failure_match is None
    bad = tmp_path / "m.yaml"
    bad.write_text("models: {m: {kind: dense}}\n"
                   "expected_failures: [{match: {model: m}, reason: r, fails_with: '(unclosed'}]\n"
                   "profiles: {p: {grids: [{model: m, device: cpu, backend: CPU_ATTN}]}}\n")
    with pytest.raises(MatrixError, match="fails_with '\\(unclosed' is no regular expression"):
        load_matrix(bad)


def test_a_user_matrix_extends_the_packaged_one(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text(textwrap.dedent("""\
        extends: default
        models:
          my-org/my-model: {kind: dense, family: llama, num_kv_heads: 8, head_dim: 128}
        expected_failures:
          - match: {model: my-org/my-model, decode_block_size: 16}
            reason: my connector cannot do 16 yet
        profiles:
          mine:
            description: my model on my backends
            defaults: {device: cuda, kv_buffer_device: cuda}
            grids:
              - model: my-org/my-model
                backend: [FLASH_ATTN, FLASHINFER]
                block_size: [16, 64]
          smoke:
            description: replaced
            defaults: {device: cpu, backend: CPU_ATTN, kv_buffer_device: cpu}
            grids:
              - model: tiny-llama-gsm
                block_size: 128
        """))
    spec = load_matrix(mine)
    assert {"mine", "smoke", "pr", "nightly"} <= set(spec.profiles)        # kept and added
    cells = expand(spec, "mine", GPU2).cells
    assert len(cells) == 4 and sum(bool(c.expected_failure) for c in cells) == 2
    assert [c.cell_id for c in expand(spec, "smoke", CPU).cells] == \
        ["v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1"]                    # replaced
    assert len(spec.expected_failures) == len(load_matrix().expected_failures) + 1
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\nprofiles: {p: {grids: []}}\n")
    with pytest.raises(MatrixError, match="extends cycle"):
        load_matrix(tmp_path / "loop.yaml")
