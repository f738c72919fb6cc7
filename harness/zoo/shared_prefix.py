"""gsm_synth_shared: the gsm_synth task with one price list for every doc, for the matrix's
`prefix_reuse` cells (harness.core.cell).

Each doc reads exactly like a gsm_synth doc (the same renderers, a question naming one item from
each third of the list), but every doc opens with the same price list, so the prompts share
their first 423 of 443 tokens and differ only in the question at the end. A P/D decode with prefix
caching therefore holds the shared blocks itself from its second request on and fetches only the
rest through the connector: the path where a decode-side prefix hit meets a partial remote transfer. It is
also what the zoo models were trained on (one price list followed by several questions), and
tiny-llama-gsm answers it as well as gsm_synth, where one fixed gsm_synth example in front of
each doc, i.e. a second price list, costs it a quarter of its answers (docs/zoo.md).

Everything is a pure function of the seeds, like harness.zoo.task.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

from harness.zoo import task

SHARED_TASK_NAME = "gsm_synth_shared"
CATALOG_SEED = 3_000_003   # the one price list (doc 0 of this stream, as harness.zoo.task draws it)


def shared_catalog(seed: int = CATALOG_SEED) -> tuple[str, list[tuple[str, int]]]:
    """(rendered price list, [(item, price), ...]) that every doc of the split opens with."""
    doc = task.make_doc(seed, 0)
    return doc["context"], [(item, price) for item, price in doc["catalog"]]


def make_shared_doc(split_seed: int, index: int, catalog_seed: int = CATALOG_SEED) -> dict:
    """Doc `index` of the stream seeded by `split_seed`: the shared price list and a question of
    its own (pure function of the seeds)."""
    context, catalog = shared_catalog(catalog_seed)
    rng = random.Random(f"{SHARED_TASK_NAME}:{split_seed}:{index}")
    purchases = task._pick_purchases(rng, catalog, set())
    doc = task.doc_from_parts(catalog, [(p.item, p.quantity) for p in purchases], rng.choice(task.NAMES))
    return {**doc, "id": index, "context": context}


def default_data_dir() -> Path:
    root = Path(os.environ.get("PD_ACCURACY_CACHE", Path.home() / ".cache" / "pd-accuracy"))
    return root / "data" / SHARED_TASK_NAME


def write_shared_splits(data_dir: str | os.PathLike[str] | None = None, *,
                        test_size: int = task.TEST_SIZE, train_size: int = task.TRAIN_FILE_SIZE) -> Path:
    """Write train.jsonl/test.jsonl (deterministic) into `data_dir` and return it; files that
    already hold the same content are left alone."""
    return task.write_splits(
        data_dir if data_dir is not None else default_data_dir(), test_size=test_size,
        train_size=train_size, docs=lambda seed, size: (make_shared_doc(seed, i) for i in range(size)))


if __name__ == "__main__":
    import sys

    print(write_shared_splits(sys.argv[1] if len(sys.argv) > 1 else None))
