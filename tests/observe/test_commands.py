"""``rankguard stacks`` and ``rankguard status`` against a real run whose rank 1 hangs: the
ranks grouped by where they are, each rank's state and the one the others wait for, the job
untouched; then, once it ended, the last stacks; and bad input."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankguard.processes import proctree
from rankguard.records import private_files

from ..conftest import ROOT, finish, launch

WAIT_S = 60.0


def command(name: str, *args: str, env_secret: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    """``rankguard NAME ARGS``, without the job's secret in its environment unless given."""
    env = {k: v for k, v in os.environ.items() if k != "RANKGUARD_SECRET"}
    if env_secret is not None:
        env["RANKGUARD_SECRET"] = env_secret
    return subprocess.run([sys.executable, "-m", "rankguard.cli", name, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=env)


def stacks(*args: str) -> subprocess.CompletedProcess[str]:
    return command("stacks", *args)


@contextlib.contextmanager
def job(args: list[str], log_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """``rankguard run ARGS`` while the block runs; then SIGTERM, and it must end with 143."""
    started = time.monotonic()
    proc = launch(args, log_dir)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        run = finish(proc, log_dir, 60, started)
    assert run.code == 143, run.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.deadline(180)
def test_stacks_and_status_of_a_hung_run_show_the_outlier_and_leave_it_running(
        tmp_path: Path) -> None:
    log_dir = tmp_path / "run"
    with job(["--nproc-per-node", "3", "--hang-timeout", "60", "--straggler-timeout", "90",
              "--inject", "hang:rank=1,at=op20", "examples/train.py", "--steps", "50"],
             log_dir) as proc:
        deadline = time.monotonic() + WAIT_S
        while True:  # until rank 1 hangs in the injection, its peers waiting for it (both:
            # a peer may still finish its step as rank 1 enters the injection)
            shown = stacks(str(log_dir))
            if "rank 1: perform (rankguard/inject/perform.py:" in shown.stdout and \
                    "ranks 0,2 (2): " in shown.stdout:
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
    after = stacks(str(log_dir))
    assert "the run has ended; the last stacks its ranks wrote" in after.stdout, after.stdout
    assert "rank 1: perform" in after.stdout
    ended = json.loads(command("status", "--json", str(log_dir)).stdout)
    assert ended["ended"] and {r["state"] for r in ended["ranks"]} == {"exited"}
    assert ended["last_fault"] == "the launcher received SIGTERM", ended


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_stacks_of_a_rank_stopped_by_someone_else_show_where_it_stopped_and_leave_it_stopped(
        tmp_path: Path) -> None:
    # the request continued a stopped rank (SIGCONT, so that it could dump) and left it
    # running: looking at a frozen rank thawed it, and its hang verdict never came
    log_dir = tmp_path / "run"
    with job(["--nproc-per-node", "1", "tests/scripts/sleeper.py", "120"], log_dir) as proc:
        deadline = time.monotonic() + WAIT_S
        while "now, 1 of 1 live rank(s) answered" not in (shown := stacks(str(log_dir))).stdout:
            assert proc.poll() is None and time.monotonic() < deadline, shown.stdout
            time.sleep(0.2)
        pid = json.loads(command("status", "--json", str(log_dir)).stdout)["ranks"][0]["pid"]
        os.kill(pid, signal.SIGSTOP)
        shown = stacks(str(log_dir))
        assert "now, 1 of 1 live rank(s) answered" in shown.stdout, shown.stdout
        assert "sleeper.py:" in shown.stdout, shown.stdout
        assert proctree.is_stopped(pid), "rankguard stacks continued the stopped rank"


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_status_says_when_the_launcher_is_stopped_and_what_that_means(tmp_path: Path) -> None:
    """A launcher stopped (Ctrl-Z in its terminal, SIGSTOP) watches nothing: its ranks look
    alive and well in the table, so status says it, with how to resume it, until it runs."""
    log_dir = tmp_path / "run"
    with job(["--nproc-per-node", "1", "tests/scripts/sleeper.py", "120"], log_dir) as proc:
        deadline = time.monotonic() + WAIT_S
        while (shown := command("status", "--json", str(log_dir))).returncode != 0 or \
                not json.loads(shown.stdout)["ranks"]:  # until the journal names its rank
            assert proc.poll() is None and time.monotonic() < deadline, shown.stderr
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            while not proctree.is_stopped(proc.pid):
                assert time.monotonic() < deadline
                time.sleep(0.05)
            table = command("status", str(log_dir)).stdout
            view = json.loads(command("status", "--json", str(log_dir)).stdout)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert f"its launcher (pid {proc.pid}) is stopped" in table, table
        assert f"kill -CONT {proc.pid}" in view["launcher"], view
        while proctree.is_stopped(proc.pid):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert json.loads(command("status", "--json", str(log_dir)).stdout)["launcher"] is None


@pytest.mark.parametrize("name, option", [("stacks", "--timeout"), ("status", "--interval")])
def test_a_run_that_does_not_exist_or_a_bad_option_is_one_line_and_exit_2(
        name: str, option: str, tmp_path: Path) -> None:
    base = private_files.user_dir("the runs' log folder")  # made if it is not there yet
    every_run = os.path.join(base, "..", os.path.basename(base))
    for args, what in ((["no-such-run-anywhere"], "RUN: no run's journal"),
                       ([option, "soon", str(tmp_path)], option),
                       ([str(tmp_path)], "RUN: no run's journal"),
                       ([""], "RUN: is empty"),
                       ([every_run], f"RUN: {every_run!r} is the folder of every run, not "
                        "one run")):
        result = command(name, *args)
        assert result.returncode == 2 and result.stdout == "", result
        assert result.stderr.startswith(f"rankguard {name}: error: {what}"), result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_status_on_one_node_shows_the_other_nodes_ranks_and_the_one_they_wait_for(
        tmp_path: Path) -> None:
    """Two agents of one job, sealed with a shared secret; rank 2 (node 1) hangs before its
    5th all_reduce. ``rankguard status`` on node 0, without the secret in its environment (it
    takes its agent's), shows ranks 2 and 3 from node 1's beats, rank 2 the one waited for; with
    a wrong secret it says the beats do not open."""
    from tests.launcher.test_multinode import _kill_all, _start_agents

    secret = "5e" * 32
    procs = _start_agents(tmp_path, ["--hang-timeout", "120", "--straggler-timeout", "150",
                                     "--inject", "hang:rank=2,at=op5"], steps=100000,
                          envs=[{"RANKGUARD_SECRET": secret}] * 2)
    node0 = str(procs[0][1])
    try:
        deadline = time.monotonic() + 90
        while True:
            shown = command("status", "--json", node0)
            view = json.loads(shown.stdout) if shown.returncode == 0 else {}
            rows = {row["rank"]: row for row in view.get("ranks", [])}
            # node 1's beats lag its ranks: rank 3 may still show its last beat (init)
            if rows.get(2, {}).get("waited_for") and rows.get(3, {}).get("op") == "all_reduce":
                break
            assert time.monotonic() < deadline, shown.stdout + shown.stderr
            time.sleep(0.5)
        assert sorted(rows) == [0, 1, 2, 3], rows
        assert rows[2]["node"] == rows[3]["node"] == "node 1 (127.0.0.1)", rows
        assert rows[0]["node"] == "" and rows[0]["pid"] > 0
        assert rows[3]["state"] == "waiting", rows
        assert "from their beats in the round's store at" in view["nodes"], view
        table = command("status", node0).stdout
        assert "node 1 (127.0.0.1)  <- the others wait for it" in table, table
        wrong = command("status", "--json", node0, env_secret="ab" * 32)
        wrong_view = json.loads(wrong.stdout)
        assert "do not carry this job's seal" in wrong_view["nodes"], wrong_view
        assert sorted(r["rank"] for r in wrong_view["ranks"]) == [0, 1]
    finally:
        _kill_all(procs)


@pytest.mark.parametrize("name, args", [("status", ["--json"]), ("status", ["--once"]),
                                        ("stacks", ["--full"])])
def test_output_to_a_closed_pipe_ends_quietly_with_141(tmp_path: Path, name: str,
                                                       args: list[str]) -> None:
    """``rankguard status | head -1``: the reader is gone; no traceback, SIGPIPE's code."""
    (tmp_path / "attempt0").mkdir()
    events = [{"event": "run_start", "ts": 1.0e9, "run_id": "piped"},
              {"event": "attempt_start", "ts": 1.0e9, "attempt": 0},
              *({"event": "rank_start", "ts": 1.0e9, "attempt": 0, "rank": r, "pid": 4_000_000}
                for r in range(2000)),
              {"event": "run_end", "ts": 1.0e9 + 1, "status": "ok", "exit_code": 0}]
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "attempt0" / "stacks_rank0.txt").write_text(
        "Current thread 0x1 (most recent call first):\n" + '  File "t.py", line 1 in f\n' * 9999)
    reader, writer = os.pipe()
    os.close(reader)
    try:
        ended = subprocess.run([sys.executable, "-m", "rankguard.cli", name, *args,
                                str(tmp_path)], cwd=ROOT, stdout=writer,
                               stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(writer)
    assert ended.returncode == 141 and ended.stderr == "", ended


def test_stacks_of_a_run_that_started_no_attempt_says_so(tmp_path: Path) -> None:
    """A launcher killed before its first attempt: its journal names no attempt ("attempt
    None" before)."""
    events = [{"event": "run_start", "ts": 1.0e9, "run_id": "early"}]
    (tmp_path / "journal.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    result = command("stacks", str(tmp_path))
    assert result.returncode == 1, result
    assert result.stdout.startswith("run early, no attempt started: "), result.stdout
