"""A stop signal is latched (harness.serve.supervision.registry): once SIGINT/SIGTERM arrived, no
process starts and no verdict is recorded, even where the KeyboardInterrupt it raised was replaced
by the error it caused (an evaluation thread's ServerDisconnectedError) and caught as a cell's."""
from __future__ import annotations

import signal

import pytest

from harness.core.cell import Cell
from harness.core.options import RunOptions
from harness.judge.verdict import Policy, fail
from harness.run.runner import Runner
from harness.serve.supervision import registry as process_registry


@pytest.fixture
def latch(monkeypatch):
    monkeypatch.setattr(process_registry, "_interrupted_by", None)
    monkeypatch.setattr(process_registry, "stop_all", lambda *a, **k: None)
    return process_registry


def runner(tmp_path) -> Runner:
    return Runner(RunOptions(results_dir=str(tmp_path)), Policy(), placement=object(),
                  run_id="run-1", progress=lambda line: None)


def test_before_a_signal_verdicts_are_recorded(latch, tmp_path):
    result = runner(tmp_path).record(Cell(model="tiny"), fail("a real failure", check="x"))
    assert result.record_path.exists()
    assert latch.interrupted_by() is None


@pytest.mark.parametrize("signum,raised", [(signal.SIGINT, KeyboardInterrupt),
                                           (signal.SIGTERM, SystemExit)])
def test_after_a_signal_nothing_is_recorded_or_started(latch, tmp_path, signum, raised):
    try:
        latch._on_signal(signum, None)
    except BaseException:   # noqa: BLE001 - as a `finally` that re-raises another error would
        pass
    assert latch.interrupted_by() == signum
    with pytest.raises(raised):
        runner(tmp_path).record(Cell(model="tiny"),
                                fail("P/D evaluation failed: ServerDisconnectedError", check="x"))
    assert not list(tmp_path.rglob("*.json"))
    with pytest.raises(raised):
        latch.prepare_start()


def test_the_first_signal_is_the_one_latched(latch):
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            latch._on_signal(signum, None)
        except BaseException:  # noqa: BLE001
            pass
    assert latch.interrupted_by() == signal.SIGINT
