#!/usr/bin/env bash
# One H200 call (measured 2026-12-03: results/reference/gpu-h200-shapes-fp8-push-20261203/):
# 20 cells in 12 baseline groups through scripts/gpu/nightly_cells.sh (run_profile.sh, then the
# summary table, all under $OUT).
#   real-shape random-weight models (harness/zoo/shapes.py), verdict on transfer + bytes + digest
#   fp8 KV on FLASH_ATTN / FLASHINFER / TRITON_ATTN, a P != D dtype pair, an fp8 canary;
#   mixed runners P V1 -> D V2 and P V2 -> D V1, with and without ngram drafts on the decode
#   NIXL push, MultiConnector(NIXL + offloading) and Mooncake, each with a drop-transfer canary
# Expects what nightly_cells.sh expects. Run from the repo root:
#   bash scripts/gpu/shapes_fp8_connectors.sh   (TAG, PAR, MAX_STARTING, LIMIT, BUDGET_S may be overridden)
set -uo pipefail
CELLS='(v2-FLASHINFER-p128d128-shape-qwen3-0.6b-tp1x1 or v2-FLASH_ATTN-p400d400-shape-granite
 or v1-FLASHMLA-p64d64-shape-deepseek or v1-FLASH_ATTN-p128d128-shape-gemma
 or v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kv_ or v2-FLASHINFER-p128d128-tiny-llama-gsm-tp1x1-kv_fp8
 or v2-TRITON_ATTN-p128d128-tiny-llama-gsm-tp1x1-kv_fp8
 or (FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1 and prunner)
 or v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kvc_) and not e5m2 and not spec_ngram-prunner_v1
 and not kvc_example'
# (kvc_example: a nightly cell measured apart, in connectors_weather.sh's call)
TAG=${TAG:-shapes-fp8-connectors} exec bash scripts/gpu/nightly_cells.sh "$CELLS"
