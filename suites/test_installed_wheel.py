"""Adoption as a user does it: build the wheel, install it (not editable) into a fresh
environment next to the CPU vLLM, and run a ten-line test of one's own that uses the plugin's
fixtures on one real CPU cell, from a directory that is not this repository."""
from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]

DOWNSTREAM_TEST = '''\
import harness
from harness.core.cell import Cell


def test_my_pd_change(pd_judge):
    result = pd_judge(Cell(model="tiny-llama-gsm", compile="eager"))
    print("HARNESS-FROM", harness.__file__)
    assert result.verdict.outcome == "PASS", result.verdict.reason
    assert result.record_path.exists()
'''


def _vllm_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if "vllm.entrypoints.openai.api_server" in " ".join(p.info["cmdline"] or []):
            out.append(p)
    return out


@pytest.mark.slow
def test_the_wheel_works_from_another_tree(tmp_path):
    before = {p.pid for p in _vllm_processes()}
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(wheels), str(REPO)], check=True, capture_output=True)
    [wheel] = wheels.glob("pd_accuracy-*.whl")
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-deps", str(wheel)], check=True, capture_output=True)
    # the environment that has vLLM, NIXL, lm-eval and the harness's dependencies, after the
    # wheel's own site-packages: the installed harness wins over this repository's
    (site / "zz-cpu-vllm.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "downstream"
    work.mkdir()
    (work / "test_mine.py").write_text(DOWNSTREAM_TEST)
    results = tmp_path / "results"
    # a 10-pt margin decides a clean cell at its first look (50 questions: bound 9.8 pts), so
    # the adoption check costs one evaluation; the suite itself runs the 5-pt default
    run = subprocess.run([python, "-m", "pytest", "test_mine.py", "-s", "-p", "no:cacheprovider",
                          "--pd-results-dir", str(results), "--pd-margin", "10"],
                         cwd=work, capture_output=True, text=True, timeout=1500)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "1 passed" in out
    harness_from = next(line for line in out.splitlines() if "HARNESS-FROM" in line)
    assert str(site) in harness_from and str(REPO) not in harness_from, harness_from
    assert list(results.rglob("*-eager.json")), "no record was written"
    assert (next(results.iterdir()) / "report" / "index.html").exists()
    left = [p.pid for p in _vllm_processes() if p.pid not in before]
    assert not left, f"vLLM servers left behind: {left}"
