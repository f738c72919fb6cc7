"""What a cell's ``spec_decode`` value runs on each server: vLLM's --speculative-config (method,
token count, draft model) and on which roles. The launcher builds the servers' flags from it
(harness.serve.launch.server_spec); the judge checks each server's log against it
(harness.judge.effective_config)."""
from __future__ import annotations

# Cell.spec_decode -> vLLM's --speculative-config. ngram proposes the next tokens by matching the
# last 2-4 generated tokens in the prompt: GSM8K-style answers quote the prompt, so drafts are
# accepted often and the decode verifies several tokens per step against the received KV.
SPEC_DECODE_CONFIGS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
              "prompt_lookup_min": 2},
    # the zoo's draft for tiny-llama-gsm (same tokenizer); "model" is a zoo name, resolved to its
    # checkpoint when the argv is built
    "draft_p1_d3": {"method": "draft_model", "model": "tiny-llama-gsm-draft",
                    "num_speculative_tokens": 3},
    "draft_p0_d3": {"method": "draft_model", "model": "tiny-llama-gsm-draft",
                    "num_speculative_tokens": 3},
    # the zoo's EAGLE head for tiny-llama-gsm (harness/zoo/eagle.py): one decoder layer over the
    # target's hidden states, with a KV cache layer of its own (named after the target's
    # layers: model.layers.4 for tiny-llama-gsm's 4)
    "eagle_p1_d3": {"method": "eagle", "model": "tiny-llama-gsm-eagle",
                    "num_speculative_tokens": 3},
    # the head on the decode only (the prefill without it): a pair the connector refuses
    "eagle_p0_d3": {"method": "eagle", "model": "tiny-llama-gsm-eagle",
                    "num_speculative_tokens": 3},
    # the zoo's MTP head (harness/zoo/mtp.py): vLLM's mtp method names no model, it reads the
    # head from the served checkpoint (mtp.* weights, num_nextn_predict_layers), so the cell's
    # model is the head's checkpoint, tiny-qwen3next-hybrid-gsm-mtp; one Qwen3-Next decoder
    # layer with a KV cache layer of its own (named mtp.layers.0.self_attn.attn); P 1 / D 3 as
    # vLLM's P/D CI runs it (on the GDN hybrid a P/D pair whose counts differ loses the state:
    # rule hybrid-spec-token-count-mix), and P 3 / D 3
    "mtp_p1_d3": {"method": "mtp", "num_speculative_tokens": 3},
    "mtp_p3_d3": {"method": "mtp", "num_speculative_tokens": 3},
}
# Values whose draft has a KV cache of its own (a draft model, an EAGLE or MTP head) run on the
# prefill too, with their own count: vLLM adds the draft's attention layers to the KV cache, and a
# prefill without them registers fewer layers with its connector than the decode reads (vLLM
# also hashes an EAGLE head into the KV connector's compatibility hash, so a prefill without it
# fails the decode's handshake)
PREFILL_SPEC_TOKENS = {"draft_p1_d3": 1, "eagle_p1_d3": 1, "mtp_p1_d3": 1, "mtp_p3_d3": 3}
# the EAGLE head of each value, and the one target it was trained on (its hidden states)
EAGLE_TARGETS = {"eagle_p1_d3": "tiny-llama-gsm", "eagle_p0_d3": "tiny-llama-gsm"}
# the checkpoint that holds each MTP value's head (the target's weights and the head's): the one
# model such a cell serves
MTP_MODELS = {"mtp_p1_d3": "tiny-qwen3next-hybrid-gsm-mtp",
              "mtp_p3_d3": "tiny-qwen3next-hybrid-gsm-mtp"}
ROLES_GENERATING = ("baseline", "decode")   # where speculative decoding runs (and, for a
# draft with KV of its own, the prefill: PREFILL_SPEC_TOKENS)


def speculative_expectation(spec_decode: str | None, role: str) -> tuple[str, int] | None:
    """(vLLM's method, speculative tokens) a server of ``role`` runs for a cell's
    ``spec_decode``; None where it runs none (``role``: baseline, prefill or decode)."""
    if not spec_decode or (role not in ROLES_GENERATING and spec_decode not in PREFILL_SPEC_TOKENS):
        return None
    config = SPEC_DECODE_CONFIGS[spec_decode]
    tokens = PREFILL_SPEC_TOKENS[spec_decode] if role == "prefill" else config["num_speculative_tokens"]
    return config["method"], tokens
