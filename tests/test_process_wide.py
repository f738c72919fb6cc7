"""ProcessWide: one object per process, made once even when threads ask at the same time."""
from __future__ import annotations

import threading
import time

from harness.core.process_wide import ProcessWide


def test_threads_asking_first_get_one_object():
    made = []

    def make():
        time.sleep(0.05)            # wide window: without the lock each thread would make one
        made.append(object())
        return made[-1]

    one = ProcessWide(make, "a test object")
    got = []
    threads = [threading.Thread(target=lambda: got.append(one())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 1 and all(g is made[0] for g in got)
    assert one.__doc__ == "a test object"


def test_replaced_puts_the_old_object_back():
    one = ProcessWide(object, "x")
    assert one.made() is None
    first = one()
    stand_in = object()
    with one.replaced(stand_in):
        assert one() is stand_in
    assert one() is first
    assert one.replace(None) is first and one.made() is None and one() is not first
