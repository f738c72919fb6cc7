"""A profile's pairwise grids: a covering array (covertable) in which every value pair a valid
cell can hold is held, every cell valid, against the full product."""
from __future__ import annotations

import itertools
import textwrap

from harness import matrix
from harness.matrix.pairwise import covering_rows, value_pairs


def test_every_pair_a_valid_row_holds_is_covered_by_valid_rows_only():
    sizes = [2, 3, 4, 3, 2, 3, 4]
    def ok(r):   # rules over two axes and over three
        return not (r[0] == 1 and r[2] == 3) and not (r[1] == 2 and r[3] == 0 and r[5] == 1)
    valid = {r for r in itertools.product(*(range(n) for n in sizes)) if ok(r)}
    rows = covering_rows(sizes, valid)
    assert set(rows) <= valid
    assert value_pairs(rows) >= value_pairs(sorted(valid))
    assert len(rows) < len(valid) / 50
    assert covering_rows(sizes, valid) == rows     # the same array every time


def test_the_combos_profile_covers_all_pairs_with_few_cells(tmp_path):
    spec = matrix.load_matrix(matrix.DEFAULT_MATRIX)
    expansion = matrix.expand(spec, "combos", None)
    gpu, cpu = expansion.coverage
    for coverage in (gpu, cpu):
        assert coverage.covered == coverage.pairs > 0
        assert coverage.cells * 20 < coverage.product
    assert {"runner", "backend", "block_size", "kv_cache_dtype", "prefix_reuse", "spec_decode",
            "model", "kv_connector", "weather"} <= set(gpu.axes)
    assert "runner" not in cpu.axes and "weather" in cpu.axes   # one runner on CPU
    assert "19 cells cover 288 of 288 value pairs of 9 axes" in gpu.line()
    ids = [c.cell_id for c in expansion.cells]
    assert len(ids) == gpu.cells + cpu.cells == len(set(ids))
    # every generated cell is valid on some machine: nothing excluded as invalid
    assert not [x for x in expansion.excluded if x.rule != "gpu-count"]


def test_a_pairwise_grid_in_a_matrix_file_and_list_says_its_coverage(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent("""
        extends: default
        profiles:
          pairs:
            pairwise:
              - model: tiny-llama-gsm
                device: cpu
                backend: CPU_ATTN
                block_size: [64, 128]
                spec_decode: [null, ngram]
                weather: [calm, load, preemption]
        """))
    from harness.cli.main import main
    assert main(["list", "--matrix", str(path), "--profile", "pairs", "--platform", "any"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "pairwise profiles.pairs.pairwise[0]: 6 cells cover 15 of 15 value pairs of 3 axes" in out
    assert "the full product is 12 cells (10 valid); 1 pair no valid cell holds" in out
