"""No option of `pd-accuracy run` is ignored: each one, given a valid value other than its
default, either changes the --dry-run plan (the run's settings and every server command) or is
refused in one line. A new option without a value here fails the walk."""
from __future__ import annotations

import re

import pytest

from harness.cli.main import build_parser, main
from harness.cli.surface import commands
from tests.cli.sandbox import enter, error_lines

BASE = ["run", "--dry-run", "--platform", "cpu", "-k", "tiny-llama-gsm and not fault"]
MATRIX = "extends: default\ndefaults: {max_model_len: 1024}\n"

# option -> the argv that gives it (a valid, non-default value); "{tmp}": the test's directory
VALUES = {
    # (its netns cells ask `ip` which subnets are free: a read, but a child process)
    "--profile": ["--profile", "cpu-full", "-k", "tiny-llama-gsm and not fault and not netns"],
    "--matrix": ["--matrix", "{tmp}/m.yaml"],
    "--only": ["--only", "v1-CPU_ATTN-p32d32-tiny-llama-gsm-tp1x1-eager"],
    "-k": ["-k", "p64d128"],
    "--shard": ["--shard", "1/2"],
    "--platform": ["--platform", "cpu:avx2"],
    "--deployment": ["--deployment", "{tmp}/m.yaml"],
    "--allow-auth-env": ["--allow-auth-env", "PD_TOKEN"],
    "--model": ["--model", "tiny-llama-gsm"],
    "--backend": ["--backend", "TRITON_ATTN"],
    "--runner": ["--runner", "v2"],
    "--prefill-runner": ["--prefill-runner", "v2"],
    "--block-size": ["--block-size", "32"],
    "--device": ["--device", "cuda"],
    "--kv-buffer-device": ["--kv-buffer-device", "cuda"],
    "--tp": ["--tp", "2"],
    "--dtype": ["--dtype", "float32"],
    "--max-model-len": ["--max-model-len", "1024"],
    "--compile": ["--compile", "default"],
    "--network": ["--network", "netns"],
    "--async-scheduling": ["--async-scheduling", "on"],
    "--spec-decode": ["--spec-decode", "ngram"],
    "--prefix-reuse": ["--prefix-reuse"],
    "--chunked-prefill": ["--chunked-prefill", "512"],
    "--cudagraph-mode": ["--cudagraph-mode", "FULL"],
    "--kv-layout": ["--kv-layout", "HND"],
    "--kv-connector": ["--kv-connector", "nixl-push"],
    "--kv-cache-dtype": ["--kv-cache-dtype", "fp8"],
    "--weather": ["--weather", "load"],
    "--weather-param": ["--weather-param", "in_flight=96"],
    "--server-arg": ["--server-arg=--max-num-seqs=8"],
    "--fault": ["--fault", "drop-transfer"],
    "--fault-block": ["--fault-block", "last"],
    "--fault-share": ["--fault-share", "0.5"],
    "--fault-after": ["--fault-after", "10"],
    "--limit": ["--limit", "20"],
    "--task": ["--task", "gsm8k_local"],
    "--dataset-dir": ["--dataset-dir", "{tmp}/data"],
    "--num-fewshot": ["--num-fewshot", "2"],
    "--concurrency": ["--concurrency", "4"],
    "--seed": ["--seed", "7"],
    "--max-gen-toks": ["--max-gen-toks", "64"],
    "--no-noise-floor": ["--no-noise-floor"],
    "--no-kv-digest": ["--no-kv-digest"],
    "--repeats": ["--repeats", "3"],
    "--sample-seed": ["--sample-seed", "11"],
    "--alpha": ["--alpha", "0.05"],
    "--max-questions": ["--max-questions", "200"],
    "--margin": ["--margin", "3"],
    "--startup-timeout": ["--startup-timeout", "120"],
    "--max-starting": ["--max-starting", "2"],
    "--server-start": ["--server-start", "exec"],
    "--parallel-groups": ["--parallel-groups", "2"],
    "--gpu-layout": ["--gpu-layout", "split"],
    "--kv-cache-bytes": ["--kv-cache-bytes", "268435456"],
    "--results-dir": ["--results-dir", "{tmp}/elsewhere"],
    "--junit-xml": ["--junit-xml", "{tmp}/v.xml"],
    "--vllm": ["--vllm", "0.32.0"],
    "--verbose": ["--verbose"],
    "--run-id": ["--run-id", "given-run"],
}
# the plan itself: without it the walk would start servers
NOT_WALKED = {"--dry-run", "--help"}
_BASE: dict[str, str] = {}
PORTS = re.compile(r"((?:PORT=|--port |:)\d{4,5}\b)")


def run_options() -> list[str]:
    run = dict(commands(build_parser()))["run"]
    return [max(a.option_strings, key=len) for a in run._actions if a.option_strings
            and not NOT_WALKED & set(a.option_strings)]


def plan(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, PORTS.sub("PORT", out), err   # ports are free ones: they differ every plan


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    started = enter(tmp_path, monkeypatch)
    (tmp_path / "m.yaml").write_text(MATRIX)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "test.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    return tmp_path, started


def test_every_option_of_run_has_a_value_to_walk():
    assert sorted(set(run_options()) - set(VALUES)) == []
    assert sorted(set(VALUES) - set(run_options())) == []


@pytest.mark.parametrize("option", sorted(VALUES))
def test_an_option_changes_the_plan_or_is_refused(option, sandbox, capsys):
    tmp, started = sandbox
    if "plan" not in _BASE:   # the base plan once per worker: it is the same in every sandbox
        code, _BASE["plan"], err = plan(BASE, capsys)
        assert code == 0, err
    base = _BASE["plan"]
    given = [a.replace("{tmp}", str(tmp)) for a in VALUES[option]]
    code, out, err = plan(BASE + given, capsys)
    if code == 2:
        assert len(error_lines(err)) == 1 and out == "", (out, err)
    else:
        assert code == 0 and out != base, f"{option} changed nothing in the plan"
    assert started == []
