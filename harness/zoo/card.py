"""Model cards: harness/zoo/cards/<name>.md, rendered from the checkpoint's training.json and,
once measured, its eval_vllm.json (accuracy through a vLLM server, see `record_vllm_eval`)."""
from __future__ import annotations

import json
from pathlib import Path

from harness.core.atomic import atomic_write_text
from harness.zoo import task
from harness.zoo.registry import CARDS_DIR, required_block_size
from harness.zoo.train import RECIPE_VERSION, TRAINING_JSON

VLLM_EVAL_JSON = "eval_vllm.json"


def record_vllm_eval(checkpoint: str | Path, results_json: str | Path, *, command: str = "",
                     vllm_version: str = "") -> dict:
    """Store the gsm_synth numbers of an lm-eval results JSON next to the checkpoint."""
    results = json.loads(Path(results_json).read_text())
    metrics = results["results"][task.TASK_NAME]
    return record_vllm_accuracy(
        checkpoint, n=results.get("n-samples", {}).get(task.TASK_NAME, {}).get("effective"),
        strict_match=metrics.get("exact_match,strict-match"),
        flexible_extract=metrics.get("exact_match,flexible-extract"),
        num_fewshot=results.get("n-shot", {}).get(task.TASK_NAME, task.NUM_FEWSHOT),
        vllm_version=vllm_version, command=command)


def record_vllm_accuracy(checkpoint: str | Path, *, n: int | None, strict_match: float | None,
                         flexible_extract: float | None, num_fewshot: int = task.NUM_FEWSHOT,
                         vllm_version: str = "", command: str = "") -> dict:
    """Store gsm_synth accuracy measured through a vLLM server next to the checkpoint
    (eval_vllm.json: what the card shows and every cell's baseline-health check reads)."""
    record = {
        "task": task.TASK_NAME,
        "n": n,
        "strict_match": strict_match,
        "flexible_extract": flexible_extract,
        "num_fewshot": num_fewshot,
        "vllm": vllm_version,
        "command": command,
    }
    atomic_write_text(Path(checkpoint) / VLLM_EVAL_JSON, json.dumps(record, indent=2) + "\n")
    return record


def _fmt_acc(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


ARCH_KEYS = ("hidden_size", "num_hidden_layers", "layer_types", "num_attention_heads",
             "num_key_value_heads", "head_dim", "intermediate_size", "shared_intermediate_size",
             "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
             "shared_expert_intermediate_size", "mamba_n_heads", "mamba_d_head",
             "mamba_d_state", "mamba_expand", "mamba_chunk_size", "linear_num_key_heads",
             "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
             "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
             "v_head_dim", "first_k_dense_replace",
             "position_embedding_type", "vocab_size", "max_position_embeddings")


def render_card(checkpoint: str | Path) -> str:
    """Markdown model card for the checkpoint directory."""
    ckpt = Path(checkpoint)
    train = json.loads((ckpt / TRAINING_JSON).read_text())
    config = json.loads((ckpt / "config.json").read_text())
    weights = ckpt / "model.safetensors"
    size_mb = weights.stat().st_size / 1e6 if weights.exists() else float("nan")
    vllm_path = ckpt / VLLM_EVAL_JSON
    vllm = json.loads(vllm_path.read_text()) if vllm_path.exists() else None
    stale = _differs_from_recipe(train["model"], config)
    if train.get("recipe_version", 1) != RECIPE_VERSION:
        stale.append(f"training recipe v{train.get('recipe_version', 1)} -> v{RECIPE_VERSION}")
    lines = (_card_intro(train, vllm) + _card_architecture(train, config, size_mb)
             + _card_training(train, stale) + _card_accuracy(train, vllm))
    return "\n".join(lines)


def _card_intro(train: dict, vllm: dict | None) -> list[str]:
    """The title, a warning when the model fails its own task, and what the model is."""
    measured = [v for v in ((vllm or {}).get("strict_match"),
                            (train.get("probe") or {}).get("clean", {}).get("accuracy"))
                if v is not None]
    lines = [f"# {train['model']}", ""]
    if measured and max(measured) < 0.5:
        lines += [f"> **Not usable for accuracy comparisons:** it scores {_fmt_acc(max(measured))} "
                  "on its own task (see the accuracy section). It still exercises the architecture and tokenizer.", ""]
    return lines + [
        f"A tiny `{train['architecture']}` "
        + (f"fine-tuned from `{train['base']}` ({train.get('trained_as', '')}, window "
           f"{train.get('window')} on the `sliding_attention` layers; harness/zoo/sliding.py)"
           if train.get("base") else "trained from scratch")
        + f" by the harness on the synthetic `{task.TASK_NAME}` task (harness/zoo/task.py), so "
        "that baseline-vs-P/D accuracy comparisons mean something offline. Not a language model "
        "beyond this task.",
        "",
    ]


def _card_architecture(train: dict, config: dict, size_mb: float) -> list[str]:
    arch_rows = "\n".join(f"| {k} | {config[k]} |" for k in ARCH_KEYS if k in config)
    return [
        "## Architecture",
        "",
        "| field | value |",
        "|---|---|",
        f"| parameters | {train['parameters']:,} |",
        f"| weights | bf16 safetensors, {size_mb:.1f} MB |",
        arch_rows,
        "",
        "Tokenizer: byte-level BPE trained on the task text (harness/zoo/tokenizer.py), digits split "
        "one per token, BOS added to every prompt.",
        "",
        f"Hybrid: {'yes' if train['hybrid'] else 'no'}."
        + (f" Attention block size needed by vLLM CPU: {required_block_size(train['model'], 'cpu')}."
           if train["hybrid"] else ""),
        "",
    ]


def _card_training(train: dict, stale: list[str]) -> list[str]:
    """The training table and how to rebuild the checkpoint (or that its recipe is stale)."""
    name = train["model"]
    return [
        "## Training",
        "",
        "| field | value |",
        "|---|---|",
        f"| data | gsm_synth stream, seed {train['train_seed']} (test split seed "
        f"{train['test_seed']}) |",
        f"| init seed | {train['seed']} |",
        f"| init | {_init_text(train.get('init'))} |",
        f"| steps | {train['steps_done']} x batch {train['batch_size']} (planned "
        f"{train['steps_planned']}) |",
        f"| schedule | AdamW lr {train['lr']}, warm-up {train['warmup']}, linear decay from step "
        f"{train['decay_start']}{' (started early by the time limit)' if train['schedule_cut_by_time_limit'] else ''} |",
        f"| loss | on answer tokens + EOS only; last logged {train['loss_curve'][-1][1] if train['loss_curve'] else 'n/a'} |",
        f"| device | {train['device']} ({train['device_name']}), torch {train['torch']}, "
        f"transformers {train['transformers']} |",
        f"| train wall time | {train['train_wall_s']} s |",
        "",
        (f"Rebuild: `pd-accuracy zoo build {name}` (or `{train['rebuild']}`)." if not stale else
         f"**This checkpoint predates the current recipe** (which differs in: "
         f"{', '.join(stale)}); `pd-accuracy zoo build {name}` trains the current recipe, and "
         f"this one came from `{train['rebuild']}` at the code of its time."),
        "",
    ]


def _card_accuracy(train: dict, vllm: dict | None) -> list[str]:
    """Through vLLM (when measured) and the PyTorch probe (when run)."""
    lines = ["## Accuracy", ""]
    if vllm:
        lines += [
            f"Through vLLM ({vllm.get('vllm') or 'version n/a'}), greedy, lm-eval "
            f"`{task.TASK_NAME}` {vllm['num_fewshot']}-shot, n = {vllm['n']}: strict-match "
            f"**{_fmt_acc(vllm['strict_match'])}**, flexible-extract "
            f"{_fmt_acc(vllm['flexible_extract'])}.",
            "",
        ]
        if vllm.get("command"):
            lines += ["```", vllm["command"], "```", ""]
    else:
        lines += ["Through vLLM: not measured yet.", ""]
    probe = train.get("probe")
    if probe:
        lines += [
            "PyTorch probe (transformers generate, greedy, first test docs), with the K and V of "
            "one 128-token prompt block zeroed in every attention layer:",
            "",
            "| condition | n | strict-match |",
            "|---|---|---|",
        ]
        for key, res in probe.items():
            lines.append(f"| {key.replace('_', ' ')} | {res['n']} | {_fmt_acc(res['accuracy'])} |")
        lines.append("")
    return lines


def _differs_from_recipe(name: str, config: dict) -> list[str]:
    """Config fields where a checkpoint differs from the current recipe of its zoo name."""
    from harness.zoo.models import SPECS

    spec = SPECS.get(name)
    if spec is None:
        return []
    # compare with the config transformers builds from the recipe, not the raw kwargs: it
    # normalises some fields (Granite's layer_types "mamba" is saved as "linear_attention")
    built = spec.make_config().to_dict()
    return sorted(k for k, v in spec.config_kwargs.items()
                  if k in config and not isinstance(v, dict) and config[k] != built.get(k, v))


def write_card(checkpoint: str | Path, cards_dir: str | Path = CARDS_DIR) -> Path:
    """Render the card of `checkpoint` into cards_dir/<name>.md and return its path."""
    train = json.loads((Path(checkpoint) / TRAINING_JSON).read_text())
    if train.get("recipe") == "eagle-head":     # a draft head: harness/zoo/eagle.py's card
        from harness.zoo import eagle

        text = eagle.render_card(checkpoint)
    elif train.get("recipe") == "mtp-head":     # the target with an MTP head: harness/zoo/mtp.py
        from harness.zoo import mtp

        text = mtp.render_card(checkpoint)
    else:
        text = render_card(checkpoint)
    name = train["model"]
    return atomic_write_text(Path(cards_dir) / f"{name}.md", text)


def _init_text(init: dict | None) -> str:
    """The weight-init row: transformers' default, or the previous-token head (harness/zoo/init.py)."""
    if not init or init.get("init", "default") == "default":
        return "transformers default (normal, std 0.02)"
    if "layer" not in init:                     # e.g. "fine-tuned from tiny-llama-gsm"
        return str(init["init"])
    if "head" in init:                          # MLA: one query head, the shared rope key
        return (f"{init['init']}: layer {init['layer']} query head {init['head']} attends to the "
                f"previous token by RoPE phase against the shared rope key k_pe ({init['pairs']} "
                f"rotary pairs, {init['gap_logits']:g}-logit margin; harness/zoo/init.py)")
    return (f"{init['init']}: layer {init['layer']} KV head {init['kv_head']} attends to the previous "
            f"token by RoPE phase ({init['pairs']} rotary pairs, {init['gap_logits']:g}-logit margin; "
            f"harness/zoo/init.py)")
