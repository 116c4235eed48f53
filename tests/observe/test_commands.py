"""``rankguard stacks`` and ``rankguard status`` against a real run whose rank 1 hangs: the
ranks grouped by where they are, each rank's state and the one the others wait for, the job
untouched; then, once it ended, the last stacks; and bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import ROOT, finish, launch

WAIT_S = 60.0


def command(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rankguard.cli", name, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def stacks(*args: str) -> subprocess.CompletedProcess[str]:
    return command("stacks", *args)


@pytest.mark.slow
@pytest.mark.deadline(180)
def test_stacks_and_status_of_a_hung_run_show_the_outlier_and_leave_it_running(
        tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    started = time.monotonic()
    proc = launch(["--nproc-per-node", "3", "--hang-timeout", "60", "--straggler-timeout", "90",
                   "--inject", "hang:rank=1,at=op20", "examples/train.py", "--steps", "50"],
                  log_dir)
    try:
        deadline = time.monotonic() + WAIT_S
        while True:  # until rank 1 hangs in the injection, its peers waiting for it
            shown = stacks(str(log_dir))
            if "rank 1: perform (rankguard/inject/perform.py:" in shown.stdout:
                break
            assert proc.poll() is None, proc.communicate(timeout=10)[1][-3000:]
            assert time.monotonic() < deadline, shown.stdout + shown.stderr
            time.sleep(0.5)
        assert shown.returncode == 0 and "now, 3 of 3 live rank(s) answered" in shown.stdout
        others = next(line for line in shown.stdout.splitlines() if "ranks 0,2 (2): " in line)
        assert "examples/train.py:" in others, shown.stdout
        assert proc.poll() is None  # the job goes on
        full = stacks("--full", str(log_dir / "journal.jsonl"))
        assert full.stdout.count("--- rank ") == 3 and "Current thread" in full.stdout
        table = command("status", str(log_dir)).stdout  # not a terminal: one snapshot
        rows = {int(line.split()[0]): line for line in table.splitlines()[2:]}
        assert "the others wait for it" in rows[1], table
        for rank in (0, 2):
            assert "waiting in all_reduce #" in rows[rank] and "(world)" in rows[rank], table
        view = json.loads(command("status", "--json", str(log_dir)).stdout)
        assert [r["waited_for"] for r in view["ranks"]] == [False, True, False]
        # rank 1 is behind: it computes after #N-1, or (DDP's bucket all_reduce is async, its
        # completion recorded by another thread) still counts as in it
        seqs = [r["seq"] for r in view["ranks"]]
        assert seqs[0] == seqs[2] == seqs[1] + 1 and not view["ended"], view
    finally:
        proc.send_signal(signal.SIGTERM)
        run = finish(proc, log_dir, 60, started)
    assert run.code == 143, run.stderr[-2000:]
    after = stacks(str(log_dir))
    assert "the run has ended; the last stacks its ranks wrote" in after.stdout, after.stdout
    assert "rank 1: perform" in after.stdout
    ended = json.loads(command("status", "--json", str(log_dir)).stdout)
    assert ended["ended"] and {r["state"] for r in ended["ranks"]} == {"exited"}
    assert ended["last_fault"] == "the launcher received SIGTERM", ended


@pytest.mark.parametrize("name, option", [("stacks", "--timeout"), ("status", "--interval")])
def test_a_run_that_does_not_exist_or_a_bad_option_is_one_line_and_exit_2(
        name: str, option: str, tmp_path: Path) -> None:
    for args, what in ((["no-such-run-anywhere"], "RUN: no run's journal"),
                       ([option, "soon", str(tmp_path)], option),
                       ([str(tmp_path)], "RUN: no run's journal")):
        result = command(name, *args)
        assert result.returncode == 2 and result.stdout == "", result
        assert result.stderr.startswith(f"rankguard {name}: error: {what}"), result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
