"""The supervisor of rank processes on real (small) processes: an exit, a line of output, a
timer and a poke from another thread each wake the wait at once, without a tick; a kill ends
whole process trees and what left them carrying the set's marker; stacks come before a kill."""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest

from rankguard.processes import proctree
from rankguard.deadline import Deadline
from rankguard.processes.proctree import await_exits as wait_gone
from rankguard.supervisor import RankFiles, RankProcesses, spawn

LONG_S = 60.0  # every wait's bound: far longer than any of these events takes, even loaded


@pytest.fixture
def ranks(tmp_path: Path):
    made: list[RankProcesses] = []

    def make(world: int = 1, **kwargs) -> RankProcesses:
        made.append(RankProcesses(0, world, **kwargs))
        return made[-1]

    yield make
    for each in made:
        each.kill(Deadline.after(LONG_S))
        each.close(Deadline.after(LONG_S))


def files(tmp_path: Path, rank: int = 0) -> RankFiles:
    return RankFiles(str(tmp_path / f"rank{rank}.log"), str(tmp_path / f"rank{rank}.stacks"),
                     str(tmp_path / f"rank{rank}.ledger"))


def start(ranks: RankProcesses, tmp_path: Path, argv: list[str], rank: int = 0,
          pipes: bool = False):
    where = files(tmp_path, rank)
    return ranks.start(rank, where, {}, lambda env: spawn(
        argv, env, log=None if pipes else where.log))


def pump_until(ranks: RankProcesses, until: Deadline, done) -> None:
    while not done() and not until.passed():
        ranks.pump(until)


def test_an_exit_wakes_the_pump_and_is_reaped_with_its_code(ranks, tmp_path: Path) -> None:
    rs = ranks()
    member = start(rs, tmp_path, ["sh", "-c", "exit 3"])
    until = Deadline.after(LONG_S)
    exited = []
    while not exited and not until.passed():
        exited = rs.pump(until)
    assert exited == [member] and not until.passed()
    assert (member.returncode, member.ending(), rs.live()) == (3, "exited with code 3", [])
    assert Path(member.ledger_path).exists()  # made for the rank before it started


def test_output_through_pipes_reaches_the_log_and_the_tee_prefixed(ranks, tmp_path: Path
                                                                  ) -> None:
    teed: list[bytes] = []
    rs = ranks(tee=lambda rank: (teed.append, teed.append))
    member = start(rs, tmp_path, ["sh", "-c", "echo one; echo two >&2"], pipes=True)
    until = Deadline.after(LONG_S)
    rs.wait_exits(until)
    rs.drain_output(until)
    assert sorted(Path(member.log_path).read_text().split()) == ["one", "two"]
    assert sorted(b"".join(teed).split()) == [b"[rank0]:one", b"[rank0]:two"]


def test_a_poke_from_another_thread_and_a_timer_end_the_wait_at_once(ranks, tmp_path: Path
                                                                     ) -> None:
    rs = ranks()
    start(rs, tmp_path, ["sleep", "1000"])
    until = Deadline.after(LONG_S)
    threading.Timer(0.05, rs.wake).start()
    assert rs.pump(until) == [] and not until.passed()
    fired = threading.Event()
    rs.call_at(Deadline.after(0.05), fired.set)
    pump_until(rs, until, fired.is_set)
    assert fired.is_set() and not until.passed()


def test_a_watcher_thread_reports_exits_to_waiters_of_other_threads(ranks, tmp_path: Path
                                                                   ) -> None:
    rs = ranks(2)
    seen: list[int] = []
    for rank in range(2):
        start(rs, tmp_path, ["sh", "-c", f"exit {rank}"], rank)
    rs.watch(lambda member: seen.append(member.rank), "test-watcher")
    assert rs.wait_exits(Deadline.after(LONG_S))
    assert sorted(seen) == [0, 1]
    rs.close(Deadline.after(LONG_S))
    assert not Path(rs[0].ledger_path).exists()


def test_a_rank_replaced_many_times_leaves_the_set_holding_only_its_current_process(
        ranks, tmp_path: Path) -> None:
    """A pool heals a rank any number of times: the set must not keep what it replaced (the
    leader grew by one process record, its Popen and its condition per heal)."""
    rs = ranks()
    until = Deadline.after(LONG_S)
    member = start(rs, tmp_path, ["sh", "-c", "exit 1"])
    replaced: list[weakref.ref] = []
    for number in range(1, 4):
        pump_until(rs, until, lambda: not member.alive)
        old_ledger = member.ledger_path
        replaced.append(weakref.ref(member))
        where = RankFiles(member.log_path, member.stacks_path,
                          str(tmp_path / f"rank0.{number}.ledger"))
        member = rs.replace(0, where, {}, lambda env: spawn(["sh", "-c", "exit 1"], env,
                                                            log=where.log))
        assert not Path(old_ledger).exists()  # its process is gone: nothing writes it again
        assert Path(member.ledger_path).exists()
    gc.collect()
    assert [ref() for ref in replaced] == [None] * 3
    assert list(rs) == [member] and not until.passed()


def test_kill_ends_the_process_trees_and_what_left_them_with_the_marker(ranks, tmp_path: Path
                                                                       ) -> None:
    rs = ranks()
    pidfile = tmp_path / "orphan.pid"
    # a double-forked daemon in a session of its own: out of the rank's tree and process group
    member = start(rs, tmp_path, ["sh", "-c", f"(setsid sleep 1000 & echo $! > {pidfile}); "
                                  f"cat {pidfile}; exec sleep 1000"], pipes=True)
    until = Deadline.after(LONG_S)
    pump_until(rs, until, lambda: Path(member.log_path).read_text().strip())
    orphan = int(Path(member.log_path).read_text())
    assert proctree.alive(orphan) and orphan not in proctree.descendants(member.pid)
    assert rs.kill(until)
    assert member.killed and member.ending() == "was killed by SIGKILL"
    assert wait_gone([orphan], until) == []


@pytest.mark.parametrize("stopped", [False, True], ids=["running", "stopped"])
def test_stacks_are_asked_of_live_ranks_before_a_kill(ranks, tmp_path: Path,
                                                      stopped: bool) -> None:
    """A stopped rank (SIGSTOP) is continued to dump, then stopped again: it is about to be
    blamed as frozen, and must not go on with its work meanwhile."""
    rs = ranks()
    where = files(tmp_path)
    program = ("import faulthandler, signal, sys, time\n"
               f"faulthandler.register(signal.SIGUSR1, open({where.stacks!r}, 'a'), "
               "all_threads=True)\n"
               "def waiting_here():\n"
               "    print('ready', flush=True)\n"
               "    time.sleep(1000)\n"
               "waiting_here()\n")
    member = start(rs, tmp_path, [sys.executable, "-c", program], pipes=True)
    until = Deadline.after(LONG_S)
    pump_until(rs, until, lambda: "ready" in Path(member.log_path).read_text())
    if stopped:
        os.kill(member.pid, signal.SIGSTOP)
        while not proctree.is_stopped(member.pid):
            assert not until.passed(), "the rank was not stopped"
            time.sleep(0.01)
    dumps = rs.stacks(until)
    assert "waiting_here" in dumps[0], dumps
    assert "waiting_here" in Path(where.stacks).read_text()
    assert proctree.is_stopped(member.pid) == stopped


def test_wait_gone_returns_when_the_processes_end_or_names_those_left_at_the_deadline(
        tmp_path: Path) -> None:
    quick = spawn(["sh", "-c", "exit 0"], {}, log=str(tmp_path / "quick.log"))
    until = Deadline.after(LONG_S)
    assert wait_gone([quick.pid], until) == [] and not until.passed()
    quick.wait()
    slow = spawn(["sleep", "1000"], {}, log=str(tmp_path / "slow.log"))
    try:
        assert wait_gone([slow.pid], Deadline.after(0.05)) == [slow.pid]
    finally:
        slow.kill()
        slow.wait()
