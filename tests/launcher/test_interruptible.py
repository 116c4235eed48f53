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


def _swallowing_the_first_cut() -> None:
    """As C code may do with an exception raised inside it (numpy's extension does)."""
    try:
        time.sleep(30)
    except BaseException:  # noqa: BLE001 - the point of this callee
        pass
    time.sleep(30)


def _making_its_own_error_of_the_cut() -> None:
    """As torch's import does once numpy's extension failed with the cut."""
    try:
        time.sleep(30)
    except BaseException as cut:
        raise ImportError("cannot load module more than once per process") from cut


@pytest.mark.parametrize("callee", [_swallowing_the_first_cut, _making_its_own_error_of_the_cut])
def test_a_cut_ends_a_call_that_swallows_it_or_makes_its_own_error_of_it(
        cut_on_sigusr1: Interruptible, callee: Any) -> None:
    before = signal.getsignal(signal.SIGALRM)
    started = time.monotonic()
    _signal_in(0.2)
    assert cut_on_sigusr1.run(callee) is None
    assert time.monotonic() - started < 10  # not the 30 s of the rest of the call
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # the repeats stopped
    assert signal.getsignal(signal.SIGALRM) is before


def test_a_second_cut_during_the_repeats_leaves_sigalrm_as_it_was(
        cut_on_sigusr1: Interruptible) -> None:
    """The launcher cuts on every signal: a second one came while the first cut's repeats ran
    (TERM, then Ctrl-C), and SIGALRM's handler was left as the repeats' own."""
    def swallowing_every_cut_for_a_while() -> None:
        until = time.monotonic() + 0.6  # both signals come in this, the repeats too
        while time.monotonic() < until:
            try:
                time.sleep(0.01)
            except BaseException:  # noqa: BLE001 - the point of this callee
                pass
        time.sleep(30)

    before = signal.getsignal(signal.SIGALRM)
    _signal_in(0.2)
    _signal_in(0.3)
    assert cut_on_sigusr1.run(swallowing_every_cut_for_a_while) is None
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is before
