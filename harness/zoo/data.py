"""Token batches for training and probing: a pure function of (seed, step), fast enough for a GPU.

Tokenizing ~760 tokens per doc with the byte-level/digit pre-tokenizers costs milliseconds; the
task's text is a few thousand distinct lines, so lines are tokenized once and cached. Newlines are
their own pre-token, hence joining cached lines with the newline id gives exactly the ids of
tokenizing the whole text (tests/test_zoo.py checks this against the tokenizer).
"""
from __future__ import annotations

from pathlib import Path

from harness.zoo import task
from harness.zoo.tokenizer import BOS_ID, EOS_ID, PAD_ID

IGNORE_INDEX = -100


class LineTokenCache:
    """Tokenizes text line by line with a cache; `encode(text)` equals the tokenizer's ids."""

    def __init__(self, tokenizer_json: str | Path):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(tokenizer_json))
        self._cache: dict[str, list[int]] = {}
        self.newline_id = self._line("\n")[0]

    def _line(self, line: str) -> list[int]:
        ids = self._cache.get(line)
        if ids is None:
            ids = self._tok.encode(line, add_special_tokens=False).ids
            self._cache[line] = ids
        return ids

    def encode(self, text: str, bos: bool = False) -> list[int]:
        ids = [BOS_ID] if bos else []
        for i, line in enumerate(text.split("\n")):
            if i:
                ids.append(self.newline_id)
            if line:
                ids.extend(self._line(line))
        return ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def encode_example(cache: LineTokenCache, doc: dict) -> tuple[list[int], list[int]]:
    """(input_ids, labels) for one doc: BOS + prompt + answer + EOS, loss on answer + EOS only."""
    prompt = cache.encode(task.prompt_text(doc), bos=True)
    target = cache.encode(task.target_text(doc)) + [EOS_ID]
    return prompt + target, [IGNORE_INDEX] * len(prompt) + target


def encode_sequence(cache: LineTokenCache, seq: dict) -> tuple[list[int], list[int]]:
    """(input_ids, labels) for a training sequence (task.make_training_sequence): the price list,
    then each question (no loss) and its answer + EOS (loss). Its first pair is tokenized exactly
    like a doc's prompt and answer."""
    ids = [BOS_ID] + cache.encode(seq["context"])
    labels = [IGNORE_INDEX] * len(ids)
    for question, answer in seq["pairs"]:
        prompt = cache.encode(f"\n\nQuestion: {question}\nAnswer:")
        target = cache.encode(" " + answer) + [EOS_ID]
        ids += prompt + target
        labels += [IGNORE_INDEX] * len(prompt) + target
    return ids, labels


# Training mixes price-list lengths: short lists make the lookup and copy circuits form in few
# steps, long ones (the eval's 56-64 lines) teach the same lookups across ~600 tokens.
TRAIN_CATALOG_SIZES = (6, 64)
TRAIN_CATALOG_SPREAD = 4
MAX_QUESTIONS = 4


# Curriculum: the first CURRICULUM_STEPS steps use short price lists only. A lookup needs two
# attention layers to compose (one moves the item into the price's position, one matches it), and
# at initialisation attention is spread over every line, so the gradient towards that circuit
# shrinks with the list length; on short lists it forms early and then carries over to long ones
# (without it: docs/zoo.md).
CURRICULUM_STEPS = 1500
CURRICULUM_CATALOG_SIZES = (4, 12)


def step_catalog_size(seed: int, step: int, curriculum_steps: int = CURRICULUM_STEPS) -> int:
    """The price-list length around which step `step`'s sequences are drawn (deterministic)."""
    import random

    return random.Random(f"size:{seed}:{step}").randint(*_phase_sizes(step, curriculum_steps))


def _phase_sizes(step: int, curriculum_steps: int) -> tuple[int, int]:
    return CURRICULUM_CATALOG_SIZES if step < curriculum_steps else TRAIN_CATALOG_SIZES


def make_batch(cache: LineTokenCache, seed: int, step: int, batch_size: int,
               curriculum_steps: int = CURRICULUM_STEPS):
    """Training batch `step` of the stream `seed`: right-padded LongTensors (input_ids, labels).

    All sequences of a step have similar lengths (one catalog size +- a few lines), so a step
    on short price lists is cheap."""
    import numpy as np
    import torch

    centre = step_catalog_size(seed, step, curriculum_steps)
    # The spread around the centre is clipped to [4, 64] with a curriculum and to [6, 64] without
    # (recipe v4); both exactly as the committed checkpoints were trained.
    smallest = CURRICULUM_CATALOG_SIZES[0] if curriculum_steps else TRAIN_CATALOG_SIZES[0]
    lo = max(smallest, centre - TRAIN_CATALOG_SPREAD)
    hi = min(TRAIN_CATALOG_SIZES[1], centre + TRAIN_CATALOG_SPREAD)
    pairs = []
    for i in range(batch_size):
        index = step * batch_size + i
        size = lo + index % (hi - lo + 1)
        questions = min(MAX_QUESTIONS, size // task.ITEMS_PER_QUESTION)
        pairs.append(encode_sequence(cache, task.make_training_sequence(seed, index, size,
                                                                        questions)))
    width = max(len(ids) for ids, _ in pairs)
    input_ids = np.full((batch_size, width), PAD_ID, dtype=np.int64)
    labels = np.full((batch_size, width), IGNORE_INDEX, dtype=np.int64)
    for row, (ids, labs) in enumerate(pairs):
        input_ids[row, : len(ids)] = ids
        labels[row, : len(labs)] = labs
    return torch.from_numpy(input_ids), torch.from_numpy(labels)


class BatchStream:
    """Map-style dataset for torch's DataLoader (batch_size=None): item `step` is that step's
    batch, so worker count and prefetching never change what a step sees."""

    def __init__(self, tokenizer_json: str | Path, seed: int, batch_size: int, steps: int,
                 curriculum_steps: int = CURRICULUM_STEPS):
        self.tokenizer_json = str(tokenizer_json)
        self.curriculum_steps = curriculum_steps
        self.seed = seed
        self.batch_size = batch_size
        self.steps = steps
        self._cache: LineTokenCache | None = None

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int):
        if self._cache is None:
            self._cache = LineTokenCache(self.tokenizer_json)
        return make_batch(self._cache, self.seed, step, self.batch_size, self.curriculum_steps)
