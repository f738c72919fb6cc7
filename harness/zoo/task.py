"""gsm_synth: GSM8K-format shopping problems whose answer needs facts from every part of the prompt.

Each doc carries its own random price list (`context`, ~60 lines, the first ~600 tokens of the
prompt) and a question at the very end naming three items, one drawn from each third of the list.
The worked answer looks each price up, multiplies by the quantity and adds the products, then ends
in ``#### N`` like GSM8K. Because every price list is random, a model cannot memorise prices: it
must read them from the prompt's KV. Zeroing any 128-token block of that KV therefore either
removes a price the answer needs (catalog blocks), the attention sink and header (first block) or
an item name of the question (last block), which is what makes baseline-vs-P/D accuracy sensitive
to a lost or corrupted block.

Everything is a pure function of the seed: `make_doc(seed, index)` builds doc `index` of a split.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from harness.core.atomic import atomic_write_text

TASK_NAME = "gsm_synth"
NUM_FEWSHOT = 0          # the worked format is learned in training; each doc is self-contained
TRAIN_SEED = 1_000_003   # seeds the training stream and the train.jsonl split
TEST_SEED = 2_000_003    # seeds test.jsonl; disjoint from TRAIN_SEED's stream
TEST_SIZE = 500
TRAIN_FILE_SIZE = 200    # train.jsonl is a sample for inspection/few-shot use; training streams docs

CATALOG_SIZES = (56, 64)  # lines in the price list (inclusive range): prompts of 600-680 tokens,
#                          so the last 128-token block is filled to different depths
ITEMS_PER_QUESTION = 3
PRICE_RANGE = (1, 9)
QUANTITY_RANGE = (1, 4)

# Plural nouns; the shipped tokenizer turns each " <noun>" into one token (tests check this).
ITEMS: tuple[str, ...] = (
    "apples", "pears", "plums", "lemons", "limes", "grapes", "cherries", "peaches", "melons",
    "onions", "carrots", "beans", "peas", "potatoes", "tomatoes", "peppers", "radishes", "nuts",
    "eggs", "cookies", "cakes", "pies", "muffins", "buns", "rolls", "biscuits", "crackers",
    "candies", "mints", "sweets", "pencils", "pens", "crayons", "markers", "erasers", "rulers",
    "notebooks", "folders", "envelopes", "stamps", "stickers", "cards", "papers", "books",
    "maps", "clips", "pins", "needles", "buttons", "ribbons", "threads", "beads", "rings",
    "bells", "candles", "matches", "lamps", "bulbs", "batteries", "wires", "nails", "screws",
    "bolts", "hooks", "tools", "brushes", "combs", "soaps", "towels", "sponges", "cups", "mugs",
    "plates", "bowls", "spoons", "forks", "knives", "jars", "bottles", "bows", "bags",
    "baskets", "socks", "gloves", "hats", "caps", "scarves", "shirts", "shoes", "boots",
    "belts", "toys", "balls", "kites", "dolls", "blocks", "puzzles", "games", "drums",
    "flutes", "whistles", "flags", "shells", "stones", "seeds", "bricks", "tiles", "ropes",
    "chains", "locks", "keys", "coins", "badges", "magnets", "mirrors", "clocks", "watches",
    "vases", "pots", "pans",
)
NAMES: tuple[str, ...] = (
    "Mia", "Tom", "Ann", "Sam", "Lily", "Ben", "Emma", "Jack", "Lucy", "Max", "Nora", "Leo",
    "Ella", "Noah", "Zoe", "Liam", "Ava", "Owen", "Ivy", "Eli", "Ruby", "Dan", "Rosa", "Paul",
    "Kim", "Omar", "Nina", "Hugo", "Tara", "Ravi", "Maya", "Luis", "Anna", "Carl", "Jade",
    "Finn", "Iris", "Adam", "Lena", "Theo",
)
STORES: tuple[str, ...] = (
    "corner", "village", "market", "school", "garden", "harbor", "station", "river", "hill", "city",
)


@dataclass(frozen=True)
class Purchase:
    item: str
    quantity: int
    price: int

    @property
    def cost(self) -> int:
        return self.quantity * self.price


def _box(quantity: int) -> str:
    return "box" if quantity == 1 else "boxes"


def _dollars(amount: int) -> str:
    return f"{amount} dollar" if amount == 1 else f"{amount} dollars"


def render_catalog(store: str, catalog: list[tuple[str, int]]) -> str:
    """The price list that opens every prompt: one "- <item> <price> dollars per box" line each.

    The price token directly follows the item token, here and in the worked answer, so reading a
    price is a plain copy of "the token after this item" (an induction lookup) that a tiny model
    learns in minutes; with words between them (recipe <= 3) it had to match two tokens back."""
    lines = [f"Price list of the {store} store:"]
    lines += [f"- {item} {_dollars(price)} per box" for item, price in catalog]
    return "\n".join(lines)


def render_question(name: str, purchases: list[Purchase]) -> str:
    """The question; item names come last so the prompt's final tokens name an item."""
    parts = [f"{p.quantity} {_box(p.quantity)} of {p.item}" for p in purchases]
    listed = ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"How many dollars does {name} spend on {listed}?"


def render_answer(name: str, purchases: list[Purchase]) -> str:
    """GSM8K-style worked answer: one line per lookup+product, pairwise sums, then ``#### N``."""
    lines = []
    for p in purchases:
        verb = "costs" if p.quantity == 1 else "cost"
        lines.append(f"- {p.item} {_dollars(p.price)} per box, so {p.quantity} {_box(p.quantity)} "
                     f"{verb} {p.quantity} * {p.price} = {_dollars(p.cost)}.")
    running = purchases[0].cost
    for i, p in enumerate(purchases[1:], start=1):
        total = running + p.cost
        who = f"In total {name} spends" if i == len(purchases) - 1 else "Together that is"
        lines.append(f"{who} {running} + {p.cost} = {_dollars(total)}.")
        running = total
    lines.append(f"#### {running}")
    return "\n".join(lines)


def _pick_purchases(rng: random.Random, catalog: list[tuple[str, int]], taken: set[int]
                    ) -> list[Purchase]:
    """Three purchases, one item from each third of the catalog (so every region of the prompt
    matters), avoiding catalog positions in `taken`; in shuffled order."""
    size = len(catalog)
    bounds = [size * k // ITEMS_PER_QUESTION for k in range(ITEMS_PER_QUESTION + 1)]
    picks = []
    for k in range(ITEMS_PER_QUESTION):
        free = [i for i in range(bounds[k], bounds[k + 1]) if i not in taken]
        picks.append(rng.choice(free))
    taken.update(picks)
    rng.shuffle(picks)
    return [Purchase(catalog[i][0], rng.randint(*QUANTITY_RANGE), catalog[i][1]) for i in picks]


def make_doc(seed: int, index: int) -> dict:
    """Doc `index` of the stream seeded by `seed` (pure function of both)."""
    rng = random.Random(f"{TASK_NAME}:{seed}:{index}")
    size = rng.randint(*CATALOG_SIZES)
    items = rng.sample(ITEMS, size)
    catalog = [(item, rng.randint(*PRICE_RANGE)) for item in items]
    purchases = _pick_purchases(rng, catalog, set())
    name = rng.choice(NAMES)
    store = rng.choice(STORES)
    return {
        "id": index,
        "context": render_catalog(store, catalog),
        "question": render_question(name, purchases),
        "answer": render_answer(name, purchases),
        "result": sum(p.cost for p in purchases),
        "catalog": [[item, price] for item, price in catalog],
        "purchases": [[p.item, p.quantity] for p in purchases],
        "name": name,
    }


def make_training_sequence(seed: int, index: int, catalog_size: int, questions: int) -> dict:
    """A training sequence: one price list followed by `questions` question/answer pairs on
    disjoint items. Its first pair reads exactly like a doc's prompt + answer; the later pairs
    give the lookup circuits several answers per (expensive) long context."""
    rng = random.Random(f"{TASK_NAME}:train:{seed}:{index}:{catalog_size}:{questions}")
    items = rng.sample(ITEMS, catalog_size)
    catalog = [(item, rng.randint(*PRICE_RANGE)) for item in items]
    taken: set[int] = set()
    pairs = []
    for _ in range(questions):
        purchases = _pick_purchases(rng, catalog, taken)
        name = rng.choice(NAMES)
        pairs.append((render_question(name, purchases), render_answer(name, purchases)))
    return {"context": render_catalog(rng.choice(STORES), catalog), "pairs": pairs}


def doc_from_parts(catalog: list[tuple[str, int]], purchases: list[tuple[str, int]], name: str,
                   store: str = "corner") -> dict:
    """Build a doc from explicit parts (used by tests to perturb a catalog)."""
    prices = dict(catalog)
    bought = [Purchase(item, qty, prices[item]) for item, qty in purchases]
    return {
        "id": -1,
        "context": render_catalog(store, list(catalog)),
        "question": render_question(name, bought),
        "answer": render_answer(name, bought),
        "result": sum(p.cost for p in bought),
        "catalog": [list(c) for c in catalog],
        "purchases": [list(p) for p in purchases],
        "name": name,
    }


def prompt_text(doc: dict) -> str:
    """What the model sees; must match `doc_to_text` in harness/eval/tasks/gsm_synth.yaml."""
    return f"{doc['context']}\n\nQuestion: {doc['question']}\nAnswer:"


def target_text(doc: dict) -> str:
    """The continuation the model is trained to produce after `prompt_text` (then EOS)."""
    return " " + doc["answer"]


def iter_docs(seed: int, start: int = 0, count: int | None = None) -> Iterator[dict]:
    index = start
    while count is None or index < start + count:
        yield make_doc(seed, index)
        index += 1


def solve(doc: dict) -> int:
    """Recompute the answer from the doc's catalog and purchases (independent of the text)."""
    prices = {item: price for item, price in doc["catalog"]}
    return sum(prices[item] * qty for item, qty in doc["purchases"])


def extract_final(answer: str) -> str | None:
    """The number after ``####`` (same pattern as the task's strict-match filter)."""
    import re

    match = re.search(r"#### (\-?[0-9\.\,]+)", answer)
    return match.group(1) if match else None


def default_data_dir() -> Path:
    root = Path(os.environ.get("PD_ACCURACY_CACHE", Path.home() / ".cache" / "pd-accuracy"))
    return root / "data" / TASK_NAME


def write_splits(data_dir: str | os.PathLike[str] | None = None, *, test_size: int = TEST_SIZE,
                 train_size: int = TRAIN_FILE_SIZE, docs=None) -> Path:
    """Write train.jsonl/test.jsonl (deterministic) into `data_dir` and return it.

    `docs(seed, size)` yields a split's documents (default: this task's, iter_docs); a variant of
    the task (harness.zoo.shared_prefix) passes its own. Existing files with the same content
    are left alone, so concurrent callers are safe."""
    out = Path(data_dir) if data_dir is not None else default_data_dir()
    out.mkdir(parents=True, exist_ok=True)
    docs = docs or (lambda seed, size: iter_docs(seed, 0, size))
    for split, seed, size in (("train", TRAIN_SEED, train_size), ("test", TEST_SEED, test_size)):
        text = "".join(json.dumps(d, sort_keys=True) + "\n" for d in docs(seed, size))
        path = out / f"{split}.jsonl"
        if not path.exists() or path.read_text() != text:
            atomic_write_text(path, text)
    return out


if __name__ == "__main__":
    import sys

    print(write_splits(sys.argv[1] if len(sys.argv) > 1 else None))
