"""The zygote (``supervisor.zygote``): ranks forked from a process that imported their modules
once, with their own session, environment, log and descriptors, and their exit codes; and a
pool whose zygote is killed or frozen, which goes on serving."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rankguard
from rankguard.processes import proctree
from rankguard.deadline import Deadline
from rankguard.supervisor.zygote import LOST_CODE, Zygote, ZygoteUnavailable

from . import rank_functions as rf
from .test_pool import SPARE_WAIT_S, events, wait_for

CHILD = "tests.serving.zygote_child"


def _fork(zygote: Zygote, tmp_path: Path, end: str) -> tuple[object, socket.socket]:
    ours, theirs = socket.socketpair()
    with theirs:
        child = zygote.fork(CHILD, {**os.environ, "ZYGOTE_TEST_END": end}, str(tmp_path / "log"),
                            {"ZYGOTE_TEST_FD": theirs.fileno()}, Deadline.after(10))
    ours.settimeout(10)
    return child, ours


@pytest.mark.deadline(60)
def test_forks_get_their_environment_session_log_descriptors_and_exit_codes(
        tmp_path: Path) -> None:
    zygote = Zygote([CHILD], dict(os.environ), str(tmp_path / "zygote.log"))
    try:
        assert zygote.wait_ready(Deadline.after(30))
        for end, code in (("exit:3", 3), ("exit:0", 0), (f"signal:{signal.SIGTERM}",
                                                           -signal.SIGTERM)):
            child, channel = _fork(zygote, tmp_path, end)
            with channel:
                assert channel.makefile().readline() == f"{child.pid}\n"  # the fd it was given
            assert child.wait(10) == code and child.poll() == code
        child, channel = _fork(zygote, tmp_path, "wait")
        assert channel.makefile().readline() == f"{child.pid}\n"  # it runs main()
        assert child.poll() is None and os.getsid(child.pid) == child.pid
        assert proctree.alive(child.pid)
        zygote.proc.kill()  # its ranks die with it, and count as killed
        assert child.wait(10) == LOST_CODE
        wait_for(lambda: not proctree.alive(child.pid), 10, "the fork to die with its zygote")
        channel.close()
        with pytest.raises(ZygoteUnavailable):
            _fork(zygote, tmp_path, "exit:0")
    finally:
        zygote.close(Deadline.after(5))
    log = (tmp_path / "log").read_text()
    assert log.count(f"of {zygote.proc.pid}, session") == 4, log
    assert "zygote_child.py']" in log  # argv as with python -m


@pytest.mark.slow  # out of the quick run (its 5 minutes)
@pytest.mark.deadline(120)
def test_ranks_are_forked_from_the_zygote_unless_it_is_off(tmp_path: Path) -> None:
    log = tmp_path / "journal.jsonl"
    with rankguard.Pool(1, spares=0, journal=str(log)) as pool:
        rank = pool.run(rf.pid)
        zygote = events(log, "zygote_start")[0]["pid"]
        assert proctree_parent(rank) == zygote
    with rankguard.Pool(1, spares=0, zygote=False, journal=str(tmp_path / "cold.jsonl")) as pool:
        assert proctree_parent(pool.run(rf.pid)) == os.getpid()
    assert not events(tmp_path / "cold.jsonl", "zygote_start")


def proctree_parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow
@pytest.mark.deadline(180)
@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_pool_whose_zygote_is_killed_or_frozen_goes_on_serving(fault: str,
                                                                 tmp_path: Path) -> None:
    log = tmp_path / "journal.jsonl"
    with rankguard.Pool(2, rf.load, replicas=1, spares=1, timeout=2.0,
                        journal=str(log)) as pool:
        wait_for(lambda: pool.status().spares_ready == 1, SPARE_WAIT_S, "a spare")
        zygote = events(log, "zygote_start")[0]["pid"]
        os.kill(zygote, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        try:
            if fault == "stop":  # its forks still run: a fault makes the pool fork again
                started = time.monotonic()
                with pytest.raises(rankguard.RequestFailed) as caught:
                    pool.run(rf.forward, 1.0, fault=(1, "kill"))
                # the rank's end is known from its zombie, not from the frozen zygote
                assert (caught.value.rank, caught.value.cause) == (1, "signalled")
                assert time.monotonic() - started < 1.0
                for _ in range(20):  # while the supervisor waits for the frozen zygote to fork
                    asked = time.monotonic()
                    pool.status()
                    assert time.monotonic() - asked < 0.5, "status() waited for a fork"
                    time.sleep(0.05)
            started = time.monotonic()
            wait_for(lambda: len(events(log, "zygote_start")) == 2, SPARE_WAIT_S,
                     "a new zygote")
            wait_for(lambda: pool.status().spares_ready == 1, SPARE_WAIT_S, "a spare again")
            assert pool.run(rf.forward, 2.0) == rf.expected(2.0, 2)
            took = time.monotonic() - started
        finally:
            if fault == "stop" and proctree.alive(zygote):
                os.kill(zygote, signal.SIGCONT)
    failed = events(log, "zygote_failed")
    assert len(failed) == 1 and failed[0]["pid"] == zygote, failed
    assert len(events(log, "zygote_start")) == 2  # a new zygote, not cold starts
    assert took < SPARE_WAIT_S


@pytest.mark.slow
@pytest.mark.deadline(120)
@pytest.mark.parametrize("zygote", [True, False])
def test_processes_a_rank_forked_do_not_outlive_the_pool(zygote: bool) -> None:
    with rankguard.Pool(1, spares=0, zygote=zygote) as pool:
        child = pool.run(rf.fork_sleeper)  # a child by os.fork: no exec, no environ of its own
        assert proctree.alive(child)
    wait_for(lambda: not proctree.alive(child), 10, f"the rank's forked child {child} to end")


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_pool_short_of_file_descriptors_retries_and_heals_once_it_has_them() -> None:
    script = Path(__file__).with_name("fd_starved_pool.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=100, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "healed" in done.stdout and "Traceback" not in done.stderr, done.stdout + done.stderr
    # "Too many open files", or the store's own words for it ("Failed to init uv loop")
    assert "group_start_failed could not be started: " in done.stdout, done.stdout
