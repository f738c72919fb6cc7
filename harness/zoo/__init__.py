"""Tiny models the harness builds itself: a random-weight Llama for plumbing (random_llama) and
three models trained on the synthetic gsm_synth task (registry, models, train)."""
from harness.zoo.registry import (  # noqa: F401  (the harness's entry points into the zoo)
    is_hybrid,
    required_block_size,
    resolve_model,
    zoo_names,
)
