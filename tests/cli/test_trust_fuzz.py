"""Hostile and careless input, as a table: each case is one line on stderr and exit 2, no
server started, no file written outside the results directory, and no secret echoed. The
cases are the hostile inputs a user can give (alias bombs, deep nesting, `..` in cell ids, NaN timeouts,
foreign auth_env names, tokens in URLs, ...) and more. In-process (`harness.cli.main.main`) so
that the ~60 cases take seconds; `ManagedProcess.start` is replaced by a recorder."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.serve.supervision import process as process_module

SECRET = "sk-fuzz-secret-0123456789"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefg", "bcdefgh"))
GRID = "profiles: {p: {grids: [{model: tiny-llama-gsm, device: cpu, backend: CPU_ATTN, %s}]}}\n"


def matrix(text: str | bytes):
    return ("matrix", text)


def deployment(body: str, **fields):
    return ("deployment", body)


OK_DEPLOY = ("model: tiny-llama-gsm\nbaseline: {url: 'http://127.0.0.1:9'}\n"
             "pd: {router: 'http://127.0.0.1:8'}\nmetrics: {decode: ['http://127.0.0.1:8/metrics']}\n")

# (id, extra argv or (kind, file text), a piece of the one line)
CASES = [
    # ---- matrix files
    ("matrix-alias-bomb", matrix("extends: default\n" + BOMB), "alias"),
    ("matrix-binary", matrix(bytes(range(256)) * 4), "not UTF-8"),
    ("matrix-nul", matrix("profiles:\x00 {}\n"), "NUL"),
    ("matrix-deep", matrix("x: " + "[" * 3000 + "]" * 3000 + "\n"), "nested deeper"),
    ("matrix-deep-maps", matrix("x: " + "{a: " * 500 + "1" + "}" * 500 + "\n"), "nested deeper"),
    ("matrix-huge", matrix("# " + "x" * (2 << 20) + "\n"), "larger than"),
    ("matrix-duplicate-key", matrix("profiles: {}\nprofiles: {}\n"), "duplicate key"),
    ("matrix-inf", matrix("extends: default\ndefaults: {max_model_len: .inf}\n"), "infinite"),
    ("matrix-nan", matrix("extends: default\ndefaults: {max_model_len: .nan}\n"), "NaN"),
    ("matrix-not-yaml", matrix("profiles: {p: [\n"), "not valid YAML"),
    ("matrix-model-tag-dotdot", matrix("extends: default\n" + GRID % "model_tag: ../../../../x"),
     "not a safe file name"),
    ("matrix-model-tag-slash", matrix("extends: default\n" + GRID % "model_tag: a/b"),
     "not a safe file name"),
    ("matrix-extra-env-equals", matrix("extends: default\n" + GRID % "extra_env: {'A=B': x}"),
     "extra_env"),
    ("matrix-tp-huge", matrix("extends: default\n" + GRID % "tp: 1000000000000"),
     "not divisible by TP"),   # the validity rules drop every cell: their reason is the line
    ("matrix-tp-huge-unknown-model", matrix("extends: default\n" + (GRID % "tp: 1000000000000")
                                            .replace("tiny-llama-gsm", "org/unknown")),
     "prefill_tp"),
    ("matrix-tp-1e12-string", matrix("extends: default\n" + GRID % "tp: 1e12"), "tp"),
    ("matrix-giant-value", matrix("extends: default\ndefaults: [" + ", ".join(["FOO" * 50] * 5000)
                                  + "]\n"), "defaults"),
    ("matrix-list-top", matrix("[1, 2, 3]\n"), "mapping"),
    ("matrix-missing", ["--matrix", "/nonexistent/m.yaml"], "--matrix: '/nonexistent/m.yaml' is not a file"),
    # ---- command line
    ("platform-cuda-abc", ["--platform", "cuda:abc"], "--platform"),
    ("platform-cuda-huge", ["--platform", "cuda:100000000"], "--platform"),
    ("platform-cuda-zero", ["--platform", "cuda:0"], "--platform"),
    ("keyword-huge", ["-k", "not " * 20000 + "x"], "argument -k: 80001 characters"),
    ("fault-share-negative", ["--fault-share", "-3"], "--fault-share"),
    ("fault-share-nan", ["--fault-share", "nan"], "--fault-share"),
    ("fault-share-word", ["--fault-share", "lots"], "--fault-share"),
    ("fault-block-dotdot", ["--fault-block", "../../../x"], "--fault-block"),
    ("task-unknown", ["--task", "nosuchtask"], "unknown task"),
    ("dataset-dir-missing", ["--dataset-dir", "/nonexistent"], "--dataset-dir"),
    ("startup-timeout-nan", ["--startup-timeout", "nan"], "--startup-timeout"),
    ("startup-timeout-inf", ["--startup-timeout", "inf"], "--startup-timeout"),
    ("startup-timeout-negative", ["--startup-timeout", "-1"], "--startup-timeout"),
    ("junit-proc", ["--junit-xml", "/proc/x"], "--junit-xml"),
    ("junit-dir", ["--junit-xml", "/"], "--junit-xml"),
    ("results-dir-proc", ["--results-dir", "/proc/x"], "--results-dir"),
    ("kv-cache-bytes-negative", ["--kv-cache-bytes", "-1"], "--kv-cache-bytes"),
    ("num-fewshot-negative", ["--num-fewshot", "-1"], "--num-fewshot"),
    ("max-gen-toks-negative", ["--max-gen-toks", "-5"], "--max-gen-toks"),
    ("limit-word", ["--limit", "abc"], "--limit"),
    ("limit-zero", ["--limit", "0"], "--limit"),
    ("concurrency-zero", ["--concurrency", "0"], "--concurrency"),
    ("repeats-zero", ["--repeats", "0"], "--repeats"),
    ("alpha-two", ["--alpha", "2"], "--alpha"),
    ("margin-nan", ["--margin", "nan"], "--margin"),
    ("server-arg-huge", ["--server-arg", "x" * 5000], "--server-arg"),
    ("allow-auth-env-bad", ["--allow-auth-env", "not a name"], "--allow-auth-env"),
    ("shard-bad", ["--shard", "5/2"], "shard"),
    ("backend-unknown", ["--model", "tiny-llama-random", "--backend", "FOO"], "backend"),
    ("model-missing", ["--model", "/nonexistent/model"], "neither a zoo model"),
    ("model-config-binary", ("model", bytes(range(256))), "not JSON"),
    ("model-config-list", ("model", "[1, 2]"), "not an HF config"),
    ("model-config-no-arch-list", ("model", '{"architectures": "Llama"}'), "not an HF config"),
    ("profile-unknown", ["--profile", "no-such-profile"], "unknown profile"),
    ("model-and-profile", ["--model", "tiny-llama-random", "--profile", "smoke"], "either"),
    ("unknown-flag", ["--no-such-flag"], "unrecognized"),
    # ---- deployment files
    ("deploy-auth-env-home", deployment(OK_DEPLOY.replace("{url: 'http://127.0.0.1:9'}",
                                        "{url: 'http://127.0.0.1:9', auth_env: HOME}")),
     "not a PD_* variable"),
    ("deploy-auth-env-aws", deployment(OK_DEPLOY.replace("{router: 'http://127.0.0.1:8'}",
                                       "{router: 'http://127.0.0.1:8', auth_env: AWS_SECRET_ACCESS_KEY}")),
     "not a PD_* variable"),
    ("deploy-auth-env-harness", deployment(OK_DEPLOY.replace("{url: 'http://127.0.0.1:9'}",
                                           "{url: 'http://127.0.0.1:9', auth_env: PD_ACCURACY_GSM8K_DIR}")),
     "not a PD_* variable"),
    ("deploy-token-in-query", deployment(OK_DEPLOY.replace(
        "http://127.0.0.1:8/metrics", f"http://127.0.0.1:8/metrics?access_token={SECRET}")),
     "token in its query"),
    ("deploy-token-in-router", deployment(OK_DEPLOY.replace(
        "http://127.0.0.1:8'}", f"http://127.0.0.1:8/?api_key={SECRET}'}}")), "router"),
    ("deploy-userinfo", deployment(OK_DEPLOY.replace("http://127.0.0.1:9", f"http://u:{SECRET}@h:9")),
     "baseline"),
    ("deploy-alias-bomb", deployment(OK_DEPLOY + BOMB), "alias"),
    ("deploy-duplicate-key", deployment(OK_DEPLOY + "model: other\n"), "duplicate key"),
    ("deploy-timeout-inf", deployment(OK_DEPLOY + "timeout_s: .inf\n"), "infinite"),
    ("deploy-timeout-huge", deployment(OK_DEPLOY + "timeout_s: 1.0e+300\n"), "timeout_s"),
    ("deploy-binary", deployment(bytes(range(256))), "not UTF-8"),
    ("deploy-deep", deployment("x: " + "[" * 3000 + "]" * 3000), "nested deeper"),
    ("deploy-secret-key", deployment(OK_DEPLOY.replace("{router: 'http://127.0.0.1:8'}",
                                     f"{{router: 'http://127.0.0.1:8', api_key: {SECRET}}}")),
     "does not belong"),
    ("deploy-missing", ["--deployment", "/nonexistent/d.yaml"], "is not a file"),
]


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """cwd, HOME and TMPDIR inside tmp_path; every ManagedProcess.start recorded."""
    for name in ("cwd", "home", "tmp", "inputs"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    started: list[str] = []
    monkeypatch.setattr(process_module.ManagedProcess, "start",
                        lambda self: started.append(self.name) or self)
    return tmp_path, started


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() or p.is_symlink()}


@pytest.mark.parametrize("case, given, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_nothing_else(case, given, expected, sandbox, capsys):
    root, started = sandbox
    argv = ["run", "--results-dir", str(root / "results")]
    if isinstance(given, tuple):
        kind, text = given
        path = root / "inputs" / (f"{kind}.yaml" if kind != "model" else "model/config.json")
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        argv += {"matrix": ["--matrix", str(path), "--profile", "p"],
                 "deployment": ["--deployment", str(path)],
                 "model": ["--model", str(path.parent)]}[kind]
    else:
        argv += given
    before = _files(root)
    try:
        code = main(argv)
    except SystemExit as exc:   # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (out, err)
    assert len(lines) == 1, err
    assert "error:" in lines[0] and expected.lower() in lines[0].lower(), lines[0]
    assert len(lines[0]) < 700, lines[0]
    assert SECRET not in err + out
    assert started == []
    # the vLLM feature probe's cache (what this vLLM supports) is the harness's, not the input's
    allowed = (root / "results", root / "home" / ".cache" / "pd-accuracy")
    written = {p for p in _files(root) - before if not any(a in p.parents for a in allowed)}
    assert written == set()
