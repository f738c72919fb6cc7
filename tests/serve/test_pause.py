"""The test-only pause point (kill phase 3's window held open): off unless named, one line on
stderr when it holds, and it lets go as soon as the run is stopped."""
from __future__ import annotations

import time

from harness.serve.supervision.pause import PAUSE_ENV, pause_point


def test_off_unless_the_env_names_the_point(monkeypatch, capsys):
    monkeypatch.delenv(PAUSE_ENV, raising=False)
    assert not pause_point("forked-unregistered", "x", pause_s=5)
    monkeypatch.setenv(PAUSE_ENV, "another-point")
    assert not pause_point("forked-unregistered", "x", pause_s=5)
    assert capsys.readouterr().err == ""


def test_holds_until_stopped_and_says_where(monkeypatch, capsys):
    monkeypatch.setenv(PAUSE_ENV, "forked-unregistered")
    release = time.monotonic() + 0.3
    started = time.monotonic()
    assert pause_point("forked-unregistered", "prefill pid=42",
                       stop=lambda: time.monotonic() > release, pause_s=30)
    assert 0.3 <= time.monotonic() - started < 5
    assert capsys.readouterr().err == "pd-accuracy pause at forked-unregistered: prefill pid=42\n"
