"""block-boundary: prompts of k*block-1, k*block and k*block+1 tokens. Found by
harness.weathers' scan of its packages: its row (below), its driver (``driver``), its matrix
rule (``boundary-blocks``) and the prompts it asks (the task variant ``gsm_synth_boundary``,
harness.zoo.boundary)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from harness.weathers.facts import WeatherParam, WeatherRow, WeatherRule

if TYPE_CHECKING:       # core.cell reads this row: its module is not imported here
    from harness.core.cell import Cell

NAME = "block-boundary"
# its prompts land on k*BOUNDARY_UNIT - 1, k*BOUNDARY_UNIT, k*BOUNDARY_UNIT + 1 tokens
# (harness.zoo.boundary): a boundary of every block size that divides it
BOUNDARY_UNIT = 128
BOUNDARY_MIN_MODEL_LEN = 1024   # the padded prompts (<= 4*128+1) and gsm_synth's 192 new tokens


def boundary_blocks(cell: "Cell") -> str | None:
    """block-boundary's prompts land on k*128-1, k*128, k*128+1 tokens: a boundary only of block
    sizes dividing 128, and they need max_model_len room for the padded prompt and its answer."""
    bad = sorted({b for b in (cell.prefill_block_size, cell.decode_block_size)
                  if BOUNDARY_UNIT % b})
    if bad:
        return (f"weather block-boundary pads prompts to k*{BOUNDARY_UNIT}-1/+0/+1 tokens: block "
                f"size {', '.join(map(str, bad))} does not divide {BOUNDARY_UNIT}")
    if cell.max_model_len < BOUNDARY_MIN_MODEL_LEN:
        return (f"weather block-boundary needs max_model_len >= {BOUNDARY_MIN_MODEL_LEN} (padded "
                f"prompts and their answers), got {cell.max_model_len}")
    return None


ROW = WeatherRow(
    params={"min_questions": WeatherParam(99, low=3, integer=True,
                                          meaning="questions of the first look: a third at "
                                                  "each of k*block-1, k*block, k*block+1")},
    task_variants={"gsm_synth": "gsm_synth_boundary"},
    rules=(WeatherRule("boundary-blocks", boundary_blocks.__doc__.splitlines()[0],
                       boundary_blocks),),
    summary="prompts of k*block-1, k*block and k*block+1 tokens (vLLM #50558)")
