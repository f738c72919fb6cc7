"""gsm_synth_shared: one price list for every doc, questions of their own, answers that check."""
from __future__ import annotations

import os

from harness.zoo import shared_prefix, task


def test_every_doc_opens_with_the_same_price_list_and_asks_its_own_question():
    docs = [shared_prefix.make_shared_doc(task.TEST_SEED, i) for i in range(20)]
    prompts = [task.prompt_text(d) for d in docs]
    shared = os.path.commonprefix(prompts)
    assert shared.startswith(docs[0]["context"]) and len(shared) >= len(docs[0]["context"])
    assert len({d["question"] for d in docs}) == 20
    assert all(task.solve(d) == d["result"] == int(task.extract_final(d["answer"])) for d in docs)
    # one item from each third of the shared list, as in gsm_synth
    size = len(docs[0]["catalog"])
    items = [item for item, _ in docs[0]["catalog"]]
    thirds = sorted(items.index(item) * 3 // size for item, _ in docs[0]["purchases"])
    assert thirds == [0, 1, 2]


def test_docs_are_a_pure_function_of_the_seeds():
    assert shared_prefix.make_shared_doc(task.TEST_SEED, 3) == shared_prefix.make_shared_doc(task.TEST_SEED, 3)
    assert shared_prefix.make_shared_doc(task.TEST_SEED, 3) != shared_prefix.make_shared_doc(task.TRAIN_SEED, 3)


def test_write_shared_splits_is_idempotent(tmp_path):
    out = shared_prefix.write_shared_splits(tmp_path, test_size=5, train_size=3)
    first = (out / "test.jsonl").stat().st_mtime_ns
    assert len((out / "test.jsonl").read_text().splitlines()) == 5
    assert len((out / "train.jsonl").read_text().splitlines()) == 3
    shared_prefix.write_shared_splits(tmp_path, test_size=5, train_size=3)
    assert (out / "test.jsonl").stat().st_mtime_ns == first
