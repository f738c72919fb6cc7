"""`pd-accuracy warm`: bad input is one line and exit 2 before any server starts; one cell per
JIT/compile configuration is what it would warm."""
from __future__ import annotations

from harness.cli.main import main
from harness.core.cell import Cell
from harness.run.plan.packing import warm_key


def test_warm_refuses_an_unknown_cell_before_any_server(capsys):
    assert main(["warm", "--profile", "smoke", "--only", "no-such-cell"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-cell" in err[0]


def test_one_configuration_per_backend_runner_model():
    cells = [Cell(model="m", backend=b, runner=r, device="cuda", kv_buffer_device="cuda",
                  prefill_block_size=p, decode_block_size=p)
             for b in ("FLASHINFER", "FLASH_ATTN") for r in ("v1", "v2") for p in (16, 64, 128)]
    # block sizes share a configuration's kernels and compile artifacts
    assert len({warm_key(c) for c in cells}) == 4
