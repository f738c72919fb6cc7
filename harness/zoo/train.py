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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.core.atomic import atomic_write_text
from harness.zoo import task
from harness.zoo.init import INIT_CHOICES
from harness.zoo.models import ZooSpec, get_spec
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


@dataclass(frozen=True)
class Recipe:
    """One training run's settings: the zoo spec's, overridden by what the caller gave."""

    name: str
    spec: ZooSpec
    device: str
    steps: int
    batch_size: int
    lr: float
    seed: int
    decay_start: int
    warmup: int
    curriculum_steps: int
    init: str
    attn_implementation: str
    config_overrides: dict

    @classmethod
    def of(cls, name: str, *, device: str, steps: int | None, batch_size: int | None,
           lr: float | None, seed: int | None, decay_start: int | None,
           curriculum_steps: int | None, init: str | None, attn_implementation: str,
           config_overrides: dict | None) -> "Recipe":
        spec = get_spec(name)
        if config_overrides:
            spec = replace(spec, config_kwargs={**spec.config_kwargs, **config_overrides})
        steps = spec.steps if steps is None else steps
        return cls(name=name, spec=spec, device=device, steps=steps,
                   batch_size=batch_size or spec.batch_size, lr=lr or spec.lr,
                   seed=spec.seed if seed is None else seed,
                   decay_start=(int(steps * (1 - DECAY_FRACTION)) if decay_start is None
                                else decay_start),
                   warmup=min(spec.warmup, max(1, steps // 10)),
                   curriculum_steps=(spec.curriculum_steps if curriculum_steps is None
                                     else curriculum_steps),
                   init=init or spec.init, attn_implementation=attn_implementation,
                   config_overrides=config_overrides or {})

    def rebuild(self, schedule: "Schedule") -> str:
        """The command line that replays the schedule actually run."""
        return (f"python -m harness.zoo.train --model {self.name} --out DIR --device {self.device} "
                f"--steps {schedule.total} --decay-start {schedule.decay} --batch-size {self.batch_size} "
                f"--seed {self.seed}" + (f" --stop-after {schedule.steps_done}"
                                         if schedule.steps_done < schedule.total else "")
                + f" --lr {self.lr} --curriculum-steps {self.curriculum_steps} --init {self.init}"
                + "".join(" --set " + shlex.quote(f"{k}={json.dumps(v, separators=(',', ':'))}")
                          for k, v in self.config_overrides.items()))


@dataclass
class Schedule:
    """The schedule as run: a time limit may start the decay early and shorten it."""

    total: int
    decay: int
    time_cut: bool = False
    steps_done: int = 0
    train_wall_s: float = 0.0
    losses: list[tuple[int, float]] = field(default_factory=list)


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
    recipe = Recipe.of(name, device=device, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                       decay_start=decay_start, curriculum_steps=curriculum_steps, init=init,
                       attn_implementation=attn_implementation,
                       config_overrides=config_overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    save_tokenizer(out)
    _set_determinism(recipe.seed, device)
    model, init_record = _new_model(recipe)
    n_params = sum(p.numel() for p in model.parameters())
    schedule = _run_schedule(recipe, model, out, n_params, stop_after=stop_after,
                             time_limit_s=time_limit_s, workers=workers, log_every=log_every)
    record = _training_record(recipe, schedule, n_params, init_record)
    model.eval()
    _save_checkpoint(model, out)
    record["total_wall_s"] = round(time.monotonic() - started, 1)
    atomic_write_text(out / TRAINING_JSON, json.dumps(record, indent=2) + "\n")
    if probe_n:
        _probe_into(record, model, out, device, probe_n)
        record["total_wall_s"] = round(time.monotonic() - started, 1)
        atomic_write_text(out / TRAINING_JSON, json.dumps(record, indent=2) + "\n")
    return record


def _new_model(recipe: Recipe) -> tuple[Any, dict]:
    """The model, freshly initialised from the seed, and how its init was done."""
    import transformers

    config = recipe.spec.make_config()
    # Eager attention: the fused SDPA backward kernels (cuDNN, flash, mem-efficient) are not
    # deterministic on CUDA, and two same-seed runs drifted apart within a few hundred steps.
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=recipe.attn_implementation).to(recipe.device)
    init_record = {"init": "default"}
    if recipe.init == "prev-token":
        from harness.zoo.init import add_previous_token_head

        init_record = add_previous_token_head(model)
    return model, init_record


def _run_schedule(recipe: Recipe, model: Any, out: Path, n_params: int, *,
                  stop_after: int | None, time_limit_s: float | None, workers: int,
                  log_every: int) -> Schedule:
    """The training loop: AdamW on the task's batch stream, the WSD learning rate per step."""
    import torch

    from harness.zoo.data import BatchStream

    device = recipe.device
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95),
                                  weight_decay=0.01, eps=1e-8)
    stream = BatchStream(out / "tokenizer.json", task.TRAIN_SEED, recipe.batch_size,
                         recipe.steps, recipe.curriculum_steps)
    loader = torch.utils.data.DataLoader(
        stream, batch_size=None, shuffle=False, num_workers=workers,
        prefetch_factor=4 if workers else None, persistent_workers=False)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda"
                else torch.autocast("cpu", enabled=False))
    print(json.dumps({"event": "start", "model": recipe.name, "params": n_params,
                      "steps": recipe.steps, "batch_size": recipe.batch_size, "device": device}),
          flush=True)
    model.train()
    schedule = Schedule(total=recipe.steps, decay=recipe.decay_start)
    train_started = time.monotonic()
    for step, (input_ids, labels) in enumerate(loader):
        if step >= schedule.total or (stop_after is not None and step >= stop_after):
            break
        if not _within_time_limit(schedule, step, time.monotonic() - train_started, time_limit_s):
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, base_lr=recipe.lr, warmup=recipe.warmup,
                                decay_start=schedule.decay, total=schedule.total)
        input_ids = input_ids.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with autocast:
            loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.steps_done += 1
        if step % log_every == 0 or step == schedule.total - 1:
            value = float(loss.detach())
            schedule.losses.append((step, round(value, 5)))
            print(json.dumps({"event": "step", "step": step, "loss": round(value, 4),
                              "lr": optimizer.param_groups[0]["lr"],
                              "elapsed_s": round(time.monotonic() - train_started, 1)}),
                  flush=True)
    schedule.train_wall_s = time.monotonic() - train_started
    return schedule


def _within_time_limit(schedule: Schedule, step: int, elapsed: float,
                       time_limit_s: float | None) -> bool:
    """False once the time limit is spent; past 75 % of it, the decay starts now, sized to end
    inside the limit (`schedule` is shortened in place)."""
    if time_limit_s is None:
        return True
    if elapsed >= time_limit_s:
        schedule.time_cut = True
        return False
    if 0 < step < schedule.decay and elapsed >= 0.75 * time_limit_s:
        per_step = elapsed / step
        remaining = int(0.9 * (time_limit_s - elapsed) / per_step)
        schedule.decay, schedule.total = step, min(schedule.total, step + max(10, remaining))
        schedule.time_cut = True
        print(json.dumps({"event": "early_decay", "step": step, "total": schedule.total}),
              flush=True)
    return True


def _training_record(recipe: Recipe, schedule: Schedule, n_params: int,
                     init_record: dict) -> dict:
    import torch
    import transformers

    device = recipe.device
    return {
        "model": recipe.name,
        "recipe_version": RECIPE_VERSION,
        "architecture": recipe.spec.architecture,
        "hybrid": recipe.spec.hybrid,
        "parameters": n_params,
        "seed": recipe.seed,
        "task": task.TASK_NAME,
        "train_seed": task.TRAIN_SEED,
        "test_seed": task.TEST_SEED,
        "batch_size": recipe.batch_size,
        "lr": recipe.lr,
        "warmup": recipe.warmup,
        "curriculum_steps": recipe.curriculum_steps,
        "init": init_record,
        "steps_planned": recipe.steps,
        "steps_done": schedule.steps_done,
        "steps_total": schedule.total,
        "decay_start": schedule.decay,
        "schedule_cut_by_time_limit": schedule.time_cut,
        "train_wall_s": round(schedule.train_wall_s, 1),
        "device": device,
        "device_name": (torch.cuda.get_device_name() if device == "cuda" else platform.processor()
                        or platform.machine()),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "attn_implementation": recipe.attn_implementation,
        "config_overrides": recipe.config_overrides,
        "loss_curve": schedule.losses,
        "rebuild": recipe.rebuild(schedule),
    }


def _save_checkpoint(model: Any, out: Path) -> None:
    """bf16 safetensors, saved before probing: a probe cut short by a hard time limit still
    leaves the model."""
    import torch

    model.save_pretrained(str(out), safe_serialization=True,
                          state_dict={k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    # save_pretrained records the live (fp32) dtype; the weights on disk are bf16.
    config_path = out / "config.json"
    saved_config = json.loads(config_path.read_text())
    saved_config["dtype"] = "bfloat16"
    atomic_write_text(config_path, json.dumps(saved_config, indent=2, sort_keys=True) + "\n")


def _probe_into(record: dict, model: Any, out: Path, device: str, probe_n: int) -> None:
    from harness.zoo.data import LineTokenCache
    from harness.zoo.probe import probe

    probe_started = time.monotonic()
    record["probe"] = probe(model, LineTokenCache(out / "tokenizer.json"), device=device, n=probe_n)
    record["probe_wall_s"] = round(time.monotonic() - probe_started, 1)
    print(json.dumps({"event": "probe", **{k: v["accuracy"] for k, v in
                                           record["probe"].items()}}), flush=True)


def schedule_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every zoo trainer takes (this one, harness.zoo.eagle's): what to train,
    where, and its schedule; unset ones take the model's ZooSpec."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.zoo.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    schedule_arguments(parser)
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
