"""Bad input gets ONE clear line and exit code 2 before any server starts."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest


@pytest.mark.parametrize("args, expected", [
    (["--model", "tiny-llama-random", "--backend", "FOO"], "unknown attention backend 'FOO'"),
    (["--model", "/nonexistent/model"], "neither a zoo model, an existing path"),
    (["--model", "tiny-llama-random", "--block-size", "48"], "multiples of 32"),
    (["--model", "tiny-llama-random", "--runner", "v2"], "V2"),
    (["--profile", "no-such-profile"], "unknown profile"),
    (["--model", "tiny-llama-random", "--block-size", "64:x"], "PREFILL:DECODE"),
    (["--model", "tiny-llama-random", "--max-starting", "-1"], "argument --max-starting: must be a whole number from 0"),
    (["--model", "shape-qwen3-0.6b", "--no-kv-digest"], "has no weights (--load-format dummy)"),
])
def test_bad_input_is_one_line_before_any_server(args: list[str], expected: str, tmp_path) -> None:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness.cli.main", "run", *args,
                           "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("pd-accuracy: error: ")
    assert expected.lower() in lines[0].lower(), lines[0]
    assert not any(tmp_path.iterdir()), "nothing may be written (no server started)"
    assert time.monotonic() - started < 120


@pytest.mark.parametrize("args, expected", [
    (["no-such-model"], "is not a zoo model"),
    (["tiny-llama-gsm", "--limit", "0"], "argument --limit: must be a whole number from 1"),
])
def test_zoo_eval_bad_input_is_one_line_before_any_server(args: list[str], expected: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "harness.cli.main", "zoo", "eval", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert "starting" not in proc.stdout


def test_dry_run_shows_servers_as_they_will_start(capsys):
    """The same planners as a run: a canary's decode armed, digest files for P/D servers only,
    a netns cell's servers behind `ip netns exec`; --no-kv-digest drops the digest files."""
    from harness.cli.main import main

    assert main(["run", "--profile", "smoke", "--dry-run", "-k", "perturb"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if "api_server" in l]
    baseline, prefill, decode = lines
    assert "PD_ACCURACY_FAULT=by-request" in decode and "PD_ACCURACY_FAULT" not in prefill
    assert "PD_ACCURACY_KV_DIGEST_FILE" not in baseline
    assert "prefill-0.kv-digest.jsonl" in prefill and "decode-0.kv-digest.jsonl" in decode
    assert main(["run", "--profile", "cpu-full", "--dry-run", "--no-kv-digest",
                 "-k", "netns and tiny-llama"]) == 0
    lines = [l for l in capsys.readouterr().out.splitlines() if "api_server" in l]
    assert [" netns exec " in l for l in lines] == [False, True, True]
    assert not any("KV_DIGEST" in l for l in lines)


def test_random_weights_without_the_digest_are_refused_and_trained_models_are_not():
    from harness.cli.run_checks import random_weight_problems
    dummy = {"shape-qwen3-0.6b"}.__contains__
    assert random_weight_problems(["shape-qwen3-0.6b"] * 2, False, dummy) == [
        "model shape-qwen3-0.6b has no weights (--load-format dummy): its cells are judged on "
        "the transfer proof, the exact bytes and the KV digest, and --no-kv-digest turns the "
        "digest off"]
    assert random_weight_problems(["shape-qwen3-0.6b"], True, dummy) == []
    assert random_weight_problems(["tiny-llama-gsm"], False, dummy) == []
