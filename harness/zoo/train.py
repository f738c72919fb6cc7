"""Train one zoo model on gsm_synth from scratch and save it as a bf16 safetensors checkpoint.

    python -m harness.zoo.train --model tiny-llama-gsm --out DIR [--device cuda|cpu] [--steps N]

Seeded and as deterministic as torch allows: the init comes from `--seed`, batch `k` is a pure
function of (task seed, k, batch size), and the learning-rate schedule (linear warm-up, constant,
linear decay over the last quarter) is fixed by the step count. `--time-limit` is a safety net for
the shared GPU: past 75% of it the decay starts early, and the schedule actually run is written to
training.json so `--steps S --decay-start D` replays it exactly.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

from harness.core.atomic import atomic_write_text
from harness.zoo import task
from harness.zoo.init import INIT_CHOICES
from harness.zoo.models import get_spec
from harness.zoo.tokenizer import save_tokenizer

DECAY_FRACTION = 0.25
# Bumped whenever the data or optimisation changes what a given (model, steps, seed) produces;
# 1: one question per sequence; 2: several questions per price list, mixed price-list lengths;
# 3: eager attention in training (deterministic backward); 4: price token right after the item
# token (catalog "- apples 7 dollars per box", digits keep their leading space); 5: a curriculum of
# short price lists first; 6: `--init prev-token` (harness/zoo/init.py) for the dense Llama.
RECIPE_VERSION = 6
TRAINING_JSON = "training.json"


def lr_at(step: int, *, base_lr: float, warmup: int, decay_start: int, total: int) -> float:
    """WSD schedule: linear warm-up, constant, linear decay to 0 at `total`."""
    if step < warmup:
        return base_lr * (step + 1) / warmup
    if step < decay_start:
        return base_lr
    return base_lr * max(0.0, (total - step) / max(1, total - decay_start))


def _set_determinism(seed: int, device: str) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if device == "cuda":
        torch.cuda.manual_seed_all(seed)
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)


def train(name: str, out_dir: str | Path, *, device: str = "cpu", steps: int | None = None,
          batch_size: int | None = None, lr: float | None = None, seed: int | None = None,
          decay_start: int | None = None, stop_after: int | None = None,
          time_limit_s: float | None = None, probe_n: int = 0, workers: int = 2,
          log_every: int = 50, attn_implementation: str = "eager",
          config_overrides: dict | None = None, curriculum_steps: int | None = None,
          init: str | None = None) -> dict:
    """Train `name`, save the checkpoint into `out_dir`, return the training record."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    import transformers

    from harness.zoo.data import BatchStream, LineTokenCache
    from harness.zoo.probe import probe

    spec = get_spec(name)
    if config_overrides:
        import dataclasses

        spec = dataclasses.replace(spec, config_kwargs={**spec.config_kwargs, **config_overrides})
    steps = spec.steps if steps is None else steps
    batch_size = batch_size or spec.batch_size
    lr = lr or spec.lr
    seed = spec.seed if seed is None else seed
    curriculum_steps = spec.curriculum_steps if curriculum_steps is None else curriculum_steps
    init = init or spec.init
    planned_decay = int(steps * (1 - DECAY_FRACTION)) if decay_start is None else decay_start
    warmup = min(spec.warmup, max(1, steps // 10))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    save_tokenizer(out)
    _set_determinism(seed, device)
    config = spec.make_config()
    # Eager attention: the fused SDPA backward kernels (cuDNN, flash, mem-efficient) are not
    # deterministic on CUDA, and two same-seed runs drifted apart within a few hundred steps.
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation).to(device)
    init_record = {"init": "default"}
    if init == "prev-token":
        from harness.zoo.init import add_previous_token_head

        init_record = add_previous_token_head(model)
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95),
                                  weight_decay=0.01, eps=1e-8)
    stream = BatchStream(out / "tokenizer.json", task.TRAIN_SEED, batch_size, steps,
                         curriculum_steps)
    loader = torch.utils.data.DataLoader(
        stream, batch_size=None, shuffle=False, num_workers=workers,
        prefetch_factor=4 if workers else None, persistent_workers=False)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda"
                else torch.autocast("cpu", enabled=False))

    print(json.dumps({"event": "start", "model": name, "params": n_params, "steps": steps,
                      "batch_size": batch_size, "device": device}), flush=True)
    model.train()
    losses: list[tuple[int, float]] = []
    total = steps
    decay = planned_decay
    time_cut = False
    train_started = time.monotonic()
    steps_done = 0
    for step, (input_ids, labels) in enumerate(loader):
        if step >= total or (stop_after is not None and step >= stop_after):
            break
        elapsed = time.monotonic() - train_started
        if time_limit_s is not None:
            if elapsed >= time_limit_s:
                time_cut = True
                break
            if 0 < step < decay and elapsed >= 0.75 * time_limit_s:
                # Out of time: start the decay now, sized to end inside the limit.
                per_step = elapsed / step
                remaining = int(0.9 * (time_limit_s - elapsed) / per_step)
                decay, total = step, min(total, step + max(10, remaining))
                time_cut = True
                print(json.dumps({"event": "early_decay", "step": step, "total": total}),
                      flush=True)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, base_lr=lr, warmup=warmup, decay_start=decay, total=total)
        input_ids = input_ids.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with autocast:
            loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps_done += 1
        if step % log_every == 0 or step == total - 1:
            value = float(loss.detach())
            losses.append((step, round(value, 5)))
            print(json.dumps({"event": "step", "step": step, "loss": round(value, 4),
                              "lr": optimizer.param_groups[0]["lr"],
                              "elapsed_s": round(time.monotonic() - train_started, 1)}),
                  flush=True)
    train_wall = time.monotonic() - train_started

    record = {
        "model": name,
        "recipe_version": RECIPE_VERSION,
        "architecture": spec.architecture,
        "hybrid": spec.hybrid,
        "parameters": n_params,
        "seed": seed,
        "task": task.TASK_NAME,
        "train_seed": task.TRAIN_SEED,
        "test_seed": task.TEST_SEED,
        "batch_size": batch_size,
        "lr": lr,
        "warmup": warmup,
        "curriculum_steps": curriculum_steps,
        "init": init_record,
        "steps_planned": steps,
        "steps_done": steps_done,
        "steps_total": total,
        "decay_start": decay,
        "schedule_cut_by_time_limit": time_cut,
        "train_wall_s": round(train_wall, 1),
        "device": device,
        "device_name": (torch.cuda.get_device_name() if device == "cuda" else platform.processor()
                        or platform.machine()),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn_implementation": attn_implementation,
        "config_overrides": config_overrides or {},
        "loss_curve": losses,
        "rebuild": (f"python -m harness.zoo.train --model {name} --out DIR --device {device} "
                    f"--steps {total} --decay-start {decay} --batch-size {batch_size} "
                    f"--seed {seed}" + (f" --stop-after {steps_done}" if steps_done < total
                                        else "")
                    + f" --lr {lr} --curriculum-steps {curriculum_steps} --init {init}"
                    + "".join(" --set " + shlex.quote(f"{k}={json.dumps(v, separators=(',', ':'))}")
                              for k, v in (config_overrides or {}).items())),
    }
    model.eval()
    # Save before probing, so a probe cut short by a hard time limit still leaves the model.
    model.save_pretrained(str(out), safe_serialization=True,
                          state_dict={k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    # save_pretrained records the live (fp32) dtype; the weights on disk are bf16.
    config_path = out / "config.json"
    saved_config = json.loads(config_path.read_text())
    saved_config["dtype"] = "bfloat16"
    atomic_write_text(config_path, json.dumps(saved_config, indent=2, sort_keys=True) + "\n")
    record["total_wall_s"] = round(time.monotonic() - started, 1)
    atomic_write_text(out / TRAINING_JSON, json.dumps(record, indent=2) + "\n")
    if probe_n:
        probe_started = time.monotonic()
        record["probe"] = probe(model, LineTokenCache(out / "tokenizer.json"), device=device,
                                n=probe_n)
        record["probe_wall_s"] = round(time.monotonic() - probe_started, 1)
        print(json.dumps({"event": "probe", **{k: v["accuracy"] for k, v in
                                               record["probe"].items()}}), flush=True)
        record["total_wall_s"] = round(time.monotonic() - started, 1)
        atomic_write_text(out / TRAINING_JSON, json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.zoo.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--decay-start", type=int, default=None)
    parser.add_argument("--stop-after", type=int, default=None,
                        help="stop after this many steps (the schedule still spans --steps)")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds of training")
    parser.add_argument("--probe-n", type=int, default=0,
                        help="test docs for the PyTorch accuracy / zeroed-block probe (0: skip)")
    parser.add_argument("--workers", type=int, default=2, help="data-loader processes")
    parser.add_argument("--attn-implementation", default="eager",
                        help="transformers attention kernel for training (eager: deterministic)")
    parser.add_argument("--curriculum-steps", type=int, default=None,
                        help="steps on short price lists before the full mix (default: the spec's)")
    parser.add_argument("--init", choices=INIT_CHOICES, default=None,
                        help="weight init (default: the spec's; prev-token: harness/zoo/init.py)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                        help="override one config field of the spec (value parsed as JSON)")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            parser.error(f"--set {item}: the value must be JSON")
    record = train(args.model, args.out, device=args.device, steps=args.steps,
                   batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                   decay_start=args.decay_start, stop_after=args.stop_after,
                   time_limit_s=args.time_limit,
                   probe_n=args.probe_n, workers=args.workers,
                   attn_implementation=args.attn_implementation,
                   config_overrides=overrides, curriculum_steps=args.curriculum_steps,
                   init=args.init)
    print(json.dumps({"event": "done", "out": str(args.out), "steps_done": record["steps_done"],
                      "train_wall_s": record["train_wall_s"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
