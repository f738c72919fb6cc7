"""The front door: every input a new user or a hostile one gave, that once started servers,
crashed or hung, is now one line on stderr and exit 2, before any process, environment or
results folder is created. In-process (`harness.cli.main.main`), every way to start a process
refused (tests/cli/sandbox.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli.main import main
from tests.cli.sandbox import enter, error_lines, files

LONG = "0." + "1" * 300          # a version of more than 255 characters
FULL_WIDTH = "０.３２.０"
GRID = ("extends: default\nprofiles: {p: {grids: [{model: tiny-llama-gsm, device: cpu, "
        "backend: CPU_ATTN, compile: eager, %s}]}}\n")


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    started = enter(tmp_path, monkeypatch)
    return tmp_path, started


def matrix(text: str):
    return ("matrix", text)


# (id, argv or (matrix text, argv), environment, a piece of the one line)
CASES = [
    # input silently dropped, and servers started anyway
    ("backend-without-model", ["run", "--backend", "flashinfer"], {},
     "no selected cell of profile smoke has --backend FLASHINFER"),
    ("connector-without-model", ["run", "--kv-connector", "mooncake", "--dry-run"], {},
     "has --kv-connector mooncake"),
    ("weather-typo", ["run", "--weather", "lod", "--dry-run"], {}, "did you mean load?"),
    ("profile-and-backend", ["run", "--profile", "smoke", "--backend", "FLASHINFER", "--dry-run"],
     {}, "has --backend FLASHINFER (they have: CPU_ATTN)"),
    ("vllm-empty", ["run", "--vllm", "", "--profile", "smoke"], {}, "names no release"),
    ("abbreviated-profile", ["run", "--profil", "pr"], {}, "unrecognized arguments: --profil"),
    ("abbreviated-vllm", ["run", "--vll", "0.32.0"], {}, "unrecognized arguments: --vll"),
    ("warm-margin", ["warm", "--margin", "3", "--dry-run"], {}, "unrecognized arguments: --margin"),
    ("warm-junit", ["warm", "--junit-xml", "x.xml"], {}, "unrecognized arguments: --junit-xml"),
    ("extra-env-after-word", matrix(GRID % "fault: corrupt-block, extra_env: "
                                           "{PD_ACCURACY_FAULT_AFTER: abc}"), {},
     "extra_env PD_ACCURACY_FAULT_AFTER='abc'"),
    ("extra-env-after-negative", matrix(GRID % "fault: corrupt-block, extra_env: "
                                               "{PD_ACCURACY_FAULT_AFTER: '-5'}"), {},
     "PD_ACCURACY_FAULT_AFTER='-5'"),
    ("extra-env-after-huge", matrix(GRID % "fault: corrupt-block, extra_env: "
                                           "{PD_ACCURACY_FAULT_AFTER: '1e30'}"), {},
     "PD_ACCURACY_FAULT_AFTER='1e30'"),
    ("extra-env-share-nan", matrix(GRID % "fault: corrupt-block, extra_env: "
                                          "{PD_ACCURACY_FAULT_SHARE: nan}"), {},
     "PD_ACCURACY_FAULT_SHARE='nan'"),
    ("extra-env-typo", matrix(GRID % "extra_env: {PD_ACCURACY_FAULT_AFTR: '3'}"), {},
     "not a variable of the fault plugin"),
    ("extra-env-spin", matrix(GRID % "extra_env: {PD_ACCURACY_MQ_SPIN_SLEEP_US: fast}"), {},
     "PD_ACCURACY_MQ_SPIN_SLEEP_US"),
    # tracebacks and hangs
    ("weather-param-nan", ["run", "--model", "tiny-llama-gsm", "--weather", "soak",
                           "--weather-param", "requests=nan", "--dry-run"], {}, "finite"),
    ("weather-param-window-nan", ["run", "--model", "tiny-llama-gsm", "--weather", "soak",
                                  "--weather-param", "window=nan", "--dry-run"], {}, "finite"),
    ("weather-param-inf", ["run", "--model", "tiny-llama-gsm", "--weather", "soak",
                           "--weather-param", "requests=inf", "--dry-run"], {}, "finite"),
    ("weather-param-1e400", ["run", "--model", "tiny-llama-gsm", "--weather", "soak",
                             "--weather-param", "kv_blocks=1e400", "--dry-run"], {}, "finite"),
    ("weather-param-fail-share-nan", ["run", "--model", "tiny-llama-gsm", "--weather", "soak",
                                      "--weather-param", "fail_share=nan", "--dry-run"], {},
     "finite"),
    ("matrix-weather-400-digits", matrix(GRID % f"weather: soak, weather_params: "
                                                f"{{requests: {'9' * 400}}}"), {},
     "finite number"),
    ("release-long-run", ["run", "--vllm", LONG, "--dry-run"], {}, "--vllm"),
    ("release-long-bisect", ["bisect", "--good", LONG, "--bad", "0.32.0", "-k", "x"], {},
     "--good"),
    ("release-long-pipeline", ["pipeline", "--profile", "smoke", "--vllm", LONG], {}, "--vllm"),
    ("release-long-matrix", matrix(f"extends: default\nprofiles: {{p: {{include: [smoke], "
                                   f"vllm_releases: ['{LONG}']}}}}\n"), {}, "vllm_releases"),
    ("release-long-list", ("list", matrix(f"extends: default\nprofiles: {{p: {{include: [smoke], "
                                          f"vllm_releases: ['{LONG}']}}}}\n")), {}, "vllm_releases"),
    ("release-full-width", ["run", "--vllm", FULL_WIDTH, "--dry-run"], {}, "expected a version"),
    ("bisect-bad-version", ["bisect", "--good", "0.32.0-foo", "--bad", "0.33.0", "-k", "x"], {},
     "'0.32.0-foo': expected a version"),
    ("bisect-comma", ["bisect", "--good", "0.31.0", "--bad", "0.32.0", "--vllm", ",", "-k", "x"],
     {}, "names no release"),
    ("bisect-good-not-walked", ["bisect", "--good", "0.31.0", "--bad", "0.32.0", "--vllm",
                                "0.30.0,0.32.0", "-k", "tiny-llama-gsm", "--platform", "cpu"], {},
     "it lacks 0.31.0"),
    ("bisect-out-unwritable", ["bisect", "--good", "0.31.0", "--bad", "0.32.0", "--out",
                               "/proc/table.md", "-k", "x"], {}, "--out"),
    ("bisect-no-cell", ["bisect", "--good", "0.31.0", "--bad", "0.32.0", "--vllm",
                        "0.31.0,0.32.0", "-k", "no-such-cell", "--platform", "cpu"], {},
     "no cell selected"),
    ("list-platform-huge", ["list", "--platform", "cuda:999999999"], {}, "1 to 1024 GPUs"),
    ("pipeline-platform-huge", ["pipeline", "--profile", "pr", "--platform", "cuda:999999999"],
     {}, "1 to 1024 GPUs"),
    ("vllm-package-option", ["run", "--vllm", "0.32.0", "--dry-run"],
     {"PD_ACCURACY_VLLM_PACKAGE": "--index-url=http://evil.example/simple"},
     "$PD_ACCURACY_VLLM_PACKAGE"),
    ("vllm-envs-relative", ["run", "--vllm", "0.32.0", "--dry-run"],
     {"PD_ACCURACY_VLLM_ENVS": "../../etc"}, "absolute path"),
    ("model-typo", ["run", "--model", "tiny-lama", "--dry-run"], {},
     "did you mean tiny-llama-gsm?"),
    ("backend-typo", ["run", "--model", "tiny-llama-gsm", "--backend", "flashinfr", "--dry-run"],
     {}, "did you mean FLASHINFER?"),
    ("connector-typo", ["run", "--kv-connector", "nixl_push", "--dry-run"], {},
     "did you mean nixl-push?"),
    ("profile-typo", ["run", "--profile", "smok", "--dry-run"], {}, "did you mean 'smoke'?"),
    ("gpu-profile-on-cpu", ["run", "--profile", "pr", "--platform", "cpu", "--dry-run"], {},
     "`pd-accuracy list --profile pr --platform cuda:1` lists them"),
    # options a command would not use
    ("bench-from-and-limit", ["bench", "--from", ".", "--limit", "5"], {}, "bench --from reads"),
    ("list-rules-and-profile", ["list", "--rules", "--profile", "pr"], {}, "--rules lists"),
    ("pipeline-test-areas-max-steps", ["pipeline", "--profile", "smoke", "--format",
                                       "test-areas", "--max-steps", "3"], {},
     "--max-steps: they shape a Buildkite pipeline"),
    ("auth-env-without-deployment", ["run", "--allow-auth-env", "PD_TOKEN", "--dry-run"], {},
     "--allow-auth-env: only with --deployment"),
    ("dry-run-junit", ["run", "--dry-run", "--junit-xml", "v.xml"], {}, "writes no verdicts"),
    ("model-and-only", ["run", "--model", "tiny-llama-gsm", "--only", "x", "--dry-run"], {},
     "--only: they pick among a profile's cells"),
    ("profile-and-server-arg", ["run", "--server-arg=--foo", "--dry-run"], {},
     "--server-arg: they shape the --model cell"),
    ("split-layout-on-cpu", ["run", "--gpu-layout", "split", "--platform", "cpu", "--dry-run"], {},
     "no selected cell runs on CUDA"),
    # the variables the servers read, parsed first
    ("max-starting-word", ["run", "--dry-run"], {"PD_ACCURACY_MAX_STARTING": "lots"},
     "$PD_ACCURACY_MAX_STARTING"),
    ("fault-in-environment", ["run", "--dry-run"], {"PD_ACCURACY_FAULT": "corrupt-block"},
     "belong to its cell"),
    ("fork-start-yes", ["warm", "--dry-run"], {"PD_ACCURACY_FORK_START": "yes"},
     "$PD_ACCURACY_FORK_START"),
]


@pytest.mark.parametrize("case, given, env, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_created(case, given, env, expected, sandbox,
                                                         monkeypatch, capsys):
    root, started = sandbox
    command = "run"
    if isinstance(given, tuple) and given[0] == "list":
        command, given = "list", given[1]
    if isinstance(given, tuple):
        path = root / "inputs" / "matrix.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(given[1])
        argv = [command, "--matrix", str(path), "--profile", "p", "--platform", "cpu"]
        argv += ["--dry-run"] if command == "run" else []
    else:
        argv = list(given)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = files(root)
    code = main(argv)
    out, err = capsys.readouterr()
    lines = error_lines(err)
    assert code == 2, (out, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("pd-accuracy: error: "), lines[0]
    assert expected in lines[0], lines[0]
    assert "Traceback" not in out + err
    assert started == []
    created = {p for p in files(root) - before if ".cache" not in p.parts}
    assert created == set(), created


def test_a_gpu_profile_listed_on_a_cpu_says_how_to_list_its_cells(sandbox, capsys):
    assert main(["list", "--profile", "pr", "--platform", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "0 cell(s)" in out and "--platform cuda:1` lists them" in out


def test_warm_dry_run_prints_servers_and_starts_none(sandbox, capsys):
    root, started = sandbox
    assert main(["warm", "--dry-run", "--platform", "cpu", "-k", "tiny-llama-gsm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# warm: 1 configuration(s) of 7 cell(s)") and "api_server" in out
    assert started == []


def test_a_release_run_dry_run_before_its_environment_exists_runs_nothing(sandbox, capsys):
    root, started = sandbox
    assert main(["run", "--vllm", "0.32.0", "--dry-run", "--platform", "cpu", "-k",
                 "tiny-llama-gsm-tp1x1-eager"]) == 0
    out = capsys.readouterr().out
    assert "uv venv" not in out or "venv" in out   # the recipe it would make
    assert "-m harness.cli run" in out and "--results-dir results/runs/vllm-0.32.0" in out
    assert started == [] and not any((root / "envs").iterdir())


def test_a_backend_is_taken_in_any_case(sandbox, capsys):
    assert main(["run", "--model", "tiny-llama-gsm", "--backend", "cpu_attn", "--platform", "cpu",
                 "--dry-run"]) == 0
    assert "--attention-backend CPU_ATTN" in capsys.readouterr().out


def test_a_profile_option_picks_its_cells(sandbox, capsys):
    assert main(["run", "--dry-run", "--platform", "cpu", "--block-size", "32"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("# v")] == [
        "v1-CPU_ATTN-p32d32-tiny-llama-gsm-tp1x1-eager"]


def test_doctor_with_a_malformed_cache_probes_again(tmp_path, monkeypatch, capsys):
    """The probe's cache is the harness's own file: a malformed one (an older shape, an edit) is
    probed afresh and rewritten, never a traceback."""
    from harness.serve.launch import vllm_features

    good = {"version": "0.32.0", "platform": "cpu", "attention_backend_flag": True,
            "attention_backend_env": False, "v2_runner_env": True, "kv_roles": ["kv_both"],
            "hooks": {}, "hook_shapes": {}}
    key = vllm_features.cache_key()
    path = tmp_path / f"vllm-features-{key}.json"
    path.write_text(json.dumps({**good, "hook_shapes": []}))
    monkeypatch.setattr(vllm_features, "DEFAULT_CACHE_DIR", tmp_path)
    monkeypatch.setattr(vllm_features, "_run_probe", lambda: good)
    assert main(["doctor", "--json"]) in (0, 1)
    out, err = capsys.readouterr()
    assert json.loads(out)["vllm"] == "0.32.0" and "Traceback" not in err
    assert json.loads(path.read_text())["hook_shapes"] == {}


@pytest.mark.parametrize("option, expected", [
    ("--pd-platform=cuda:999999999", "1 to 1024 GPUs"),
    ("--pd-profile=smok", "did you mean 'smoke'?"),
    ("--pd-run-arg=--backend=CPU_ATTN", "--pd-run-arg --backend"),
    ("--pd-limit=nan", "--limit"),
])
def test_the_pytest_plugin_refuses_bad_options_in_one_line(tmp_path, option, expected):
    """The plugin's options go through the same front door: one line on stderr, exit 2, no
    test run (a run of vLLM's own tests loads the plugin too)."""
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           option, "test_x.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 2, done.stdout + done.stderr
    lines = error_lines(done.stderr)
    assert len(lines) == 1 and "pd-accuracy: error:" in lines[0] and expected in lines[0], lines
    assert "passed" not in done.stdout


def test_bisect_walks_the_listed_releases_from_good_to_bad(sandbox, capsys):
    """--good and --bad bound the walk of --vllm; its dry run makes no environment."""
    root, started = sandbox
    assert main(["bisect", "--good", "0.30.0", "--bad", "0.32.0", "--vllm",
                 "0.29.0,0.30.0,0.31.0,0.32.0,0.33.0", "--dry-run", "-k", "p32d32",
                 "--platform", "cpu", "--limit", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["0.30.0", "0.31.0", "0.32.0"]
    assert "pd-accuracy run -k p32d32 --platform cpu --limit 20 --results-dir " in lines[0]
    assert started == [] and not any((root / "envs").iterdir())
