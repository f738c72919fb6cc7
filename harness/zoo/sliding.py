"""The sliding-window zoo model: tiny-llama-gsm fine-tuned with local attention on alternate
layers, served by vLLM as a Llama whose config says which layers slide.

    python -m harness.zoo.sliding --out DIR [--device cuda] [--steps N] [--time-limit S]

Why fine-tune, and why through Qwen2: transformers' Llama has no per-layer sliding window, but
its Qwen2 does (`layer_types` + `sliding_window`, the masks vLLM applies), and a Qwen2 with zero
q/k/v biases is a Llama. So the trained tiny-llama-gsm weights are loaded into that Qwen2, the
biases are zeroed and frozen, the model is trained with the window on, and the weights are saved
back under the Llama names with `layer_types`/`sliding_window` in config.json, which vLLM's
Llama reads (0.32: `layer_types: sliding_attention` layers get the window). The window is live
in vLLM: the unchanged weights with it lose nearly every answer (docs/zoo.md), so the lookups
must be re-learnt. From scratch, plain Llama inits never learnt the lookups
(harness/zoo/init.py); starting from the trained model sidesteps that.

The window (64 tokens) is far smaller than a prompt (429-485 tokens, four 128-token blocks), so
a sliding layer's window ends inside the price list and its older blocks are dead weight the
decode need not hold: the class of upstream bug (#37333) where P and D disagree on them.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from harness.core.atomic import atomic_write_text
from harness.zoo import task

from harness.zoo.models import SWA_LAYER_TYPES, SWA_WINDOW, get_spec

NAME = "tiny-llama-swa-gsm"
BASE = "tiny-llama-gsm"
WINDOW = SWA_WINDOW
LAYER_TYPES = tuple(SWA_LAYER_TYPES)
_SPEC = get_spec(NAME)
RECIPE = dict(steps=_SPEC.steps, batch_size=_SPEC.batch_size, lr=_SPEC.lr, warmup=_SPEC.warmup)


def qwen2_config(base: dict, window: int = WINDOW, layer_types=LAYER_TYPES):
    """A Qwen2 config with the Llama checkpoint's shapes and the sliding layers switched on."""
    import transformers

    if len(layer_types) != base["num_hidden_layers"]:
        raise ValueError(f"{len(layer_types)} layer types for {base['num_hidden_layers']} layers")
    config = transformers.Qwen2Config(
        vocab_size=base["vocab_size"], hidden_size=base["hidden_size"],
        intermediate_size=base["intermediate_size"], num_hidden_layers=base["num_hidden_layers"],
        num_attention_heads=base["num_attention_heads"],
        num_key_value_heads=base["num_key_value_heads"], head_dim=base.get("head_dim", 64),
        max_position_embeddings=base["max_position_embeddings"], rms_norm_eps=base["rms_norm_eps"],
        tie_word_embeddings=False, rope_parameters=base.get("rope_parameters"),
        use_sliding_window=True, sliding_window=window, max_window_layers=0,
        layer_types=list(layer_types), bos_token_id=base["bos_token_id"],
        eos_token_id=base["eos_token_id"], pad_token_id=base["pad_token_id"])
    config.architectures = ["Qwen2ForCausalLM"]
    return config


def llama_config(base: dict, window: int = WINDOW, layer_types=LAYER_TYPES) -> dict:
    """The served config: the base Llama's, plus which layers slide and how far."""
    return {**base, "layer_types": list(layer_types), "sliding_window": window,
            "dtype": "bfloat16"}


def training_model(base_dir: Path, window: int = WINDOW, layer_types=LAYER_TYPES):
    """The base Llama's weights in a sliding-window Qwen2, q/k/v biases zero and frozen."""
    import torch
    import transformers
    from safetensors.torch import load_file

    base = json.loads((base_dir / "config.json").read_text())
    model = transformers.Qwen2ForCausalLM._from_config(
        qwen2_config(base, window, layer_types), attn_implementation="eager",
        dtype=torch.float32)
    weights = {k: v.float() for k, v in load_file(str(base_dir / "model.safetensors")).items()}
    result = model.load_state_dict(weights, strict=False)
    not_biases = [k for k in result.missing_keys if not k.endswith("proj.bias")]
    if not_biases or result.unexpected_keys:
        raise ValueError(f"base weights do not fit: missing {not_biases}, "
                         f"unexpected {result.unexpected_keys}")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("proj.bias"):
                param.zero_()
                param.requires_grad_(False)
    return model, base


def export(model, base: dict, base_dir: Path, out: Path, window: int = WINDOW,
           layer_types=LAYER_TYPES) -> None:
    """Save `model` as the served Llama checkpoint (bf16, no biases) with the tokenizer."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
             if not k.endswith("proj.bias")}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    atomic_write_text(out / "config.json",
                      json.dumps(llama_config(base, window, layer_types), indent=2,
                                 sort_keys=True) + "\n")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (base_dir / name).exists():
            shutil.copyfile(base_dir / name, out / name)


def fine_tune(out_dir: str | Path, *, device: str = "cpu", steps: int = RECIPE["steps"],
              batch_size: int = RECIPE["batch_size"], lr: float = RECIPE["lr"],
              warmup: int = RECIPE["warmup"], time_limit_s: float | None = None,
              probe_n: int = 0, workers: int = 2, seed: int = 0, log_every: int = 50,
              base_dir: Path | None = None) -> dict:
    """Fine-tune, export into `out_dir`, write training.json; returns the training record."""
    import platform

    import torch
    import transformers

    from harness.zoo.data import BatchStream, LineTokenCache
    from harness.zoo.probe import probe
    from harness.zoo.registry import CHECKPOINTS_DIR
    from harness.zoo.train import RECIPE_VERSION, _set_determinism, lr_at

    base_dir = Path(base_dir or CHECKPOINTS_DIR / BASE)
    out = Path(out_dir)
    started = time.monotonic()
    _set_determinism(seed, device)
    model, base = training_model(base_dir)
    model.to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    stream = BatchStream(base_dir / "tokenizer.json", task.TRAIN_SEED, batch_size, steps, 0)
    loader = torch.utils.data.DataLoader(stream, batch_size=None, num_workers=workers,
                                         prefetch_factor=4 if workers else None)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda"
                else torch.autocast("cpu", enabled=False))
    decay, total, losses, done = int(steps * 0.75), steps, [], 0
    model.train()
    t0 = time.monotonic()
    for step, (input_ids, labels) in enumerate(loader):
        elapsed = time.monotonic() - t0
        if step >= total or (time_limit_s is not None and elapsed >= time_limit_s):
            break
        if time_limit_s is not None and 0 < step < decay and elapsed >= 0.75 * time_limit_s:
            decay, total = step, min(total, step + max(10, int(0.9 * (time_limit_s - elapsed)
                                                                / (elapsed / step))))
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, base_lr=lr, warmup=warmup, decay_start=decay, total=total)
        with autocast:
            loss = model(input_ids=input_ids.to(device), labels=labels.to(device)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        done += 1
        if step % log_every == 0:
            losses.append((step, round(float(loss.detach()), 5)))
            print(json.dumps({"event": "step", "step": step, "loss": losses[-1][1],
                              "elapsed_s": round(time.monotonic() - t0, 1)}), flush=True)
    model.eval()
    export(model, base, base_dir, out)
    record = {"model": NAME, "recipe_version": RECIPE_VERSION, "architecture": "LlamaForCausalLM",
              "hybrid": False, "parameters": sum(p.numel() for p in model.parameters()
                                                 if p.requires_grad),
              "task": task.TASK_NAME, "train_seed": task.TRAIN_SEED, "test_seed": task.TEST_SEED,
              "base": BASE, "window": WINDOW, "layer_types": list(LAYER_TYPES),
              "init": {"init": f"fine-tuned from {BASE}"},
              "trained_as": "Qwen2ForCausalLM (zero, frozen q/k/v biases)",
              "served_as": "LlamaForCausalLM", "steps_planned": steps, "steps_done": done,
              "decay_start": decay, "steps_total": total, "batch_size": batch_size, "lr": lr,
              "warmup": warmup, "seed": seed, "curriculum_steps": 0,
              "schedule_cut_by_time_limit": done < steps, "device": device,
              "device_name": (torch.cuda.get_device_name() if device == "cuda"
                              else platform.processor() or platform.machine()),
              "torch": torch.__version__, "transformers": transformers.__version__,
              "train_wall_s": round(time.monotonic() - t0, 1), "loss_curve": losses,
              "rebuild": f"python -m harness.zoo.sliding --out DIR --device {device} "
                         f"--steps {total} --batch-size {batch_size} --lr {lr}"}
    if probe_n:
        record["probe"] = probe(model, LineTokenCache(out / "tokenizer.json"), device=device,
                                n=probe_n)
        print(json.dumps({"event": "probe", **{k: v["accuracy"]
                                               for k, v in record["probe"].items()}}), flush=True)
    record["total_wall_s"] = round(time.monotonic() - started, 1)
    atomic_write_text(out / "training.json", json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.zoo.sliding", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=RECIPE["steps"])
    parser.add_argument("--batch-size", type=int, default=RECIPE["batch_size"])
    parser.add_argument("--lr", type=float, default=RECIPE["lr"])
    parser.add_argument("--time-limit", type=float, default=None)
    parser.add_argument("--probe-n", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    record = fine_tune(args.out, device=args.device, steps=args.steps,
                       batch_size=args.batch_size, lr=args.lr, time_limit_s=args.time_limit,
                       probe_n=args.probe_n, workers=args.workers)
    print(json.dumps({"event": "done", "steps_done": record["steps_done"],
                      "train_wall_s": record["train_wall_s"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
