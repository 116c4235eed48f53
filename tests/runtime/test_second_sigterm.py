"""A second SIGTERM while a rank handles the first (``runtime.eviction``): the launcher signals a
rank's process group and then its process, and a preempted launcher lands the two apart. Wherever
the second one interrupts the main thread's handling, the rank still tears down and exits 0
within its grace. Before the fix, a second SIGTERM that landed while the main thread held the
teardown's lock deadlocked the rank (the main thread and the watcher both waiting on that lock:
nothing said, SIGKILLed at the launcher's grace), and one that landed just before the main thread
started the teardown left the rank waiting for a teardown that nobody started (exit 143, silent).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankguard.deadline import Deadline

from ..conftest import ROOT

SCRIPT = str(ROOT / "tests" / "scripts" / "second_sigterm.py")
GRACE = 3.0
POSITIONS = 16  # more lines than the main thread's handling runs: the last ones send no second
START_S = 30.0  # for every rank to print its first line, all starting at once on a loaded machine


def _start(at: int, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    out, err = tmp_path / f"out{at}.txt", tmp_path / f"err{at}.txt"
    env = dict(os.environ, SECOND_SIGTERM_AT=str(at), RANKGUARD_GRACE=str(GRACE),
               RANKGUARD_STACKS=str(tmp_path / f"stacks{at}.txt"))
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "rankguard.runtime.bootstrap", SCRIPT],
                                env=env, stdout=stdout, stderr=stderr)
    return proc, out, err


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_second_sigterm_at_any_line_of_the_handling_still_tears_the_rank_down(
        tmp_path: Path) -> None:
    ranks = {at: _start(at, tmp_path) for at in range(1, POSITIONS + 1)}
    try:
        started = Deadline.after(START_S)
        while not started.passed() and not all(out.read_text() for _, out, _ in ranks.values()):
            time.sleep(0.05)
        assert all(out.read_text() == "sleeping\n" for _, out, _ in ranks.values()), "not started"
        for proc, _, _ in ranks.values():
            proc.send_signal(signal.SIGTERM)
        ended = Deadline.after(GRACE + 2.0)
        codes = {}
        for at, (proc, _, _) in ranks.items():
            try:
                codes[at] = proc.wait(timeout=ended.wait_time(GRACE + 2.0))
            except subprocess.TimeoutExpired:
                codes[at] = None
    finally:
        for proc, _, _ in ranks.values():
            proc.kill()
            proc.wait(timeout=10)
    said = {at: err.read_text() for at, (_, _, err) in ranks.items()}
    sent = {at for at, text in said.items() if "second SIGTERM at" in text}
    assert sent and len(sent) < POSITIONS, f"raise POSITIONS: {sorted(sent)}"
    stuck = {at: (codes[at], said[at]) for at in ranks
             if codes[at] != 0 or "SIGTERM: torn down" not in said[at]}
    assert not stuck, stuck
