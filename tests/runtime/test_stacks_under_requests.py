"""A rank's stacks on demand (``runtime.stacks``) under a stream of requests, as ``rankguard
stacks`` in a loop sends them: the rank lives through its import of torch and its Python code,
answers, and ends with its own exit code, never with SIGSEGV or SIGUSR1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankguard.processes import proctree, stack_requests

from ..conftest import ROOT

SCRIPT = str(ROOT / "tests" / "scripts" / "enters_python_from_c.py")
REQUEST_S = 0.0002  # thousands a second: the sender leaves the rank a core of two
RUNS = 2  # each about 6 s here; before the fix about a third of them died (see the commit)


def _requests_until_exit(proc: subprocess.Popen[bytes], until: float) -> int:
    """SIGUSR1 to ``proc``'s main thread every ``REQUEST_S`` while it catches the signal, until
    it exits or ``until``; how many were sent."""
    sent = 0
    while proc.poll() is None and time.monotonic() < until:
        if proctree.catches(proc.pid, signal.SIGUSR1):
            try:
                proctree.signal_main_thread(proc.pid, signal.SIGUSR1)
                sent += 1
            except OSError:
                pass
        time.sleep(REQUEST_S)
    return sent


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_rank_asked_for_its_stacks_without_pause_lives_answers_and_ends_with_its_own_code(
        tmp_path: Path) -> None:
    for run in range(RUNS):
        stacks = tmp_path / f"stacks{run}.txt"
        env = dict(os.environ, RANKGUARD_STACKS=str(stacks), WORKLOAD_S="3")
        proc = subprocess.Popen([sys.executable, "-m", "rankguard.runtime.bootstrap", SCRIPT],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            sent = _requests_until_exit(proc, time.monotonic() + 40)
            _, err = proc.communicate(timeout=20)
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == 0, (run, proc.returncode, sent, err.decode()[-2000:])
        text = stacks.read_text()
        assert sent > 100 and "Current thread 0x" in text, (sent, text[-2000:])
        # each dump ends with the main thread (the current one), the next begins with a Thread
        mains = [dump.split("\nThread 0x")[0] for dump in text.split("Current thread 0x")[1:]]
        assert any(f'File "{SCRIPT}"' in main for main in mains), text[-2000:]


@pytest.mark.deadline(60)
def test_a_rank_holding_the_gil_in_c_answers_through_faulthandler_after_the_fallback_wait(
        tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    script = str(ROOT / "tests" / "scripts" / "holds_the_gil.py")
    env = dict(os.environ, RANKGUARD_STACKS=str(stacks))
    proc = subprocess.Popen([sys.executable, "-m", "rankguard.runtime.bootstrap", script],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(0.2)  # into its sum()
        started = time.monotonic()
        dumps = stack_requests.ask({0: (proc.pid, [str(stacks)])}, 10.0)
        took = time.monotonic() - started
    finally:
        proc.kill()
        proc.communicate(timeout=20)
    # the watcher cannot take the GIL: faulthandler answered the second signal
    assert f'File "{script}", line 5 in <module>' in dumps.get(0, ""), dumps
    assert stack_requests.FALLBACK_AFTER_S <= took < 10.0, took


@pytest.mark.deadline(60)
@pytest.mark.parametrize("doing", ["sleep", "gil"])
def test_a_rank_whose_main_thread_blocks_the_requests_signals_answers_through_another_thread(
        tmp_path: Path, doing: str) -> None:
    # sent to the main thread only (tgkill), the requests stayed pending there for good: the
    # rank never answered, though its watcher thread (and faulthandler there) could
    stacks = tmp_path / "stacks.txt"
    script = str(ROOT / "tests" / "scripts" / "blocks_requests.py")
    env = dict(os.environ, RANKGUARD_STACKS=str(stacks))
    proc = subprocess.Popen([sys.executable, "-m", "rankguard.runtime.bootstrap", script, doing],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(0.2)  # into its sleep or its sum()
        dumps = stack_requests.ask({0: (proc.pid, [str(stacks)])}, 5.0)
        alive = proc.poll() is None
    finally:
        proc.kill()
        proc.communicate(timeout=20)
    assert alive, "the rank died of a request"
    assert "blocks_requests.py" in dumps.get(0, ""), dumps
