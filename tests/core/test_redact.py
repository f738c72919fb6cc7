"""The one redaction filter (harness.core.redact) and the writers it guards: records, JUnit,
annotation (also HTML-escaped), log lines."""
from __future__ import annotations

import json
import logging

import pytest

from harness.core import redact as redact_module
from harness.run.record import SCHEMA_VERSION
from harness.core.redact import (RedactingFilter, is_secret_name, redact, redact_argv, redact_data,
                                 register_secret)


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    monkeypatch.setattr(redact_module, "_known", set())


@pytest.mark.parametrize("text, secret", [
    ("vllm serve m --api-key sk-abcdef123 --port 1", "sk-abcdef123"),
    ("--api-key=hunter2hunter2", "hunter2hunter2"),
    ("Authorization: Bearer abc.def.ghi", "abc.def.ghi"),
    ('{"Authorization": "Basic dXNlcjpwdw=="}', "dXNlcjpwdw=="),
    ("GET http://h/metrics?access_token=tok123456 failed", "tok123456"),
    ("http://user:pa55word@host:80/x", "pa55word"),
    ("env PD_TOKEN=zz1 VLLM_X=1", "zz1"),
    ('{"OPENAI_API_KEY": "opaque-value"}', "opaque-value"),
    ("hf_abcdefghijklmnop and ghp_abcdefghijkl", "hf_abcdefghijklmnop"),
    ("AKIAABCDEFGHIJKLMNOP", "AKIAABCDEFGHIJKLMNOP"),
])
def test_secret_shapes_are_removed(text, secret):
    assert secret not in redact(text, environ={})


def test_registered_secrets_of_any_length_are_removed_as_words():
    register_secret("ab")          # a 2-character token: whole words only
    register_secret("long-token-value")
    out = redact("token ab, tab, 1 of 50, got long-token-value back", environ={})
    assert out == "token ***, tab, 1 of 50, got *** back"


def test_secret_looking_env_values_are_removed():
    env = {"MY_SERVICE_TOKEN": "0123456789abcdef", "SHORT_TOKEN": "1", "HOME": "/root/home"}
    assert redact("x 0123456789abcdef y 1 /root/home", environ=env) == "x *** y 1 /root/home"


@pytest.mark.parametrize("name, secret", [
    ("PD_TOKEN", True), ("OPENAI_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True),
    ("apiKey", True), ("key", True), ("DB_PASSWORD", True),
    ("auth_env", False), ("HF_TOKEN_PATH", False), ("prompt_tokens_total", False),
    ("tokenizer", False), ("author", False), ("HOME", False),
])
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


def test_data_argv_env_and_names_are_kept_apart():
    record = {"cell": {"extra_args": ["--api-key", "k", "--port", "8000"],
                       "extra_env": {"MY_TOKEN": "x", "VLLM_LOGGING": "1"}},
              "deployment": {"auth_env": "PD_TOKEN"}, "metrics": {"n": 5}}
    out = redact_data(record, environ={})
    assert out["cell"]["extra_args"] == ["--api-key", "***", "--port", "8000"]
    assert out["cell"]["extra_env"] == {"MY_TOKEN": "***", "VLLM_LOGGING": "1"}
    assert out["deployment"] == {"auth_env": "PD_TOKEN"} and out["metrics"] == {"n": 5}
    assert redact_argv(["--token", "t", "x"]) == ["--token", "***", "x"]


def test_log_records_are_redacted(caplog):
    logger = logging.getLogger("test.redact")
    caplog.handler.addFilter(RedactingFilter())
    with caplog.at_level(logging.INFO, logger="test.redact"):
        logger.info("started %s", "vllm --api-key sk-abcdef123")
    assert "sk-abcdef123" not in caplog.text and "--api-key ***" in caplog.text


def test_records_junit_and_annotation_hold_no_secret_and_no_markup(tmp_path):
    from types import SimpleNamespace

    from harness.report.annotate import render_markdown
    from harness.report.junit import write_junit
    from harness.run.record import load_records, write_record

    register_secret("s3")
    reason = ("P/D evaluation failed: HTTP 500 <img src=x onerror=alert(1)> from "
              "http://router/?api_key=sk-leaked-key-1 token s3")
    record = {"schema_version": SCHEMA_VERSION, "run_id": "r1", "created_at": "2026-12-03T00:00:00Z",
              "cell": {"id": "v1-CPU_ATTN-p32d32-m-tp1x1", "extra_args": ["--api-key", "k9"]},
              "versions": {}, "hardware": {}, "options": {}, "metrics": {},
              "verdict": {"status": "FAIL", "outcome": "FAIL", "reason": reason, "checks": []},
              "timings": {}, "artifacts": {}}
    path = write_record(tmp_path, record)
    text = path.read_text()
    assert "sk-leaked-key-1" not in text and "k9" not in text and " s3" not in text
    markdown = render_markdown(load_records(tmp_path))
    assert "<img" not in markdown and "&lt;img" in markdown and "sk-leaked" not in markdown
    verdict = SimpleNamespace(outcome="FAIL", reason=reason)
    result = SimpleNamespace(cell=SimpleNamespace(cell_id="c"), verdict=verdict, record={},
                             record_path=None)
    write_junit(str(tmp_path / "j.xml"), [result], "r1")
    junit = (tmp_path / "j.xml").read_text()
    assert "sk-leaked-key-1" not in junit and " s3" not in junit


def test_a_record_cannot_leave_its_results_directory(tmp_path):
    from harness.core.safe_paths import UnsafePath
    from harness.run.record import write_record

    record = {"schema_version": SCHEMA_VERSION, "run_id": "r1", "created_at": "", "cell": {"id": "../../x"},
              "versions": {}, "hardware": {}, "options": {}, "metrics": {}, "verdict": {},
              "timings": {}, "artifacts": {}}
    with pytest.raises(UnsafePath, match="lies outside"):
        write_record(tmp_path / "results", record)
    assert not (tmp_path / "x.json").exists()
    assert json.dumps(record)   # untouched


def test_the_working_directory_is_not_a_secret():
    assert not is_secret_name("PWD") and not is_secret_name("OLDPWD")
    assert is_secret_name("DB_PWD")
    assert redact("/work/main/x", {"PWD": "/work/main"}) == "/work/main/x"
