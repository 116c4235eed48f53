"""Signals to the launcher itself: the same bounded teardown, and nothing outlives it."""

import os
import signal
import time

import pytest

from tests.conftest import TEST_ID_VAR, finish, launch, script, wait_until_gone
from tests.launcher.budgets import CLEAN_TEARDOWN_GRACE_S, guardian_sweep_s, stopped_within_s


def _wait_for_ranks(log_dir, n, timeout=30.0):
    """Until every rank printed its first line (the script is running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = [log_dir / "attempt0" / f"rank{r}.log" for r in range(n)]
        if all(p.exists() and p.read_text() for p in logs):
            return
        time.sleep(0.05)
    pytest.fail("ranks did not start")


@pytest.mark.parametrize("args, sig, code", [
    ([], signal.SIGTERM, 143), ([], signal.SIGINT, 130),
    ([], signal.SIGHUP, 129),  # torchrun's default --signals-to-handle has SIGHUP and SIGQUIT
    (["--signals-to-handle", "SIGTERM,SIGUSR1"], signal.SIGUSR1, 138),  # SLURM's warning
])
def test_signal_to_launcher_stops_every_rank_within_grace(tmp_path, args, sig, code):
    log_dir = tmp_path / "logs"
    grace = CLEAN_TEARDOWN_GRACE_S
    proc = launch([*args, "--nproc-per-node", "2", "--grace", str(grace),
                   script("sleeper.py")], log_dir)
    started = time.monotonic()
    _wait_for_ranks(log_dir, 2)
    sent = time.monotonic()
    os.kill(proc.pid, sig)
    run = finish(proc, log_dir, 30, started)
    assert run.code == code, run.stderr
    assert time.monotonic() - sent < stopped_within_s(grace)
    assert run.outcomes() == {0: "victim", 1: "victim"}, run.stderr
    assert run.event("run_end")["root_cause"] == f"the launcher received {sig.name}"


def test_a_launcher_started_under_nohup_outlives_a_hangup(tmp_path):
    log_dir = tmp_path / "logs"
    proc = launch(["--nproc-per-node", "1", "--grace", "2", script("sleeper.py")], log_dir,
                  wrap=["nohup"])
    started = time.monotonic()
    _wait_for_ranks(log_dir, 1)
    os.kill(proc.pid, signal.SIGHUP)
    time.sleep(1.0)  # a handled SIGHUP ends the run within this (seen in the case above)
    assert proc.poll() is None, "the hangup ended a run started under nohup"
    os.kill(proc.pid, signal.SIGTERM)
    run = finish(proc, log_dir, 30, started)
    assert run.code == 143, run.stderr


def test_sigkill_to_launcher_leaves_no_rank_or_grandchild(tmp_path):
    log_dir = tmp_path / "logs"
    proc = launch(["--nproc-per-node", "2", script("ignore_term.py")], log_dir,
                  env={"RANK_NEVER_CRASH": "1"})
    _wait_for_ranks(log_dir, 2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    left = wait_until_gone(os.environ[TEST_ID_VAR], guardian_sweep_s())
    assert left == [], "job processes outlived a SIGKILLed launcher"


def test_internal_error_stops_every_rank_and_exits_4(tmp_path):
    log_dir = tmp_path / "logs"
    proc = launch(["--nproc-per-node", "2", "--max-restarts", "1", "--no-spares",
                   script("break_log_dir.py"), str(log_dir)], log_dir)
    run = finish(proc, log_dir, 60, time.monotonic())
    assert run.code == 4, run.stderr[-2000:]
    assert "rankguard: internal error: NotADirectoryError" in run.stderr
    assert "attempt1" in run.stderr and "every rank was stopped" in run.stderr
    assert "Traceback: above" in run.stderr  # the log dir is broken: kept on stderr
    # ranks of both attempts are gone: the autouse fixture fails the test otherwise
