"""The KV cache dtype and mixed-runner axes: ids and baseline keys, the YAML forms,
the servers each role starts, the declared refusal of a P != D dtype pair, the byte geometry of
an fp8 cache, the CLI flags, and where the shipped profiles run them."""
from __future__ import annotations

import json
import re
import tempfile
import textwrap
from pathlib import Path

import pytest

from harness.core.catalog import ModelCatalog, ModelInfo
from harness.core.cell import Cell
from harness.core.kv_geometry import GeometryUnknown, geometry_from_config
from harness.core.outcomes import FAIL, PASS, XFAIL, XPASS
from harness.core.platform import PlatformInfo
from harness.judge.verdict import Verdict
from harness.matrix import MatrixError, expand, load_matrix
from harness.matrix.rules import check_cell
from harness.connectors.facts import KV_DTYPE_MIX
from harness.connectors.nixl import NIXL_REFUSALS

KV_DTYPE_REFUSAL = NIXL_REFUSALS[KV_DTYPE_MIX].fails_with
from harness.serve.deploy import DeployContext, pair_key, plan_server
from harness.serve.host.ports import PortAllocator
from harness.serve.launch.placement import Placement
from harness.serve.launch.server_spec import ServerSpec, build_argv, engine_settings

SMOKE = Cell(model="tiny-llama-gsm", compile="eager")
GPU2 = PlatformInfo.from_spec("cuda:2")
AMX = PlatformInfo.from_spec("cpu:avx2+avx512f+avx512_bf16+amx_bf16+amx_tile")
AVX2 = PlatformInfo.from_spec("cpu:avx2")
REFUSAL_RECORD = ("results/reference/cpu-kv-dtype-20261203/"
                  "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-kv_p_auto_d_fp8.json")
CATALOG = ModelCatalog({"d": ModelInfo("d", kind="dense", num_kv_heads=2, head_dim=64)})


def kv(prefill: str, decode: str | None = None) -> dict:
    return {"prefill_kv_cache_dtype": prefill, "decode_kv_cache_dtype": decode or prefill}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    return path


# ---- identity -------------------------------------------------------------------------------

def test_defaults_leave_ids_and_baseline_keys_byte_identical():
    explicit = SMOKE.replace(**kv("auto"), prefill_runner=None)
    assert explicit == SMOKE and explicit.cell_id == "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager"
    # the key recorded before these axes existed (tests/core/test_cell.py)
    assert SMOKE.baseline_key.startswith("303697f9")


@pytest.mark.parametrize("changes,token", [
    (kv("fp8"), "kv_fp8"),
    (kv("fp8_e5m2"), "kv_fp8_e5m2"),
    (kv("auto", "fp8"), "kv_p_auto_d_fp8"),
    (kv("fp8", "auto"), "kv_p_fp8_d_auto"),
    ({"prefill_runner": "v2"}, "prunner_v2"),
])
def test_one_id_token_each(changes, token):
    assert SMOKE.replace(**changes).cell_id == f"{SMOKE.cell_id}-{token}"
    assert "-" not in token


def test_the_baseline_runs_the_decode_dtype_and_runner():
    fp8 = SMOKE.replace(**kv("fp8"))
    assert fp8.baseline_key != SMOKE.baseline_key
    # P auto -> D fp8 shares the fp8 baseline; P fp8 -> D auto the auto one
    assert SMOKE.replace(**kv("auto", "fp8")).baseline_key == fp8.baseline_key
    assert SMOKE.replace(**kv("fp8", "auto")).baseline_key == SMOKE.baseline_key
    assert SMOKE.replace(prefill_runner="v2").baseline_key == SMOKE.baseline_key


def test_prefill_only_settings_get_a_pair_of_their_own():
    base = pair_key(SMOKE)
    assert pair_key(SMOKE.replace(**kv("fp8", "auto"))) != base
    assert pair_key(SMOKE.replace(prefill_runner="v2")) != base
    canary = SMOKE.replace(**kv("fp8"), fault="corrupt-block")
    assert pair_key(canary) == pair_key(SMOKE.replace(**kv("fp8")))


def test_round_trip_through_json():
    cell = SMOKE.replace(**kv("auto", "fp8_e5m2"), prefill_runner="v2")
    back = Cell.from_dict(json.loads(json.dumps(cell.to_dict())))
    assert back == cell and back.cell_id == cell.cell_id


# ---- servers --------------------------------------------------------------------------------

def _spec(cell: Cell, role: str) -> ServerSpec:
    ctx = DeployContext(allocator=PortAllocator(lock_dir=tempfile.mkdtemp()),
                        placement=Placement(cpu_cores=(0, 1)), log_dir=Path("/tmp"))
    return plan_server(cell, role, 0, ctx, model_path="/m", hybrid=False, port=1,
                       side_channel_port=2)


def test_each_role_gets_its_own_dtype_and_the_baseline_the_decodes():
    cell = Cell(model="d", device="cuda", backend="FLASHINFER", kv_buffer_device="cuda",
                **kv("auto", "fp8_e5m2"))
    assert engine_settings(cell, "prefill")["kv_cache_dtype"] == "auto"
    assert engine_settings(cell, "decode")["kv_cache_dtype"] == "fp8_e5m2"
    assert engine_settings(cell, "baseline")["kv_cache_dtype"] == "fp8_e5m2"
    argv = build_argv(_spec(cell, "decode"))
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e5m2"
    assert "--kv-cache-dtype" not in build_argv(_spec(cell, "prefill"))


def test_the_prefill_runs_its_own_runner():
    cell = Cell(model="d", device="cuda", backend="FLASH_ATTN", kv_buffer_device="cuda",
                runner="v2", prefill_runner="v1")
    runners = {role: _spec(cell, role).runner for role in ("prefill", "decode", "baseline")}
    assert runners == {"prefill": "v1", "decode": "v2", "baseline": "v2"}
    assert _spec(cell.replace(prefill_runner=None), "prefill").runner == "v2"


# ---- YAML -----------------------------------------------------------------------------------

def test_kv_cache_dtype_is_a_pair_axis_and_prefill_runner_a_scalar(tmp_path):
    spec = load_matrix(write(tmp_path, """
        models: {d: {kind: dense, head_dim: 64}}
        profiles:
          p:
            defaults: {device: cuda, kv_buffer_device: cuda, backend: FLASHINFER}
            grids:
              - {model: d, kv_cache_dtype: [auto, fp8, [auto, fp8]]}
              - {model: d, kv_cache_dtype: {prefill: [fp8], decode: [fp8, fp8_e5m2]}}
              - {model: d, runner: v2, prefill_runner: [null, v1]}
            expected_failures:
              - match: {kv_cache_dtype: fp8_e5m2}
                reason: selector on the pair axis
              - match: {prefill_runner: v1}
                reason: selector on the runner
    """))
    e = expand(spec, "p", GPU2)
    ids = set(e.by_id())
    base = "v1-FLASHINFER-p128d128-d-tp1x1"
    assert {base, f"{base}-kv_fp8", f"{base}-kv_p_auto_d_fp8", f"{base}-kv_p_fp8_d_fp8_e5m2",
            "v2-FLASHINFER-p128d128-d-tp1x1", "v2-FLASHINFER-p128d128-d-tp1x1-prunner_v1"} == ids
    cells = e.by_id()
    assert cells[f"{base}-kv_p_auto_d_fp8"].expected_failure_match == f"(?:{KV_DTYPE_REFUSAL})"
    assert cells["v2-FLASHINFER-p128d128-d-tp1x1-prunner_v1"].expected_failure == "selector on the runner"
    assert cells[f"{base}-kv_fp8"].expected_failure is None


@pytest.mark.parametrize("axes,message", [
    ("kv_cache_dtype: 8", "neither a dtype nor a [prefill, decode] pair"),
    ("kv_cache_dtype: [[auto, fp8, fp8]]", "neither a dtype nor a [prefill, decode] pair"),
    ("kv_cache_dtype: {prefill: fp8}", "needs exactly the keys prefill and decode"),
])
def test_schema_errors_are_one_line(tmp_path, axes, message):
    path = write(tmp_path, f"""
        profiles:
          p:
            grids:
              - {{model: d, {axes}}}
    """)
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert message in str(info.value) and "\n" not in str(info.value)


# ---- the P != D refusal -----------------------------------------------------------------------

def test_a_p_ne_d_dtype_cell_xfails_only_when_refused_loudly():
    cell = Cell(model="d", **kv("auto", "fp8"))
    xfail = [p for p in check_cell(cell, AMX, CATALOG) if p.kind == "xfail"]
    assert [p.rule for p in xfail] == ["kv-cache-dtype-mismatch"]
    assert xfail[0].fails_with == KV_DTYPE_REFUSAL

    def outcome(status: str, reason: str) -> str:
        return Verdict(status, reason, expected_failure=xfail[0].message,
                       expected_failure_match=KV_DTYPE_REFUSAL).outcome

    # the reason of results/reference/cpu-kv-dtype-20261203's P auto -> D fp8 record
    record = Path(__file__).resolve().parents[2] / REFUSAL_RECORD
    refused = json.loads(record.read_text())["verdict"]["reason"]
    assert outcome(FAIL, refused) == XFAIL
    # requests that error for another reason are not the declared refusal
    assert outcome(FAIL, "P/D evaluation failed: RequestsFailed: requests failed on 50 of 50 "
                         "questions: HTTP 500 Internal Server Error x50") == FAIL
    assert outcome(PASS, "P/D matches the baseline") == XPASS          # served: not the expectation
    assert outcome(FAIL, "P/D accuracy is lower: 12% vs 98%") == FAIL  # served wrong: a real FAIL


# ---- bytes ----------------------------------------------------------------------------------

def test_an_fp8_cache_holds_one_byte_per_element():
    cfg = json.loads((Path(__file__).resolve().parents[2] / "harness/zoo/checkpoints/tiny-llama-gsm/config.json").read_text())
    for dtype in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        # 4 layers x K,V x 2 KV heads x head dim 64 x 1 byte (bf16: 2048)
        assert geometry_from_config(cfg, "bfloat16", kv_cache_dtype=dtype).attention_bytes_per_token == 1024
    with pytest.raises(GeometryUnknown, match="MLA"):
        geometry_from_config({"kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_hidden_layers": 2},
                             "bfloat16", kv_cache_dtype="fp8")
    with pytest.raises(GeometryUnknown, match="not known"):
        geometry_from_config(cfg, "bfloat16", kv_cache_dtype="int4")


# ---- CLI ------------------------------------------------------------------------------------

def test_adhoc_flags_reach_the_servers(capsys):
    from harness.cli.main import main as cli_main

    code = cli_main(["run", "--model", "tiny-llama-gsm", "--platform", "cpu", "--compile", "eager",
                     "--kv-cache-dtype", "auto:fp8", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager-kv_p_auto_d_fp8" in out
    prefill = [line for line in out.splitlines() if '"kv_role":"kv_producer"' in line]
    decode = [line for line in out.splitlines() if '"kv_role":"kv_consumer"' in line]
    assert "--kv-cache-dtype" not in prefill[0] and "--kv-cache-dtype fp8 " in decode[0]


@pytest.mark.parametrize("flags,what", [
    (["--kv-cache-dtype", "int4"], "unknown kv cache dtype 'int4'"),
    (["--kv-cache-dtype", "fp8:fp8:fp8"], "--kv-cache-dtype must be N or PREFILL:DECODE"),
    (["--kv-cache-dtype", "fp8", "--platform", "cpu:avx2"], "(kv-cache-fp8-cpu-isa)"),
    (["--prefill-runner", "v2"], "(mixed-runners-not-on-cpu)"),
])
def test_bad_adhoc_cells_are_one_line_exit_2(capsys, flags, what):
    from harness.cli.main import main as cli_main

    args = ["run", "--model", "tiny-llama-gsm", *flags, "--dry-run"]
    if "--platform" not in flags:
        args += ["--platform", "cpu"]
    code = cli_main(args)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and what in err


# ---- the shipped profiles -------------------------------------------------------------------

def test_cpu_full_runs_fp8_on_an_amx_host_and_says_why_not_elsewhere():
    spec = load_matrix()
    amx = expand(spec, "cpu-full", AMX)
    ids = set(amx.by_id())
    base = "v1-CPU_ATTN-p128d128-tiny-llama-gsm-tp1x1-eager"
    assert {f"{base}-kv_fp8", f"{base}-kv_fp8_e5m2", f"{base}-kv_p_auto_d_fp8",
            f"{base}-kv_fp8-fault-corrupt-block-2"} <= ids
    excluded = {x.cell.cell_id: x.rule for x in amx.excluded}
    assert excluded[f"{base}-prunner_v2"] == "mixed-runners-not-on-cpu"
    avx2 = {x.cell.cell_id: x.rule for x in expand(spec, "cpu-full", AVX2).excluded}
    # an AVX2 host computes float32 (host_dtype) and has no fp8 KV cache
    fp8 = [cid for cid in avx2 if "-kv_" in cid]
    assert fp8 and {avx2[cid] for cid in fp8} == {"kv-cache-fp8-cpu-isa"}


def test_nightly_has_fp8_on_the_h200_backends_and_mixed_runners():
    e = expand(load_matrix(), "nightly", GPU2)
    ids = set(e.by_id())
    for runner in ("v1", "v2"):
        for backend in ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"):
            assert f"{runner}-{backend}-p128d128-tiny-llama-gsm-tp1x1-kv_fp8" in ids
            assert f"{runner}-{backend}-p128d128-tiny-llama-gsm-tp1x1-kv_p_auto_d_fp8" in ids
    excluded = {x.cell.cell_id: x.rule for x in e.excluded}
    assert excluded["v1-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-kv_fp8_e5m2"] == "kv-cache-dtype-backend"
    mixed = [cid for cid in ids if re.search(r"-prunner_v[12]", cid)]
    assert {"v2-FLASH_ATTN-p128d128-tiny-llama-gsm-tp1x1-prunner_v1",
            "v1-FLASHINFER-p128d128-tiny-llama-gsm-tp1x1-spec_ngram-prunner_v2"} <= set(mixed)
