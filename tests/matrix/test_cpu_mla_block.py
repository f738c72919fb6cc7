"""An MLA model on CPU runs at the block its MLA backend on this host takes (rule cpu-mla-block):
the cpu-full MLA cells run at 128 on an AMX host (AMX_MLA) and at 16 elsewhere (CPU_MLA forces
16), the other block excluded with the reason; the eager XFAIL stays on the cell that runs."""
from __future__ import annotations

from harness.core.model_config import cpu_mla_backend, cpu_mla_block_runs
from harness.core.platform import PlatformInfo
from harness.matrix import expand, load_matrix
from harness.matrix.rules import check_cell
from tests.matrix.test_rules import AMX, AVX2, CATALOG, CPU, blocks, cpu_cell

AVX512_BF16 = PlatformInfo.from_spec("cpu:avx2+avx512f+avx512_bf16")
MLA = "v1-CPU_ATTN-p{b}d{b}-tiny-mla-gsm-tp1x1"


def test_the_block_vllm_cpu_runs_an_mla_model_at():
    assert cpu_mla_backend(("avx2", "avx512f")) == "CPU_MLA"
    assert cpu_mla_backend(("avx2", "amx_tile")) == "AMX_MLA"
    assert [cpu_mla_block_runs(b, ("avx2",)) for b in (16, 32, 128)] == [16, 16, 16]
    assert [cpu_mla_block_runs(b, ("amx_tile",)) for b in (16, 32, 128)] == [None, 32, 128]


def test_silent_where_the_isa_is_unknown_or_the_model_is_not_mla():
    rules = lambda cell, platform: [p.rule for p in check_cell(cell, platform, CATALOG)]  # noqa: E731
    assert "cpu-mla-block" not in rules(cpu_cell(model="mla", **blocks(128)), CPU)
    assert "cpu-mla-block" not in rules(cpu_cell(model="mla", **blocks(128)), None)
    assert "cpu-mla-block" not in rules(cpu_cell(**blocks(128)), AVX2)
    # CPU_ATTN's multiple-of-32 rule is not the MLA backend's: p16 is CPU_MLA's own block
    assert rules(cpu_cell(model="mla", **blocks(16)), AVX2) == []
    assert "cpu-attn-block-multiple-32" in rules(cpu_cell(**blocks(16)), AVX2)


def test_message_names_the_backend_and_the_fix():
    msg = {p.rule: p.message for p in check_cell(cpu_cell(model="mla", **blocks(128)), AVX2, CATALOG)}
    assert "CPU_MLA" in msg["cpu-mla-block"] and "use block_size 16" in msg["cpu-mla-block"]
    msg = {p.rule: p.message for p in check_cell(cpu_cell(model="mla", **blocks(16)), AMX, CATALOG)}
    assert "AMX_MLA" in msg["cpu-mla-block"] and "multiple of 32" in msg["cpu-mla-block"]


def test_cpu_full_runs_each_host_s_mla_block_and_says_why_not_the_other():
    spec = load_matrix()
    for platform, runs, excluded, suffix in ((AMX, 128, 16, ""), (AVX512_BF16, 16, 128, ""),
                                             (AVX2, 16, 128, "-float32")):
        e = expand(spec, "cpu-full", platform)
        cells = e.by_id()
        out = {x.cell.cell_id: x for x in e.excluded}
        kept, eager = MLA.format(b=runs) + suffix, MLA.format(b=runs) + "-eager" + suffix
        assert kept in cells and eager in cells, platform
        assert cells[eager].expected_failure and not cells[kept].expected_failure
        for cid in (MLA.format(b=excluded) + suffix, MLA.format(b=excluded) + "-eager" + suffix):
            assert out[cid].rule == "cpu-mla-block", (platform, cid)
