"""``launcher.interruptible``: a real signal's handler cuts short the one call under way, and
nothing outside it."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any, Iterator

import pytest

from rankguard.launcher.interruptible import Interruptible


@pytest.fixture
def cut_on_sigusr1() -> Iterator[Interruptible]:
    """An Interruptible that SIGUSR1's handler cuts, as the launcher's handlers do."""
    hosting = Interruptible()
    previous = signal.signal(signal.SIGUSR1, lambda _sig, _frame: hosting.cut())
    try:
        yield hosting
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _signal_in(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    return timer


def test_a_signal_cuts_the_call_under_way_short(cut_on_sigusr1: Interruptible) -> None:
    started = time.monotonic()
    _signal_in(0.2)
    assert cut_on_sigusr1.run(lambda: time.sleep(30)) is None
    assert time.monotonic() - started < 10  # not the 30 s of the call


def test_a_signal_outside_a_call_raises_nothing_and_no_later_call_starts(
        cut_on_sigusr1: Interruptible) -> None:
    assert cut_on_sigusr1.run(lambda: "done") == "done"
    _signal_in(0.0).join()
    time.sleep(0.1)  # the handler ran here, outside any call: nothing was raised
    started: list[Any] = []
    assert cut_on_sigusr1.run(lambda: started.append(1)) is None
    assert started == []


def test_a_calls_own_error_is_not_taken_for_a_cut() -> None:
    with pytest.raises(ValueError, match="its own"):
        Interruptible().run(lambda: (_ for _ in ()).throw(ValueError("its own")))
