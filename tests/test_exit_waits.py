"""The process's exit waits for its own helper threads' calls still in torch (``exit_waits``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from rankguard import exit_waits
from rankguard.deadline import Deadline

from .conftest import script

SCRIPT = script("store_call_at_exit.py")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_a_store_call_that_comes_back_while_the_interpreter_exits_no_longer_aborts_it() -> None:
    """A helper's store call returning during the interpreter's finalization aborted the process
    (SIGABRT: torch's binding takes the GIL back in a destructor, and CPython unwinds the
    thread). The exit now waits for it, until its deadline: the process exits 0."""
    done = _run()
    assert done.stdout == "ended\n", done
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr, done.stderr[-2000:]


@pytest.mark.slow  # out of the quick run, with the case above it proves
def test_the_same_call_left_out_of_the_exit_wait_aborts_the_process() -> None:
    """The fault the wait prevents, shown with the call left out (so the test above can fail)."""
    done = _run("unregistered")
    assert done.returncode == -signal.SIGABRT, (done.returncode, done.stderr[-2000:])
    assert "terminate called without an active exception" in done.stderr


def test_the_wait_ends_at_each_threads_deadline_and_names_those_left_running() -> None:
    release = threading.Event()
    quick = threading.Thread(target=time.sleep, args=(0.2,), name="quick", daemon=True)
    stuck = threading.Thread(target=release.wait, args=(30,), name="stuck", daemon=True)
    for thread in (quick, stuck):
        thread.start()
    exit_waits.finish_before_exit(quick, Deadline.after(5))
    exit_waits.finish_before_exit(stuck, Deadline.after(0.5))
    exit_waits.finish_before_exit(stuck, Deadline.never())  # not waited for: no error either
    started = time.monotonic()
    try:
        assert exit_waits.wait_for_pending(cap=10) == ["stuck"]
        assert not quick.is_alive()
        assert 0.4 < time.monotonic() - started < 5, time.monotonic() - started
    finally:
        release.set()
        stuck.join(5)


def test_the_whole_wait_is_capped() -> None:
    release = threading.Event()
    stuck = threading.Thread(target=release.wait, args=(30,), name="capped", daemon=True)
    stuck.start()
    exit_waits.finish_before_exit(stuck, Deadline.after(20))
    started = time.monotonic()
    try:
        assert "capped" in exit_waits.wait_for_pending(cap=0.3)
        assert time.monotonic() - started < 5
    finally:
        release.set()
        stuck.join(5)
