"""The real-shape random-weight cells in the nightly profile, and the two selections of the
nightly profile docs/gpu.md gives as `pd-accuracy run --profile nightly -k EXPR` commands (the
cells of the H200 runs of 2026-12-03 and 2026-12-04): each selects exactly its cells on one
GPU, every term of it still names a cell, and docs/gpu.md shows the same expression."""
from __future__ import annotations

import re
import shlex
from functools import lru_cache
from pathlib import Path

import pytest

from harness.cli.main import build_parser
from harness.core.platform import PlatformInfo
from harness.matrix import expand, load_matrix
from harness.matrix.selection import select

ROOT = Path(__file__).resolve().parents[2]
GPU1 = PlatformInfo.from_spec("cuda:1")   # the commands run on one GPU, all servers sharing it
GPU2 = PlatformInfo.from_spec("cuda:2")

# real shapes, fp8 KV, mixed runners, NIXL push and MultiConnector(NIXL + offloading) and Mooncake
# with their canaries (2026-12-03); the ExampleConnector pair was measured on 2026-12-04, and the
# connectors' weather cells (w_) came later
SHAPES_TERMS = (
    "v2-FLASHINFER-p128d128-shape-qwen3-0.6b-tp1x1",
    "v2-FLASH_ATTN-p400d400-shape-granite",
    "v1-FLASHMLA-p64d64-shape-deepseek",
    "v1-FLASH_ATTN-p128d128-shape-gemma",
    "v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kv_",
    "v2-FLASHINFER-p128d128-tiny-llama-gsm-tp1x1-kv_fp8",
    "v2-TRITON_ATTN-p128d128-tiny-llama-gsm-tp1x1-kv_fp8",
    "(FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1 and prunner)",
    "v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kvc_",
)
SHAPES = ("(" + " or ".join(SHAPES_TERMS) + ") and not e5m2 and not spec_ngram-prunner_v1"
          " and not kvc_example and not w_")

# MultiConnector(NIXL + offloading), Mooncake and ExampleConnector with their canaries, the GPU
# weather cells, P V2 -> D V1 with ngram drafts, gemma-3-4b's grouped byte expectation
# (2026-12-04); the load-failures and soak weathers came later
WEATHER_TERMS = (
    "v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kvc_multi_nixl_offload",
    "v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kvc_mooncake",
    "v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kvc_example",
    "(FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1 and (w_load or w_preemption))",
    "v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-spec_ngram-prunner_v2",
    "v1-FLASH_ATTN-p128d128-shape-gemma-3-4b-tp1x1",
)
CONNECTORS_WEATHER = ("(" + " or ".join(WEATHER_TERMS) + ") and not w_load_failures"
                      " and not w_soak and not spec_ngram-w_ and not v2-FLASH_ATTN-p128d128-"
                      "tiny-llama-gsm-tp1x1-w_load-fault")


@lru_cache(maxsize=None)
def nightly(platform: PlatformInfo = GPU1) -> tuple:
    return tuple(expand(load_matrix(), "nightly", platform).cells)


def documented_commands() -> list[str]:
    """Every `pd-accuracy ...` command of docs/gpu.md's bash blocks, continuations joined."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "docs/gpu.md").read_text(), re.S)
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [line.split("  #")[0].strip() for line in lines if line.startswith("pd-accuracy ")]


def documented_keywords() -> set[str]:
    """Every `-k "..."` of docs/gpu.md, its line continuations joined and spaces collapsed."""
    text = (ROOT / "docs/gpu.md").read_text()
    return {" ".join(k.replace("\\\n", " ").split()) for k in re.findall(r'-k "([^"]*)"', text)}


def test_nightly_has_a_random_weight_cell_for_each_shape():
    ids = {c.cell_id for c in nightly(GPU2)}
    for model in ("shape-qwen3-0.6b", "shape-granite-4.0-h-tiny", "shape-deepseek-v2-lite",
                  "shape-gemma-3-4b"):
        assert any(f"-{model}-" in cid for cid in ids), model
    # the hybrid shape runs the block vLLM keeps for its real Mamba2 state (806,400 B a layer
    # against 2,048 B of KV a token: 400 tokens), not one vLLM would silently raise
    assert "v2-FLASH_ATTN-p400d400-shape-granite-4.0-h-tiny-tp1x1-xa3ac39" in ids
    assert "v2-FLASHINFER-p128d128-shape-qwen3-0.6b-tp1x1-fault-corrupt-block" in ids


def test_the_shapes_selection_is_its_19_cells_on_one_gpu():
    cells = select(nightly(), keyword=SHAPES)
    ids = {c.cell_id for c in cells}
    assert len(ids) == 19 and len({c.baseline_key for c in cells}) == 10
    assert all(c.device == "cuda" and c.weather == "calm" for c in cells)
    assert sum("-shape-" in cid for cid in ids) == 5
    assert sum("-kv_" in cid for cid in ids) == 5
    assert sum("-prunner_v" in cid for cid in ids) == 3   # V2 + ngram: refused by vLLM 0.26
    assert sum("-kvc_" in cid for cid in ids) == 6
    assert {"v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-spec_ngram-prunner_v2",
            "v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kv_p_auto_d_fp8",
            "v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kv_fp8-fault-corrupt-block"} <= ids


def test_the_connectors_weather_selection_is_its_13_cells_on_one_gpu():
    cells = select(nightly(), keyword=CONNECTORS_WEATHER)
    ids = {c.cell_id for c in cells}
    assert len(ids) == 13 and all(c.device == "cuda" for c in cells)
    assert sorted(c.weather for c in cells if c.weather != "calm") == [
        "load", "load", "load", "preemption", "preemption"]
    assert {f"v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kvc_{kvc}-fault-{fault}"
            for kvc, fault in (("multi_nixl_offload", "drop-transfer"),
                               ("mooncake", "drop-transfer"),
                               ("example", "corrupt-block"))} <= ids
    assert "v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-w_load-fault-early-release" in ids


@pytest.mark.parametrize("term", SHAPES_TERMS + WEATHER_TERMS)
def test_every_term_still_names_a_nightly_cell_on_one_gpu(term):
    assert select(nightly(), keyword=term), term


@pytest.mark.parametrize("keyword", [SHAPES, CONNECTORS_WEATHER], ids=["shapes", "weather"])
def test_docs_gpu_gives_the_same_selection(keyword):
    assert keyword in documented_keywords()


def test_every_documented_selection_names_nightly_cells_on_one_gpu():
    assert len(documented_keywords()) == 3
    for keyword in documented_keywords():
        assert select(nightly(), keyword=keyword), keyword


@pytest.mark.parametrize("command", documented_commands(), ids=lambda c: " ".join(c.split()[1:3]))
def test_docs_gpu_commands_parse(command):
    argv = shlex.split(command)[1:]
    args = build_parser().parse_args(argv)
    assert args.func
