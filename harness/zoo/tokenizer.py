"""The zoo's offline tokenizer: byte-level BPE trained on gsm_synth text, digits split one per token.

Single-digit tokens keep the arithmetic regular (the model never has to learn that "17" and "1"
"7" are the same number). A number's leading space stays on its first digit (" 17" is " 1", "7"),
so in "apples 7" the price is the very next token after the item. Every item and person name becomes one token, so every prompt of the
task has the same token count. The result is saved as tokenizer.json + tokenizer_config.json,
which transformers' AutoTokenizer and vLLM load offline.
"""
from __future__ import annotations

import json
from pathlib import Path

from harness.zoo import task

VOCAB_SIZE = 1024
CORPUS_DOCS = 1500
SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>"]
BOS_ID, EOS_ID, UNK_ID, PAD_ID = 0, 1, 2, 3


def _corpus() -> list[str]:
    docs = task.iter_docs(task.TRAIN_SEED, 0, CORPUS_DOCS)
    texts = [task.prompt_text(d) + task.target_text(d) for d in docs]
    # Make sure every word of the vocabulary lists is seen often, whatever the sample drew.
    texts += [" ".join(task.ITEMS + task.NAMES + task.STORES)] * 50
    return texts


def build_tokenizer_object():
    """Train and return a `tokenizers.Tokenizer` (deterministic for a given corpus)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(" ?[0-9]"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    # vLLM and lm-eval send raw prompts; the BOS is added here, as in training.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)])
    return tok


def save_tokenizer(out_dir: str | Path, model_max_length: int = 2048) -> Path:
    """Write tokenizer.json + tokenizer_config.json (+ special_tokens_map.json) into `out_dir`."""
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer_object(), bos_token="<s>", eos_token="</s>",
        unk_token="<unk>", pad_token="<pad>", model_max_length=model_max_length,
        clean_up_tokenization_spaces=False)
    fast.save_pretrained(str(out))
    # transformers 5 writes its new class name; the alias below loads in 4.x and 5.x alike.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out
