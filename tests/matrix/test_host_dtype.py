"""The dtype a CPU cell runs in follows the host's ISA: float32 without bf16 instructions."""
from __future__ import annotations

from harness.core.cell import Cell
from harness.core.platform import PlatformInfo, cpu_isa
from harness.matrix import expand, load_matrix
from harness.matrix.rules_machine import host_dtype

AVX2 = PlatformInfo.from_spec("cpu:avx2")                        # the slow 2-core CI host
AVX512 = PlatformInfo.from_spec("cpu:avx2+avx512f+avx512_vnni")  # AVX-512, still no bf16
AMX = PlatformInfo.from_spec("cpu:avx2+avx512f+avx512_bf16+avx512_vnni+amx_bf16+amx_tile")
CELL = Cell(model="tiny-llama-gsm", compile="eager")


def test_no_bf16_instructions_runs_float32_and_the_id_says_so():
    for host in (AVX2, AVX512):
        cell = host_dtype(CELL, host)
        assert cell.dtype == "float32"
        assert cell.cell_id == CELL.cell_id + "-float32"
        assert cell.baseline_key != CELL.baseline_key      # its baseline runs float32 too


def test_bf16_hosts_and_unknown_hosts_keep_bf16():
    for host in (AMX, PlatformInfo.from_spec("cpu:avx2+avx512_bf16"), PlatformInfo(), None):
        assert host_dtype(CELL, host) is CELL


def test_only_bf16_cpu_cells_change():
    assert host_dtype(CELL.replace(dtype="float16"), AVX2).dtype == "float16"
    gpu = CELL.replace(device="cuda", backend="FLASH_ATTN")
    assert host_dtype(gpu, AVX2) is gpu


def test_smoke_expanded_for_an_avx2_host_is_float32_throughout():
    spec = load_matrix()
    on_amx, on_avx2 = expand(spec, "smoke", AMX), expand(spec, "smoke", AVX2)
    assert [c.dtype for c in on_amx.cells] == ["bfloat16"] * len(on_amx.cells)
    assert [c.dtype for c in on_avx2.cells] == ["float32"] * len(on_avx2.cells)
    # same cells, same canaries and expected failures: only the dtype (and so the id) differs
    assert [c.replace(dtype="bfloat16") for c in on_avx2.cells] == on_amx.cells
    assert all("float32" in c.cell_id for c in on_avx2.cells)
    assert not on_avx2.excluded and not on_amx.excluded


def test_isa_parsed_from_cpuinfo():
    text = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
    assert cpu_isa(text) == ["avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]
    assert not PlatformInfo(cpu_isa=tuple(cpu_isa("flags : fpu avx2\n"))).computes_bf16
