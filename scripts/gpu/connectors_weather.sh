#!/usr/bin/env bash
# One H200 call (measured 2026-12-04: results/reference/gpu-h200-connectors-weather-20261204/):
# MultiConnector of NIXL + offloading and Mooncake, each with its drop-transfer canary; the GPU
# weather cells (load and preemption, runner V1 and V2); P V2 -> D V1 with ngram drafts on the
# decode; and the gemma-3-4b shape whose byte expectation the 2026-12-03 call got wrong.
# Same machinery as shapes_fp8_connectors.sh: scripts/gpu/nightly_cells.sh.
#   bash scripts/gpu/connectors_weather.sh   (TAG, PAR, MAX_STARTING, LIMIT, BUDGET_S may be overridden)
set -uo pipefail
CELLS=${CELLS:-'(FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kvc_multi_nixl_offload
 or FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kvc_mooncake
 or (FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1 and (w_load or w_preemption))
 or v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-spec_ngram-prunner_v2
 or v1-FLASH_ATTN-p128d128-shape-gemma-3-4b-tp1x1)'}
TAG=${TAG:-connectors-weather} exec bash scripts/gpu/nightly_cells.sh "$CELLS"
