"""A profile's `vllm_releases`: parsed, checked at load time, its own (not an include's)."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from harness.cli.main import main as cli_main
from harness.matrix import MatrixError, load_matrix

MATRIX = """
models:
  d: {kind: dense, num_kv_heads: 4}
profiles:
  base:
    defaults: {device: cpu, backend: CPU_ATTN}
    grids: [{model: d, block_size: 32}]
  night:
    include: [base]
    vllm_releases: ["0.27.1", " 0.29.0 ", "0.32.0"]
  wider:
    include: [night]
    vllm_releases: []
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_the_key_parses_in_order_and_is_not_inherited_through_include(tmp_path):
    spec = load_matrix(write(tmp_path, MATRIX))
    assert spec.profile("night").vllm_releases == ("0.27.1", "0.29.0", "0.32.0")
    assert spec.profile("base").vllm_releases == ()
    # `wider` includes night's cells, not its release step
    assert spec.profile("wider").vllm_releases == ()


def test_the_nightly_profile_names_the_releases_of_the_committed_summary():
    assert load_matrix().profile("nightly").vllm_releases == ("0.27.1", "0.29.0", "0.31.0",
                                                              "0.32.0")
    assert load_matrix().profile("smoke").vllm_releases == ()


@pytest.mark.parametrize("releases,message", [
    ('["0.29.0", "latest"]', "vLLM release 'latest': expected a version (0.29.0), a .whl file "
                             "or a vLLM checkout directory"),
    ('["0.29.0", "0.29.0"]', "the list names a release twice: 0.29.0,0.29.0"),
    ('["no-such.whl"]', "vLLM wheel no-such.whl does not exist"),
])
def test_a_bad_release_is_one_line_at_load_time(tmp_path, releases, message):
    path = write(tmp_path, MATRIX.replace('["0.27.1", " 0.29.0 ", "0.32.0"]', releases))
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert str(info.value) == f"m.yaml: profiles.night.vllm_releases: {message}"


def test_a_bad_release_stops_every_command_with_one_line(tmp_path, capsys):
    path = write(tmp_path, MATRIX.replace('"0.32.0"]', '"0.32"]').replace('"0.27.1"', '"x"'))
    for argv in (["list", "--profile", "base"], ["pipeline", "--profile", "base"],
                 ["run", "--profile", "base", "--dry-run"]):
        assert cli_main([*argv, "--matrix", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "profiles.night.vllm_releases: vLLM release 'x'" in err


def test_list_says_the_releases_in_one_line(tmp_path, capsys):
    path = str(write(tmp_path, MATRIX))
    assert cli_main(["list", "--matrix", path, "--profile", "night", "--platform", "any"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "vLLM releases" in line]
    assert lines == ["vLLM releases: 0.27.1, 0.29.0, 0.32.0 (the pipeline's release step runs "
                     "the smoke cells on each)"]
    assert cli_main(["list", "--matrix", path, "--profile", "base", "--platform", "any"]) == 0
    assert "vLLM releases" not in capsys.readouterr().out
    assert cli_main(["list", "--matrix", path, "--profile", "night", "--platform", "any",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["vllm_releases"] == ["0.27.1", "0.29.0", "0.32.0"]
