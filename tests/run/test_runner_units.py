"""The run's pure helpers: transfer proof from proxy records, fault lines, versions, hardware."""
from __future__ import annotations

import json

from harness.eval.metrics import TransferCounters
from harness.run.evidence.provenance import hardware, versions
from harness.run.evidence.transfer_evidence import (count_fault_lines, read_proxy_records,
                                                    transfer_proof)
from harness.protocol.faults import APPLIED_PREFIX

COUNTERS = TransferCounters(prompt_tokens_external=300.0, kv_bytes=1e6, kv_transfers=3.0)


def params(i: int) -> dict:
    """kv_transfer_params as vLLM's NixlConnector returns them from the prefill hop."""
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [i, i + 1],
            "remote_engine_id": "engine-prefill-0", "remote_host": "127.0.0.1",
            "remote_port": 5600, "tp_size": 1}


def proxy_record(received: dict | None, sent: dict | None) -> dict:
    return {"request_id": "x", "prefill_status": 200, "decode_status": 200,
            "received_kv_transfer_params": received, "sent_kv_transfer_params": sent}


def test_clean_pair_every_request_carries_its_own_params():
    records = [proxy_record(params(i), params(i)) for i in range(3)]
    proof = transfer_proof(records, COUNTERS, hybrid=False, decode_logs=[])
    assert (proof.requests, proof.requests_with_params, proof.requests_own_params,
            proof.requests_sent_params) == (3, 3, 3, 3)
    assert proof.counters == COUNTERS
    assert proof.recompute_allowance == 0
    assert proof.fault_lines == 0


def test_foreign_params_are_not_own_params():
    # foreign-params fault: every request after the first gets its predecessor's params
    records = [proxy_record(params(0), params(0))] + [
        proxy_record(params(i), params(i - 1)) for i in range(1, 4)]
    proof = transfer_proof(records, COUNTERS, hybrid=False, decode_logs=[])
    assert proof.requests_with_params == 4
    assert proof.requests_sent_params == 4
    assert proof.requests_own_params == 1


def test_dropped_params_are_neither_sent_nor_own():
    records = [proxy_record(params(i), None) for i in range(3)]
    proof = transfer_proof(records, TransferCounters(prompt_tokens_local=300.0),
                           hybrid=False, decode_logs=[])
    assert proof.requests_with_params == 3
    assert proof.requests_sent_params == 0
    assert proof.requests_own_params == 0


def test_missing_or_unusable_params_do_not_count():
    records = [
        proxy_record(None, None),                       # prefill returned none
        proxy_record({}, {}),                           # empty dict
        proxy_record({"do_remote_prefill": True}, {"do_remote_prefill": True}),  # nothing to read
        proxy_record({"remote_block_ids": []}, {"remote_block_ids": []}),  # short prompt, no blocks: usable
    ]
    proof = transfer_proof(records, COUNTERS, hybrid=True, decode_logs=[])
    assert proof.requests == 4
    assert proof.requests_with_params == 1
    assert proof.requests_own_params == 1
    assert proof.recompute_allowance == 1          # hybrid models recompute one token by design


def test_fault_lines_counted_across_decode_logs(tmp_path):
    a = tmp_path / "decode-0.log"
    b = tmp_path / "decode-1.log"
    a.write_text(f"INFO start\n{APPLIED_PREFIX} corrupt-block req=1\n{APPLIED_PREFIX} corrupt-block req=2\n")
    b.write_bytes(f"\xff\xfe garbage\n{APPLIED_PREFIX} swap-blocks req=3\n".encode("latin-1"))
    assert count_fault_lines([str(a), str(b), str(tmp_path / "missing.log")]) == 3
    proof = transfer_proof([], COUNTERS, hybrid=False, decode_logs=[str(a)])
    assert proof.fault_lines == 2


def test_read_proxy_records_skips_bad_lines(tmp_path):
    path = tmp_path / "proxy-records.jsonl"
    good = [proxy_record(params(0), params(0)), proxy_record(None, None)]
    path.write_text(json.dumps(good[0]) + "\n\n   \n{not json\n" + json.dumps(good[1]) + "\n"
                    + '{"truncated": ')
    assert read_proxy_records(str(path)) == good


def test_read_proxy_records_of_nothing_is_empty(tmp_path):
    assert read_proxy_records(None) == []
    assert read_proxy_records(str(tmp_path / "never-written.jsonl")) == []


def test_versions_and_hardware_shapes():
    v = versions()
    assert set(v) == {"vllm", "nixl", "lm_eval", "torch", "harness", "python"}
    # the connector's own transport, not NIXL's, for every other connector
    assert set(versions("mooncake")) == set(v) - {"nixl"} | {"mooncake_transfer_engine"}
    assert "nixl" not in versions("example")
    assert v["python"].count(".") == 2 and v["harness"]
    assert v["lm_eval"]          # installed in the venv the tests run in
    hw = hardware("cpu")
    assert hw["platform"] == "cpu" and hw["gpus"] == []
    assert isinstance(hw["cpu_count"], int) and hw["hostname"]
    assert isinstance(hw["cpu_isa"], list)


def test_cpu_isa_names_the_extensions_that_decide_bf16_speed():
    from harness.run.evidence.provenance import cpu_isa

    avx2_only = "processor\t: 0\nflags\t\t: fpu sse2 avx f16c fma avx2 sha_ni\n"
    sapphire = ("flags\t\t: avx2 avx512f avx512_vnni avx512_bf16 amx_bf16 amx_tile\n"
                "flags\t\t: (second processor, not read)\n")
    assert cpu_isa(avx2_only) == ["avx2"]
    assert cpu_isa(sapphire) == ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16",
                                 "amx_tile"]
    assert cpu_isa("model name : no flags line\n") == []


def test_hardware_names_the_gpus_platform_detection_sees(monkeypatch):
    from harness.core.platform import GpuDevice
    from harness.run.evidence import provenance

    devices = [GpuDevice(3, "NVIDIA H200", 141 * 2**30), GpuDevice(5, "NVIDIA H200", 141 * 2**30)]
    monkeypatch.setattr(provenance, "detect_gpus", lambda: devices)
    assert provenance.hardware("cuda")["gpus"] == ["NVIDIA H200", "NVIDIA H200"]
    assert provenance.hardware("cpu")["gpus"] == []


def test_the_harness_commit_says_when_its_tree_differs_from_it(tmp_path):
    """A record's versions.harness names the commit, and "+modified" when the harness's files
    are not that commit's (a GPU machine's copy of a working tree once reported its stale HEAD)."""
    import subprocess

    from harness.run.evidence.provenance import harness_commit

    package = tmp_path / "harness"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    assert harness_commit(package) is None                       # no checkout: the version then
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    sha = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert harness_commit(package) == sha
    (tmp_path / "README").write_text("outside the package: not the harness\n")
    assert harness_commit(package) == sha
    (package / "a.py").write_text("x = 2\n")
    assert harness_commit(package) == sha + "+modified"
