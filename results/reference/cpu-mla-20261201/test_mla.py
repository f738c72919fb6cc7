"""Feasibility: a tiny random-weight MLA model (DeepseekV2, kv_lora_rank 64) as a P/D cell on
vLLM CPU 0.32 + NIXL: does it start, does its KV cross, what do the digest and checks say?"""
from harness.core.cell import Cell


def test_mla_pd(pd_judge):
    result = pd_judge(Cell(model="/tmp/mla/tiny-mla-random", compile="eager"))
    print("OUTCOME", result.verdict.outcome, result.verdict.reason)
    print("RECORD", result.record_path)
