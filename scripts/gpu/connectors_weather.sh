#!/usr/bin/env bash
# Session 18's H200 call (written for session 17, which had no device time left to run it): the
# connectors session 16 had no time for (#35: MultiConnector of NIXL + offloading, Mooncake, each
# with its drop-transfer canary), the GPU weather cells (#34: load and preemption, runner V1 and
# V2), P V2 -> D V1 with ngram drafts on the decode (#37) and the gemma-3-4b shape whose byte
# expectation session 16 got wrong (re-judged offline since).
# Same machinery as s16.sh: scripts/gpu/session_call.sh.
#   bash scripts/gpu/s18.sh            (TAG, PAR, MAX_STARTING, LIMIT, BUDGET_S may be overridden)
set -uo pipefail
CELLS=${CELLS:-'(FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kvc_multi_nixl_offload
 or FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kvc_mooncake
 or (FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1 and (w_load or w_preemption))
 or v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-spec_ngram-prunner_v2
 or v1-FLASH_ATTN-p128d128-shape-gemma-3-4b-tp1x1)'}
TAG=${TAG:-s18} exec bash scripts/gpu/session_call.sh "$CELLS"
