"""The terminal is best effort: a reader that stalls or leaves never stalls or breaks the job.

The launcher's stdout or stderr here is a pipe whose reader does not read (stalled) or has
closed its end (like ``| head -c 300``); the job must run exactly as with a live reader, and
the rank logs keep every byte.
"""

from __future__ import annotations

import collections
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rankguard.processes import proctree
from rankguard.deadline import Deadline
from rankguard.launcher.terminal import LIMIT, Output
from tests.conftest import Run, launch, script
from tests.launcher.budgets import hang_waited_s

CHATTY = script("chatty.py")


def _wait(proc: subprocess.Popen[str], log_dir: Path, timeout: float,
          err_file: Path | None = None) -> Run:
    """Wait for the launcher without reading its pipes; kill its tree and fail past ``timeout``."""
    started = time.monotonic()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proctree.signal_tree(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        pytest.fail(f"rankguard run did not finish within {timeout} s")
    finally:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    stderr = err_file.read_text() if err_file is not None else ""
    return Run(proc.returncode, "", stderr, time.monotonic() - started, log_dir)


def _assert_logs_complete(log_dir: Path, ranks: int, steps: int) -> None:
    for rank in range(ranks):
        log = (log_dir / "attempt0" / f"rank{rank}.log").read_text()
        assert f"step {steps - 1} " in log and f"DONE rank={rank}" in log


@pytest.mark.slow  # 5 to 11 s: the quick set stays within 5 minutes
def test_healthy_job_with_a_reader_that_never_reads_ends_0_without_a_verdict(tmp_path):
    # 2 ranks x 1000 lines of 1 kB: more than a pipe and the launcher's buffer hold, for
    # several --hang-timeout
    log_dir, err = tmp_path / "logs", tmp_path / "stderr.txt"
    with open(err, "w") as err_file:
        proc = launch(["--nproc-per-node", "2", "--hang-timeout", "1", CHATTY, "1000", "1000",
                       "0.002"], log_dir, stderr=err_file)
        run = _wait(proc, log_dir, 60, err)
    assert run.code == 0, run.stderr[-3000:]
    assert not [e for e in run.events if e["event"] == "hang_detected"]
    _assert_logs_complete(log_dir, 2, 1000)
    dropped = run.event("run_end")["dropped_output"]
    assert dropped["stdout"] > 0 and dropped["stderr"] == 0
    assert f"dropped {dropped['stdout']} bytes of stdout (its reader fell behind)" in run.stderr


@pytest.mark.slow  # the quick run proves a stalled reader costs nothing with the healthy job
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_hang_is_reported_on_time_while_the_reader_never_reads(tmp_path, stream):
    log_dir, out = tmp_path / "logs", tmp_path / "other.txt"
    hang_s = 2.0
    args = ["--nproc-per-node", "2", "--hang-timeout", str(hang_s), "--inject",
            "hang:rank=1,at=op100", CHATTY, "3000", "1000", "0.005",
            *(["err"] if stream == "stderr" else [])]
    with open(out, "w") as other:
        if stream == "stdout":
            proc = launch(args, log_dir, stderr=other)
        else:
            proc = launch(args, log_dir, stdout=other)
        run = _wait(proc, log_dir, 60, out if stream == "stdout" else None)
    assert run.code == 3, run.stderr[-3000:]
    hang = run.event("hang_detected")
    assert hang["blamed"] == [1] and (hang["op"], hang["seq"]) == ("all_reduce", 100)
    assert hang_s <= hang["waited_s"] < hang_waited_s(hang_s)
    assert run.event("run_end")["dropped_output"][stream] > 0


@pytest.mark.slow  # moved out of the README's 5-minute run; the closed-stderr case stays
def test_reader_that_closes_the_pipe_early_leaves_the_job_running_to_success(tmp_path):
    # like `rankguard run ... | head -c 300`
    log_dir, err = tmp_path / "logs", tmp_path / "stderr.txt"
    with open(err, "w") as err_file:
        proc = launch(["--nproc-per-node", "2", CHATTY, "200", "1000", "0.005"], log_dir,
                      stderr=err_file)
        assert proc.stdout is not None
        head = b""
        deadline = time.monotonic() + 60
        while len(head) < 300 and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 1.0)[0]:
                chunk = os.read(proc.stdout.fileno(), 300 - len(head))
                if not chunk:
                    break
                head += chunk
        proc.stdout.close()
        run = _wait(proc, log_dir, 60, err)
    assert len(head) == 300 and head.startswith(b"[rank")
    assert run.code == 0, run.stderr[-3000:]
    assert "internal error" not in run.stderr
    _assert_logs_complete(log_dir, 2, 200)
    assert run.outcomes() == {0: "ok", 1: "ok"}
    dropped = run.event("run_end")["dropped_output"]["stdout"]
    assert dropped > 0
    assert f"dropped {dropped} bytes of stdout (its reader closed it)" in run.stderr


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_launcher_messages_to_a_closed_stderr_neither_crash_nor_change_the_outcome(tmp_path):
    log_dir = tmp_path / "logs"
    proc = launch(["--nproc-per-node", "2", "--inject", "crash:3:rank=1,at=op5",
                   script("allreduce.py"), "400", "0.01"], log_dir, stdout=subprocess.DEVNULL)
    assert proc.stderr is not None
    proc.stderr.close()  # before the launcher writes a word
    run = _wait(proc, log_dir, 60)
    assert run.code == 1
    assert run.outcomes() == {0: "victim", 1: "exited"}
    end = run.event("run_end")
    assert end["root_cause"] == "rank 1 exited with code 3"
    assert end["dropped_output"]["stderr"] > 0


def test_output_to_a_file_keeps_every_byte_however_fast_it_comes(tmp_path):
    # a file has no reader to fall behind: a buffer only dropped what the writer thread lagged
    path, line, lines = tmp_path / "out.txt", b"y" * 999 + b"\n", 64 * LIMIT // 1000
    with open(path, "wb") as file:
        output = Output(file.fileno(), "stdout")
        for _ in range(lines):  # as fast as a loop appends: 64 times the buffer
            output.write(line)
        assert output.flush(Deadline.after(60))
    assert (output.dropped, output.undelivered) == (0, 0)
    assert path.stat().st_size == lines * len(line)


@pytest.mark.slow
def test_a_flood_of_rank_output_redirected_to_a_file_is_all_there(tmp_path):
    # `rankguard run ... > out.txt`: 2 ranks x 100 MB, as fast as they can print
    log_dir, out, err = tmp_path / "logs", tmp_path / "out.txt", tmp_path / "err.txt"
    megabytes = 100
    with open(out, "w") as out_file, open(err, "w") as err_file:
        proc = launch(["--nproc-per-node", "2", script("flood.py"), str(megabytes)], log_dir,
                      stdout=out_file, stderr=err_file)
        run = _wait(proc, log_dir, 120, err)
    assert run.code == 0, run.stderr[-3000:]
    assert run.event("run_end")["dropped_output"] == {"stdout": 0, "stderr": 0}
    assert "dropped" not in run.stderr
    with open(out, "rb") as text:
        counts = collections.Counter(line.partition(b":")[0] for line in text)
    assert counts == {b"[rank0]": megabytes * 1000 + 1, b"[rank1]": megabytes * 1000 + 1}


def _cpu_seconds(args: list[str], log_dir: Path, timeout: float) -> float:
    """CPU time of a whole run (launcher and ranks), which the load of the machine hardly
    changes, unlike its wall time."""
    proc = launch(args, log_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            assert os.waitstatus_to_exitcode(status) == 0
            proc.returncode = 0
            return usage.ru_utime + usage.ru_stime
        time.sleep(0.05)
    proctree.signal_tree(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    pytest.fail(f"rankguard run did not finish within {timeout} s")


@pytest.mark.slow
def test_output_without_newlines_costs_time_linear_in_its_size(tmp_path):
    # 80 MiB of progress-bar updates ending in \r, never \n: copying the whole unfinished line
    # again on every read would be quadratic (11 s of CPU for 40 MiB, four times that for 80);
    # linear, it costs about 1.5 s.
    base = _cpu_seconds(["--nproc-per-node", "1", script("progress_bar.py"), "0"],
                        tmp_path / "base", 60)
    big = _cpu_seconds(["--nproc-per-node", "1", script("progress_bar.py"), "80"],
                       tmp_path / "big", 90)
    assert big - base < 10.0, (base, big)
    log = (tmp_path / "big" / "attempt0" / "rank0.log").read_bytes()
    block = 64_000
    assert len(log) == (80 << 20) // block * block + len(b"END\n")
    assert log.endswith(b"\r" + b"#" * 99 + b"\rEND\n")
