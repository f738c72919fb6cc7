"""The real-shape random-weight cells in the nightly profile, and the selection
scripts/gpu/shapes_fp8_connectors.sh runs on the H200: exactly its 14 cells, every one valid there."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from harness.core.platform import PlatformInfo
from harness.matrix import expand, load_matrix
from harness.matrix.selection import select

ROOT = Path(__file__).resolve().parents[2]
GPU2 = PlatformInfo.from_spec("cuda:2")


def shapes_call_keyword() -> str:
    script = (ROOT / "scripts/gpu/shapes_fp8_connectors.sh").read_text()
    body = re.search(r"^CELLS='(.*?)'$", script, re.S | re.M).group(1)
    return " ".join(body.split())


def test_nightly_has_a_random_weight_cell_for_each_shape():
    ids = set(expand(load_matrix(), "nightly", GPU2).by_id())
    for model in ("shape-qwen3-0.6b", "shape-granite-4.0-h-tiny", "shape-deepseek-v2-lite",
                  "shape-gemma-3-4b"):
        assert any(f"-{model}-" in cid for cid in ids), model
    # the hybrid shape runs the block vLLM keeps for its real Mamba2 state (806,400 B a layer
    # against 2,048 B of KV a token: 400 tokens), not one vLLM would silently raise
    assert "v2-FLASH_ATTN-p400d400-shape-granite-4.0-h-tiny-tp1x1-xa3ac39" in ids
    assert "v2-FLASHINFER-p128d128-shape-qwen3-0.6b-tp1x1-fault-corrupt-block" in ids


def test_the_shapes_call_selects_its_19_cells():
    cells = select(expand(load_matrix(), "nightly", GPU2).cells, keyword=shapes_call_keyword())
    # its keyword predates the connectors' weather cells (soak, load-failures), calm then
    cells = [c for c in cells if c.weather == "calm"]
    ids = {c.cell_id for c in cells}
    assert len(ids) == 19 and len({c.baseline_key for c in cells}) == 10
    assert sum("-shape-" in cid for cid in ids) == 5
    assert sum("-kv_" in cid for cid in ids) == 5
    assert sum("-prunner_v" in cid for cid in ids) == 3   # V2 + ngram: refused by vLLM 0.26
    assert sum("-kvc_" in cid for cid in ids) == 6
    assert {"v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-spec_ngram-prunner_v2",
            "v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kv_p_auto_d_fp8",
            "v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kv_fp8-fault-corrupt-block"} <= ids


def test_the_shapes_call_script_parses():
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts/gpu/shapes_fp8_connectors.sh")]).returncode == 0
