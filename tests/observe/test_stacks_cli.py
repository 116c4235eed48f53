"""``rankguard stacks`` against a real run whose rank 1 hangs: the ranks grouped by where they
are, the job untouched; then, once it ended, the last stacks; and bad input."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import ROOT, finish, launch

WAIT_S = 60.0


def stacks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rankguard.cli", "stacks", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.deadline(180)
def test_stacks_of_a_hung_run_group_the_ranks_and_leave_it_running(tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    started = time.monotonic()
    proc = launch(["--nproc-per-node", "3", "--hang-timeout", "60", "--straggler-timeout", "90",
                   "--inject", "hang:rank=1,at=op5", "examples/train.py", "--steps", "50"],
                  log_dir)
    try:
        deadline = time.monotonic() + WAIT_S
        while True:  # until rank 1 hangs in the injection, its peers waiting for it
            shown = stacks(str(log_dir))
            if "rank 1: perform (rankguard/inject/perform.py:" in shown.stdout:
                break
            assert time.monotonic() < deadline, shown.stdout + shown.stderr
            time.sleep(0.5)
        assert shown.returncode == 0 and "now, 3 of 3 live rank(s) answered" in shown.stdout
        others = next(line for line in shown.stdout.splitlines() if "ranks 0,2 (2): " in line)
        assert "examples/train.py:" in others, shown.stdout
        assert proc.poll() is None  # the job goes on
        full = stacks("--full", str(log_dir / "journal.jsonl"))
        assert full.stdout.count("--- rank ") == 3 and "Current thread" in full.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        run = finish(proc, log_dir, 60, started)
    assert run.code == 143, run.stderr[-2000:]
    after = stacks(str(log_dir))
    assert "the run has ended; the last stacks its ranks wrote" in after.stdout, after.stdout
    assert "rank 1: perform" in after.stdout


def test_a_run_that_does_not_exist_or_a_bad_option_is_one_line_and_exit_2(
        tmp_path: Path) -> None:
    for args, what in ((["no-such-run-anywhere"], "RUN: no run's journal"),
                       (["--timeout", "soon", str(tmp_path)], "--timeout"),
                       ([str(tmp_path)], "RUN: no run's journal")):
        result = stacks(*args)
        assert result.returncode == 2 and result.stdout == "", result
        assert result.stderr.startswith(f"rankguard stacks: error: {what}"), result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
