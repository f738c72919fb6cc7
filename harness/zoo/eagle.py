"""An EAGLE head for a zoo target (vLLM's ``eagle`` speculative method), trained on the target's
own hidden states.

    python -m harness.zoo.eagle --model tiny-llama-gsm-eagle --out DIR [--device cuda|cpu]

The head is what vLLM's ``EagleLlamaForCausalLM`` (vllm/model_executor/models/llama_eagle.py)
runs: at position i it takes the embedding of token i+1 and the target's last hidden state at i
(after the target's final norm), concatenates them, projects them back with ``fc`` and runs one
Llama decoder layer without its input norm; the result goes through the target's lm_head (no
norm) to draft token i+2, and is the hidden state of the next draft step. The embedding and the
lm_head are the target's: the checkpoint holds neither, so vLLM shares the target's.

The head has one attention layer of its own, with the target's page (2 KV heads of 64): vLLM
adds it to the server's KV cache after the target's layers (``model.layers.<target layers>``), so
a P/D pair whose both sides run the head moves its KV with the target's.

Trained with the target frozen (EAGLE's recipe): cross-entropy towards the target's own greedy
next token on the answer positions, plus a smooth-L1 regression of the head's output onto the
target's next hidden state (what the next draft step reads). The checkpoint is a Llama config of
one layer (vLLM maps LlamaForCausalLM to EagleLlamaForCausalLM under ``method: eagle``) and bf16
weights under EAGLE's names (``fc.weight``, ``layers.0.*``).

The losses, the loop, the probe and the options are shared with the zoo's MTP head
(harness/zoo/mtp.py): a ``HeadKind`` says what differs (config, module, checkpoint, card).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness.core.atomic import atomic_write_text
from harness.zoo import task
from harness.zoo.models import ZooSpec, get_spec

RECIPE = "eagle-head"
TRAINING_JSON = "training.json"
FEATURE_WEIGHT = 1.0      # smooth-L1 on the next hidden state, next to the token loss
LOG_EVERY = 50


@dataclass(frozen=True)
class HeadKind:
    """What differs between the draft heads this trainer trains; the losses, the loop and the
    probe are the same (the head maps [embedding of token i+1, the target's hidden state at i]
    to the hidden state that drafts token i+2)."""
    recipe: str                                  # ZooSpec.recipe
    module: str                                  # python -m <module> rebuilds it
    config: Callable[[ZooSpec], dict]            # the checkpoint's config.json
    build: Callable[[dict], Any]                 # the head's module, from that config
    save: Callable[[Any, dict, Path, ZooSpec], None]   # weights and config.json into a dir
    probe_key: str                               # training.json's key of the probe


def _torch():
    import torch

    return torch


def _dims(config: dict) -> tuple[int, int, int, int, int, float, float]:
    """(hidden, heads, KV heads, head dim, MLP, norm eps, rope theta) of a Llama config."""
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    return (hidden, heads, int(config["num_key_value_heads"]),
            int(config.get("head_dim") or hidden // heads), int(config["intermediate_size"]),
            float(config.get("rms_norm_eps", 1e-6)),
            float((config.get("rope_parameters") or {}).get("rope_theta")
                  or config.get("rope_theta", 10000.0)))


def decoder_layer(config: dict) -> Any:
    """One Llama decoder layer without its input norm (EAGLE's first layer), under the
    parameter names vLLM's loader reads (``self_attn.q_proj.weight``, ...)."""
    torch = _torch()
    nn = torch.nn
    hidden, heads, kv_heads, head_dim, mlp, eps, _ = _dims(config)

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden))

        def forward(self, x):
            var = x.float().pow(2).mean(-1, keepdim=True)
            return (x.float() * torch.rsqrt(var + eps)).to(x.dtype) * self.weight

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
            self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
            self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
            self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            q = self.q_proj(x).view(b, t, heads, head_dim).transpose(1, 2)
            k = self.k_proj(x).view(b, t, kv_heads, head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, t, kv_heads, head_dim).transpose(1, 2)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(out.transpose(1, 2).reshape(b, t, heads * head_dim))

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate_proj = nn.Linear(hidden, mlp, bias=False)
            self.up_proj = nn.Linear(hidden, mlp, bias=False)
            self.down_proj = nn.Linear(mlp, hidden, bias=False)

        def forward(self, x):
            return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):   # Llama's decoder layer; EAGLE drops its input norm
        def __init__(self) -> None:
            super().__init__()
            self.self_attn = Attention()
            self.mlp = MLP()
            self.post_attention_layernorm = RMSNorm()

        def forward(self, x, cos, sin):
            x = x + self.self_attn(x, cos, sin)
            return x + self.mlp(self.post_attention_layernorm(x))

    return Layer()


def build_head(config: dict) -> Any:
    """The EAGLE head of a Llama config (dict of config.json): its parameters carry the names
    vLLM's EAGLE loader reads (``fc.weight``, ``layers.0.self_attn.q_proj.weight``, ...)."""
    torch = _torch()
    nn = torch.nn
    hidden, _, _, head_dim, _, _, theta = _dims(config)

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(2 * hidden, hidden, bias=False)
            self.layers = nn.ModuleList([decoder_layer(config)])
            inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
            self.register_buffer("inv_freq", inv_freq, persistent=False)

        def forward(self, embeds, hidden_states):
            """embeds of tokens 1..n, the target's hidden states at 0..n-1 -> the head's output
            at 0..n-1 (positions 0..n-1)."""
            t = embeds.shape[1]
            freqs = torch.outer(torch.arange(t, device=embeds.device).float(), self.inv_freq)
            angles = torch.cat((freqs, freqs), dim=-1)
            cos, sin = angles.cos()[None, None], angles.sin()[None, None]
            x = self.fc(torch.cat((embeds, hidden_states), dim=-1))
            for layer in self.layers:
                x = layer(x, cos, sin)
            return x

    return Head()


def _rope(x, cos, sin):
    """Llama's (neox-style) rotary embedding: halves rotated, as vLLM and transformers do."""
    torch = _torch()
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def head_config(spec: ZooSpec) -> dict:
    """config.json of the head: the spec's Llama config (one layer)."""
    config = spec.make_config().to_dict()
    config["architectures"] = [spec.architecture]
    config["dtype"] = "bfloat16"
    return config


def load_target(name: str, device: str):
    """The frozen target (transformers), fp32."""
    import transformers

    from harness.zoo import registry

    model = transformers.AutoModelForCausalLM.from_pretrained(
        registry.resolve_model(name), dtype=_torch().float32, attn_implementation="eager")
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def head_losses(head, target, input_ids, answer_mask):
    """(token loss, feature loss, accepted, answer positions) of one batch: the head drafts
    token i+2 from token i+1 and the target's hidden state at i, towards the target's greedy
    choice there; ``answer_mask[b, j]``: position j holds an answer token (its logits count)."""
    torch = _torch()
    from harness.zoo.tokenizer import PAD_ID

    with torch.no_grad():
        hidden = target.model(input_ids=input_ids,
                              use_cache=False).last_hidden_state          # post-norm
        greedy = target.lm_head(hidden).argmax(-1)                          # target's next token
        embeds = target.model.embed_tokens(input_ids)
    out = head(embeds[:, 1:], hidden[:, :-1])                                # positions 0..n-2
    logits = target.lm_head(out[:, :-1])                                      # drafts of i+2
    wanted = greedy[:, 1:-1]                                                  # target at i+1
    mask = answer_mask[:, 2:]
    ce = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), wanted,
                                           reduction="none")
    token_loss = (ce * mask).sum() / mask.sum().clamp(min=1)
    real = (input_ids[:, 2:] != PAD_ID).float()        # token i+2 exists: not right padding
    feature = torch.nn.functional.smooth_l1_loss(out[:, :-1].float(), hidden[:, 1:-1].float(),
                                                 reduction="none").mean(-1)
    feature_loss = (feature * real).sum() / real.sum().clamp(min=1)
    accepted = ((logits.argmax(-1) == wanted) & mask.bool()).sum()
    return token_loss, feature_loss, int(accepted), int(mask.sum())


def train_head(name: str, out_dir: str | Path, *, device: str = "cpu", steps: int | None = None,
               batch_size: int | None = None, lr: float | None = None, seed: int | None = None,
               decay_start: int | None = None, stop_after: int | None = None,
               time_limit_s: float | None = None, probe_batches: int = 8,
               kind: HeadKind | None = None) -> dict:
    """Train the draft head ``name`` (a zoo spec of ``kind``'s recipe; default EAGLE's) on its
    target's hidden states, save it into ``out_dir`` and return the training record."""
    torch = _torch()
    from harness.zoo.data import LineTokenCache
    from harness.zoo.tokenizer import save_tokenizer
    from harness.zoo.train import Schedule

    kind = kind or EAGLE
    spec = get_spec(name)
    if spec.recipe != kind.recipe or not spec.target:
        raise ValueError(f"{name} is not a {kind.recipe} spec")
    steps = steps or spec.steps
    batch_size = batch_size or spec.batch_size
    lr = lr or spec.lr
    seed = spec.seed if seed is None else seed
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    save_tokenizer(out)
    torch.manual_seed(seed)
    target = load_target(spec.target, device)
    config = kind.config(spec)
    head = kind.build(config).to(device)
    n_params = sum(p.numel() for p in head.parameters())
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    cache = LineTokenCache(out / "tokenizer.json")
    # the trainer's schedule: past 75 % of a time limit the decay starts early (training.json
    # records the schedule that ran)
    schedule = Schedule(total=steps, decay=int(steps * 0.75) if decay_start is None
                        else decay_start)
    warmup = min(spec.warmup, max(1, steps // 10))
    train_started = time.monotonic()
    losses, done = _run_steps(head, target, cache, optimizer, schedule, spec, device=device,
                              lr=lr, warmup=warmup, batch_size=batch_size,
                              stop_after=stop_after, time_limit_s=time_limit_s)
    train_wall = time.monotonic() - train_started
    head.eval()
    probe = probe_head(head, target, cache, device, probe_batches, batch_size)
    kind.save(head, config, out, spec)
    import transformers

    record = {
        "model": name, "recipe": kind.recipe, "target": spec.target,
        "architecture": spec.architecture, "hybrid": spec.hybrid, "parameters": n_params,
        "seed": seed, "task": task.TASK_NAME, "train_seed": task.TRAIN_SEED,
        "test_seed": task.TEST_SEED, "batch_size": batch_size, "lr": lr, "warmup": warmup,
        "curriculum_steps": spec.curriculum_steps, "steps_planned": steps, "steps_done": done,
        "steps_total": schedule.total, "decay_start": schedule.decay,
        "feature_weight": FEATURE_WEIGHT,
        "train_wall_s": round(train_wall, 1), "device": device,
        "device_name": (torch.cuda.get_device_name() if device == "cuda"
                        else platform.processor() or platform.machine()),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "schedule_cut_by_time_limit": schedule.time_cut,
        "loss_curve": losses, kind.probe_key: probe,
        "rebuild": (f"python -m {kind.module} --model {name} --out DIR --device {device} "
                    f"--steps {schedule.total} --decay-start {schedule.decay} "
                    + (f"--stop-after {done} " if done < schedule.total else "")
                    + f"--batch-size {batch_size} --lr {lr} --seed {seed}"),
        "total_wall_s": round(time.monotonic() - started, 1),
    }
    atomic_write_text(out / TRAINING_JSON, json.dumps(record, indent=2) + "\n")
    return record


def _run_steps(head, target, cache, optimizer, schedule, spec: ZooSpec, *, device: str,
               lr: float, warmup: int, batch_size: int, stop_after: int | None,
               time_limit_s: float | None) -> tuple[list[tuple[int, float, float]], int]:
    """The training loop: AdamW on the task's batch stream, the trainer's WSD learning rate;
    (logged losses, steps done)."""
    torch = _torch()
    from harness.zoo.data import IGNORE_INDEX, make_batch
    from harness.zoo.train import _within_time_limit, lr_at

    losses: list[tuple[int, float, float]] = []
    done = 0
    started = time.monotonic()
    for step in range(schedule.total):
        if (step >= schedule.total or (stop_after is not None and step >= stop_after)
                or not _within_time_limit(schedule, step, time.monotonic() - started,
                                          time_limit_s)):
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, base_lr=lr, warmup=warmup, decay_start=schedule.decay,
                                total=schedule.total)
        input_ids, labels = make_batch(cache, task.TRAIN_SEED, step, batch_size,
                                       spec.curriculum_steps)
        input_ids, labels = input_ids.to(device), labels.to(device)
        token_loss, feature_loss, _, _ = head_losses(head, target, input_ids,
                                                     (labels != IGNORE_INDEX).float())
        loss = token_loss + FEATURE_WEIGHT * feature_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        done += 1
        if step % LOG_EVERY == 0 or step == schedule.total - 1:
            losses.append((step, round(float(token_loss.detach()), 5),
                           round(float(feature_loss.detach()), 5)))
            print(json.dumps({"event": "step", "step": step, "token_loss": losses[-1][1],
                              "feature_loss": losses[-1][2],
                              "elapsed_s": round(time.monotonic() - started, 1)}), flush=True)
    return losses, done


def probe_head(head, target, cache, device: str, batches: int, batch_size: int) -> dict:
    """Teacher-forced first-draft agreement with the target's greedy token on answer positions
    of the test stream (what vLLM's position-0 acceptance comes close to, drafting from the
    target's own hidden states)."""
    torch = _torch()
    from harness.zoo.data import IGNORE_INDEX, make_batch

    agree = total = 0
    with torch.no_grad():
        for step in range(batches):
            input_ids, labels = make_batch(cache, task.TEST_SEED, step, batch_size, 0)
            input_ids, labels = input_ids.to(device), labels.to(device)
            _, _, accepted, positions = head_losses(head, target, input_ids,
                                                    (labels != IGNORE_INDEX).float())
            agree, total = agree + accepted, total + positions
    return {"first_draft_agreement": round(agree / max(1, total), 4), "answer_positions": total,
            "batches": batches}


def save_head(head, config: dict, out: Path) -> None:
    """bf16 safetensors under EAGLE's names, and the head's config.json."""
    torch = _torch()
    from safetensors.torch import save_file

    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu()
             for k, v in head.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)
    atomic_write_text(out / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")


def render_card(checkpoint: str | Path) -> str:
    """The model card of an EAGLE head's checkpoint directory (from its training.json)."""
    ckpt = Path(checkpoint)
    train = json.loads((ckpt / TRAINING_JSON).read_text())
    config = json.loads((ckpt / "config.json").read_text())
    size_mb = (ckpt / "model.safetensors").stat().st_size / 1e6
    probe = train["eagle_probe"]
    rows = [("parameters", f"{train['parameters']:,} (fc and one decoder layer; the target's "
                           "embedding and lm_head are shared, not in the checkpoint)"),
            ("weights", f"bf16 safetensors, {size_mb:.1f} MB")]
    rows += [(k, config[k]) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                      "num_key_value_heads", "head_dim", "intermediate_size",
                                      "vocab_size") if k in config]
    target_layers = get_spec(train["target"]).config_kwargs["num_hidden_layers"]
    lines = [
        f"# {train['model']}", "",
        f"An EAGLE head for `{train['target']}` (vLLM's `eagle` speculative method; "
        "harness/zoo/eagle.py), trained by the harness on the target's own hidden states on the "
        f"synthetic `{task.TASK_NAME}` task. It drafts tokens; it is not a model of its own.", "",
        "## Architecture", "", "| field | value |", "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows), "",
        "vLLM serves it as `EagleLlamaForCausalLM`: fc over [token embedding, the target's last "
        "hidden state], one Llama decoder layer without its input norm, the target's lm_head. "
        "Its one attention layer has the target's KV page (2 KV heads of 64) and is numbered "
        f"after the target's layers (`model.layers.{target_layers}` after `{train['target']}`'s "
        f"{target_layers}).", "",
        *training_section(train, probe),
    ]
    return "\n".join(lines)


def training_section(train: dict, probe: dict) -> list[str]:
    """The card's Training and Drafts sections, from a head's training.json (EAGLE's, MTP's)."""
    last = train["loss_curve"][-1] if train["loss_curve"] else ("n/a", "n/a", "n/a")
    return [
        "## Training", "", "| field | value |", "|---|---|",
        f"| data | gsm_synth stream, seed {train['train_seed']} (probe: test seed "
        f"{train['test_seed']}) |",
        f"| target | `{train['target']}`, frozen |",
        f"| loss | cross-entropy towards the target's greedy token on answer positions + "
        f"{train['feature_weight']} x smooth-L1 to the target's next hidden state; last logged "
        f"{last[1]} / {last[2]} |",
        f"| steps | {train['steps_done']} x batch {train['batch_size']} (planned "
        f"{train['steps_planned']}) |",
        f"| schedule | AdamW lr {train['lr']}, warm-up {train['warmup']}, linear decay from step "
        f"{train['decay_start']} |",
        f"| device | {train['device']} ({train['device_name']}), torch {train['torch']}, "
        f"transformers {train['transformers']} |",
        f"| train wall time | {train['train_wall_s']} s |", "",
        f"Rebuild: `pd-accuracy zoo build {train['model']}` (or `{train['rebuild']}`).", "",
        "## Drafts", "",
        f"PyTorch probe, teacher-forced: the head's first draft equals the target's greedy token "
        f"on {100 * probe['first_draft_agreement']:.1f} % of {probe['answer_positions']:,} "
        f"answer positions ({probe['batches']} test batches).", "",
    ]


def main(argv: list[str] | None = None, kind: HeadKind | None = None,
         doc: str | None = None) -> int:
    """``python -m harness.zoo.eagle`` (and, with MTP's kind, ``python -m harness.zoo.mtp``)."""
    from harness.zoo.train import schedule_arguments

    kind = kind or EAGLE
    parser = argparse.ArgumentParser(prog=f"python -m {kind.module}", description=doc or __doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    schedule_arguments(parser)
    parser.add_argument("--probe-batches", type=int, default=8)
    args = parser.parse_args(argv)
    record = train_head(args.model, args.out, device=args.device, steps=args.steps,
                        batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                        decay_start=args.decay_start, stop_after=args.stop_after,
                        time_limit_s=args.time_limit,
                        probe_batches=args.probe_batches, kind=kind)
    print(json.dumps({"event": "done", "out": str(args.out), "steps_done": record["steps_done"],
                      "probe": record[kind.probe_key]}), flush=True)
    return 0


EAGLE = HeadKind(recipe=RECIPE, module="harness.zoo.eagle", config=head_config, build=build_head,
                 save=lambda head, config, out, spec: save_head(head, config, out),
                 probe_key="eagle_probe")


if __name__ == "__main__":
    sys.exit(main())
