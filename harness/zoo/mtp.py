"""An MTP head for the zoo's Qwen3-Next hybrid (vLLM's ``mtp`` speculative method), trained on the
target's own hidden states.

    python -m harness.zoo.mtp --model tiny-qwen3next-hybrid-gsm-mtp --out DIR [--device cuda|cpu]

The head is what vLLM's ``Qwen3NextMTP`` (vllm/model_executor/models/qwen3_next_mtp.py) runs: at
position i it normalises the embedding of token i+1 (``pre_fc_norm_embedding``) and the target's
last hidden state at i (after the target's final norm; ``pre_fc_norm_hidden``), concatenates
them, projects them back with ``fc``, runs one Qwen3-Next decoder layer (gated full attention and
the MoE block with its shared expert, the target's widths) and a final norm; the result goes
through the target's lm_head to draft token i+2 and is the hidden state of the next draft step
(vLLM reruns the one layer for each of the 3 drafts).

vLLM's ``mtp`` method finds the head inside the target's own checkpoint (the speculative config
names no model): weights under ``mtp.*`` next to the target's, ``num_nextn_predict_layers`` 1
in config.json. So the head is a zoo model of its own, the target's weights unchanged plus the
head (``tiny-qwen3next-hybrid-gsm-mtp``); a cell that runs the target without MTP keeps the
target's checkpoint. Its one attention layer has the target's KV page (2 KV heads of 64) and is
a KV cache layer of every server that runs the head, named under the head's own prefix
(``mtp.layers.0.self_attn.attn`` beside the target's ``model.layers.1-2``).

Trained like the EAGLE head, with the same losses, loop, probe and options
(harness/zoo/eagle.py): the target frozen, cross-entropy towards its greedy token plus a
smooth-L1 regression onto its next hidden state.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from harness.core.atomic import atomic_write_text
from harness.zoo import eagle, task
from harness.zoo.models import ZooSpec, get_spec

RECIPE = "mtp-head"
PREFIX = "mtp."              # the head's weights in the checkpoint (vLLM's Qwen3NextMTP loader)
MTP_LAYERS = 1               # config.json's num_nextn_predict_layers


def head_config(spec: ZooSpec) -> dict:
    """config.json of the checkpoint: the target's, with ``num_nextn_predict_layers``."""
    from harness.zoo import registry

    config = json.loads((registry.checkpoint_dir(spec.target) / "config.json").read_text())
    config["num_nextn_predict_layers"] = MTP_LAYERS
    return config


def layer_config(config: dict) -> Any:
    """The transformers config of the head's one decoder layer: a full-attention layer of the
    target's Qwen3-Next config (SDPA, causal)."""
    import transformers

    fields = {k: v for k, v in config.items()
              if k not in ("architectures", "dtype", "transformers_version", "model_type")}
    fields.update(num_hidden_layers=MTP_LAYERS, layer_types=["full_attention"] * MTP_LAYERS)
    return transformers.Qwen3NextConfig(**fields, attn_implementation="sdpa")


def build_head(config: dict) -> Any:
    """The MTP head of a Qwen3-Next config (dict of config.json), from transformers' own
    Qwen3-Next modules; ``forward(embeds, hidden_states)`` as EAGLE's head."""
    import torch
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

    layer = layer_config(config)
    hidden = layer.hidden_size

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
            self.pre_fc_norm_embedding = qwen3_next.Qwen3NextRMSNorm(hidden, layer.rms_norm_eps)
            self.pre_fc_norm_hidden = qwen3_next.Qwen3NextRMSNorm(hidden, layer.rms_norm_eps)
            self.layers = torch.nn.ModuleList(qwen3_next.Qwen3NextDecoderLayer(layer, i)
                                              for i in range(MTP_LAYERS))
            self.norm = qwen3_next.Qwen3NextRMSNorm(hidden, layer.rms_norm_eps)
            self.rotary = qwen3_next.Qwen3NextRotaryEmbedding(layer)

        def forward(self, embeds, hidden_states):
            """embeds of tokens 1..n, the target's hidden states at 0..n-1 -> the head's output
            at 0..n-1 (positions 0..n-1)."""
            x = self.fc(torch.cat((self.pre_fc_norm_embedding(embeds),
                                   self.pre_fc_norm_hidden(hidden_states)), dim=-1))
            positions = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
            rotary = self.rotary(x, positions)
            out = self.layers[0](x, position_embeddings=rotary, attention_mask=None,
                                 position_ids=positions)
            return self.norm(out[0] if isinstance(out, tuple) else out)

    head = Head()
    # transformers leaves the routed experts (torch.empty) and the router to its model's
    # _init_weights: the same normal init here, so a seed gives the same head
    for module in head.modules():
        if isinstance(module, qwen3_next.Qwen3NextExperts):
            torch.nn.init.normal_(module.gate_up_proj, std=layer.initializer_range)
            torch.nn.init.normal_(module.down_proj, std=layer.initializer_range)
        elif isinstance(module, qwen3_next.Qwen3NextSparseMoeBlock):
            torch.nn.init.normal_(module.gate.weight, std=layer.initializer_range)
    return head


def checkpoint_weights(head) -> dict:
    """The head's weights under the names vLLM's Qwen3NextMTP loader reads (``mtp.fc.weight``,
    ``mtp.layers.0.mlp.experts.<e>.gate_proj.weight``, ...): transformers fuses the experts'
    gate and up projections into one tensor (gate first), the checkpoint keeps one per expert."""
    out = {}
    for name, value in head.state_dict().items():
        if name.startswith("rotary."):
            continue
        if name.endswith("mlp.experts.gate_up_proj"):
            stem = PREFIX + name[: -len("gate_up_proj")]
            half = value.shape[1] // 2
            for e in range(value.shape[0]):
                out[f"{stem}{e}.gate_proj.weight"] = value[e, :half]
                out[f"{stem}{e}.up_proj.weight"] = value[e, half:]
        elif name.endswith("mlp.experts.down_proj"):
            stem = PREFIX + name[: -len("down_proj")]
            for e in range(value.shape[0]):
                out[f"{stem}{e}.down_proj.weight"] = value[e]
        else:
            out[PREFIX + name] = value
    return out


def save_head(head, config: dict, out: Path, spec: ZooSpec) -> None:
    """One bf16 safetensors: the target's weights as committed, then the head's under
    ``mtp.*``; the config with ``num_nextn_predict_layers``; the target's generation config."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from harness.zoo import registry

    source = registry.checkpoint_dir(spec.target)
    state = load_file(str(source / "model.safetensors"))
    clash = [k for k in state if k.startswith(PREFIX)]
    if clash:
        raise ValueError(f"{spec.target} already holds {PREFIX}* weights: {clash[:3]}")
    state.update({k: v.detach().to(torch.bfloat16).contiguous().cpu()
                  for k, v in checkpoint_weights(head).items()})
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)
    if (source / "generation_config.json").exists():
        shutil.copyfile(source / "generation_config.json", out / "generation_config.json")
    atomic_write_text(out / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")


def render_card(checkpoint: str | Path) -> str:
    """The model card of an MTP head's checkpoint directory (from its training.json)."""
    ckpt = Path(checkpoint)
    train = json.loads((ckpt / eagle.TRAINING_JSON).read_text())
    config = json.loads((ckpt / "config.json").read_text())
    size_mb = (ckpt / "model.safetensors").stat().st_size / 1e6
    target_layers = get_spec(train["target"]).config_kwargs["num_hidden_layers"]
    rows = [("parameters", f"{train['parameters']:,} in the head (fc, three norms, one decoder "
                           "layer); the target's embedding and lm_head are shared"),
            ("weights", f"bf16 safetensors, {size_mb:.1f} MB: `{train['target']}`'s weights "
                        f"unchanged plus the head's under `{PREFIX}*`")]
    rows += [(k, config[k]) for k in ("num_nextn_predict_layers", "hidden_size",
                                      "num_attention_heads", "num_key_value_heads", "head_dim",
                                      "num_experts", "moe_intermediate_size", "vocab_size")]
    lines = [
        f"# {train['model']}", "",
        f"`{train['target']}` with an MTP head (vLLM's `mtp` speculative method; "
        "harness/zoo/mtp.py), trained by the harness on the target's own hidden states on the "
        f"synthetic `{task.TASK_NAME}` task. Served alone it is `{train['target']}`; with "
        "`--speculative-config '{\"method\": \"mtp\", ...}'` vLLM loads the head from the same "
        "checkpoint and drafts with it.", "",
        "## Architecture", "", "| field | value |", "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows), "",
        "vLLM serves the head as `Qwen3NextMTP`: fc over [normed token embedding, normed target "
        "hidden state], one Qwen3-Next full-attention decoder layer (MoE with the shared "
        "expert), a final norm, the target's lm_head. Its one attention layer has the target's "
        "KV page (2 KV heads of 64) and is a KV cache layer of its own, named under the head's "
        f"prefix (`{PREFIX}layers.0.self_attn.attn`, beside the target's {target_layers} "
        "layers' `model.layers.*`).", "",
        *eagle.training_section(train, train[MTP.probe_key]),
    ]
    return "\n".join(lines)


MTP = eagle.HeadKind(recipe=RECIPE, module="harness.zoo.mtp", config=head_config,
                     build=build_head, save=save_head, probe_key="mtp_probe")


def train_head(name: str, out_dir: str | Path, **kwargs) -> dict:
    """Train the MTP head ``name`` (harness/zoo/eagle.py's trainer with MTP's kind)."""
    return eagle.train_head(name, out_dir, kind=MTP, **kwargs)


if __name__ == "__main__":
    sys.exit(eagle.main(kind=MTP, doc=__doc__))
