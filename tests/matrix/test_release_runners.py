"""A release's model runners are a fact of the release (0.34.0 ships V2 only), and expected
failures are bounded by the releases they were measured on (`vllm:` in `match:`)."""
from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from harness import matrix
from harness.core.platform import PlatformInfo, VllmFeatures
from harness.matrix.spec import Selector, release_in, release_specifiers
from harness.serve.launch.server_spec import Features, build_env
from harness.serve.launch.vllm_features import features_from_modules, model_runners
from tests.server_specs import make_spec


def release(version: str, runners: tuple[str, ...], env: bool) -> VllmFeatures:
    """The features of a CUDA vLLM release as the probe reads them."""
    return VllmFeatures(version=version, platform="cuda", attention_backend_flag=True,
                        attention_backend_env=False, v2_runner_env=env,
                        kv_roles=("kv_producer", "kv_consumer", "kv_both"),
                        attention_backends=("FLASH_ATTN", "TRITON_ATTN", "FLASHINFER"),
                        model_runners=runners)


V034 = release("0.34.0+cu130", ("v2",), env=False)     # Model Runner V1 removed
V033 = release("0.33.0", ("v1", "v2"), env=True)         # both, VLLM_USE_V2_MODEL_RUNNER picks
V026 = release("0.26.0", ("v1", "v2"), env=True)


def one_gpu(features: VllmFeatures) -> PlatformInfo:
    return dataclasses.replace(PlatformInfo.from_spec("cuda:1"), vllm=features)


def pr(features: VllmFeatures):
    return matrix.expand(matrix.load_matrix(), "pr", one_gpu(features))


# ---- which runners a release ships ----------------------------------------------------------

def test_the_probe_finds_the_runners_by_their_modules():
    have_034 = {"vllm.v1.worker.gpu.model_runner"}
    have_033 = have_034 | {"vllm.v1.worker.gpu_model_runner"}
    assert model_runners(lambda m: object() if m in have_034 else None) == ("v2",)
    assert model_runners(lambda m: object() if m in have_033 else None) == ("v1", "v2")

    def missing_parent(module):
        raise ModuleNotFoundError(module)
    assert model_runners(missing_parent) == ()


def test_the_probe_carries_the_runners_into_the_features():
    class Args:
        attention_backend = None

    class Envs:
        environment_variables = {"VLLM_ATTENTION_BACKEND": None}

    class Transfer:
        kv_role = None

    f = features_from_modules(version="0.34.0", device_type="cuda", engine_args_cls=Args,
                              envs_module=Envs, kv_transfer_config_cls=Transfer,
                              model_runners=["v2"])
    assert f.model_runners == ("v2",) and not f.v2_runner_env
    assert VllmFeatures.from_dict(json.loads(json.dumps(f.to_dict()))).model_runners == ("v2",)


def test_on_034_a_v1_cell_is_not_applicable_with_the_reason():
    expansion = pr(V034)
    runners = {c.runner for c in expansion.cells}
    assert runners == {"v2"} and len(expansion.cells) == 17
    gone = matrix.not_applicable(expansion)
    assert len(gone) == 15 and {e.cell.runner for e in gone} == {"v1"}
    assert {e.reason for e in gone} == {
        "not applicable on vLLM 0.34.0+cu130: Model Runner V1 was removed in 0.34.0"}
    assert {e.vllm_version for e in gone} == {"0.34.0+cu130"}


def test_on_034_a_v1_prefill_is_not_applicable_either():
    from harness.core.cell import Cell
    from harness.matrix.rules import check_cell

    cell = Cell(model="tiny-llama-gsm", device="cuda", kv_buffer_device="cuda",
                backend="FLASH_ATTN", runner="v2", prefill_runner="v1")
    problems = [p for p in check_cell(cell, one_gpu(V034), matrix.load_matrix().models)
                if p.rule == "vllm-runner"]
    assert problems and "Model Runner V1 was removed" in problems[0].message


@pytest.mark.parametrize("features", [V033, V026])
def test_releases_with_both_runners_run_every_pr_cell(features):
    expansion = pr(features)
    assert len(expansion.cells) == 32 and not matrix.not_applicable(expansion)


def test_a_v2_cell_runs_without_the_variable_on_034_and_with_it_on_033():
    v2 = make_spec(runner="v2", device="cuda", gpu_backend="FLASHINFER")
    on_034 = build_env(v2, Features(v2_runner_env=V034.v2_runner_env), base_env={})
    on_033 = build_env(v2, Features(v2_runner_env=V033.v2_runner_env), base_env={})
    assert "VLLM_USE_V2_MODEL_RUNNER" not in on_034
    assert on_033["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    v1 = make_spec(runner="v1", device="cuda")
    assert build_env(v1, Features(v2_runner_env=True), base_env={})["VLLM_USE_V2_MODEL_RUNNER"] == "0"


def test_the_cpu_release_keeps_v1():
    cpu_032 = dataclasses.replace(V033, version="0.32.0", platform="cpu")
    assert cpu_032.runner_missing("v1") is None


def test_a_probe_without_runners_falls_back_to_the_variable():
    old = dataclasses.replace(V026, model_runners=None, v2_runner_env=False)
    assert "has no VLLM_USE_V2_MODEL_RUNNER" in old.runner_missing("v2")
    assert old.runner_missing("v1") is None


# ---- no server for a cell that is not applicable ---------------------------------------------

def test_a_v1_cell_on_034_starts_nothing(monkeypatch, tmp_path, capsys):
    """`run` lists the V1 cells as not applicable and starts no process for them."""
    import subprocess

    from harness.cli import run as run_cli
    from harness.serve.launch import vllm_features

    monkeypatch.setattr(vllm_features, "detect_platform", lambda *a, **k: one_gpu(V034))
    spawned = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: spawned.append(a) or (_ for _ in ()).throw(
        AssertionError("a process was started")))
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd")
    run_cli.register(sub)
    args = parser.parse_args(["run", "--profile", "pr", "-k", "v1-", "--results-dir", str(tmp_path)])
    code = run_cli.run_command(args)
    out, err = capsys.readouterr()
    assert code == 2 and not spawned
    assert "15 cell(s) not applicable on vLLM 0.34.0+cu130: Model Runner V1 was removed in 0.34.0" in out
    assert "no cell selected" in err
    assert not any(tmp_path.iterdir())

    args = parser.parse_args(["run", "--model", "tiny-llama-gsm", "--device", "cuda",
                              "--runner", "v1", "--results-dir", str(tmp_path)])
    assert run_cli.run_command(args) == 2 and not spawned
    assert "Model Runner V1 was removed in 0.34.0" in capsys.readouterr().err


def test_on_034_the_selection_decides_which_cells_are_listed_not_applicable(monkeypatch):
    """--only and -k pick runnable and not-applicable cells alike: a run of V2 cells lists none
    of the profile's V1 cells, and a V1 id is named not applicable rather than unknown."""
    from harness.cli.cells import select_cells
    from harness.serve.launch import vllm_features

    monkeypatch.setattr(vllm_features, "detect_platform", lambda *a, **k: one_gpu(V034))
    v2, v1 = "v2-FLASH_ATTN-p64d64-tiny-llama-gsm-tp1x1", "v1-FLASH_ATTN-p64d64-tiny-llama-gsm-tp1x1"

    def select(*argv: str):
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers(dest="cmd")
        from harness.cli import run as run_cli
        run_cli.register(sub)
        cells, _, unrunnable = select_cells(parser.parse_args(["run", "--profile", "pr", *argv]))
        return [c.cell_id for c in cells], [e.cell.cell_id for e in unrunnable]

    assert select("--only", v2) == ([v2], [])
    assert select("--only", f"{v2},{v1}") == ([v2], [v1])
    assert select("-k", "FLASH_ATTN-p64d64 and tiny-llama and not fault") == ([v2], [v1])
    runnable, unrunnable = select()
    assert len(runnable) == 17 and len(unrunnable) == 15


def test_not_applicable_cells_reach_the_history_as_their_own_state(tmp_path):
    from harness.report.history import append_results_dir, load_cells
    from harness.run.record import write_not_applicable

    gone = matrix.not_applicable(pr(V034))
    write_not_applicable(tmp_path / "run-1", "run-1", gone)
    db = tmp_path / "h.sqlite"
    assert append_results_dir(db, tmp_path) == 15
    rows = load_cells(db)
    assert {r["outcome"] for r in rows} == {"N/A"} and {r["vllm_version"] for r in rows} == {
        "0.34.0+cu130"}


# ---- expected failures bounded by release ---------------------------------------------------

@pytest.mark.parametrize("spec, version, inside", [
    ("==0.26.*", "0.26.0", True),
    ("==0.26.*", "0.26.0+cu130", True),
    ("==0.26.*", "0.34.0", False),
    (">=0.27.1,<=0.32.0", "0.32.0", True),
    (">=0.27.1,<=0.32.0", "0.27.0", False),
    (">=0.33", "0.34.0+cu130", True),
    (">=0.33", "0.34.1.dev12+gabcdef", True),
    ("<0.34", "0.34.0rc1", False),      # PEP 440: <V excludes V's own pre-releases
    ("==0.26.*", "not-a-version", False),
])
def test_release_specifiers(spec, version, inside):
    assert release_in(version, release_specifiers(spec)) is inside


def test_a_release_bound_that_is_no_specifier_is_one_line():
    with pytest.raises(matrix.MatrixError, match="no PEP 440 version specifier set"):
        Selector.parse({"vllm": "0.26 or so"})


def test_an_expected_failure_applies_inside_its_releases_only():
    ids = "v2-FLASH_ATTN-p16d64-tiny-llama-gsm-tp1x1"
    on_026 = {c.cell_id: c for c in pr(V026).cells}[ids]
    on_034 = {c.cell_id: c for c in pr(V034).cells}[ids]
    assert on_026.expected_failure and on_026.expected_failure.startswith(
        "declared for vLLM ==0.26.*:")
    assert on_034.expected_failure is None


def test_an_unknown_release_keeps_the_declaration():
    expansion = matrix.expand(matrix.load_matrix(), "pr", PlatformInfo.from_spec("cuda:1"))
    cell = {c.cell_id: c for c in expansion.cells}["v1-FLASH_ATTN-p16d64-tiny-llama-gsm-tp1x1"]
    assert cell.expected_failure


def test_every_declared_failure_names_its_releases():
    spec = matrix.load_matrix()
    books = list(spec.expected_failures) + [b for p in spec.profiles.values()
                                            for b in p.expected_failures]
    assert books and all(b.selector.releases is not None for b in books), [
        b.reason[:60] for b in books if b.selector.releases is None]


def test_a_stopped_packed_run_shows_what_was_judged(tmp_path, capsys):
    from harness.cli.run_packed import judged_before_stop
    from harness.core.cell import Cell

    cells = [Cell(model="tiny-llama-gsm", device="cuda", kv_buffer_device="cuda",
                  backend="FLASH_ATTN", runner="v2")]
    assert judged_before_stop(cells, tmp_path, KeyboardInterrupt(), 12.3) == 130
    assert "interrupted after 12s: 0 of 1 cells judged" in capsys.readouterr().out
    assert judged_before_stop(cells, tmp_path, SystemExit(143), 1.0) == 143
