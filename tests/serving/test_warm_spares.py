"""Warm ranks (``serving.warm_spares``, ``serving.warm_worker``): real processes that imported
torch ahead, each becoming a rank of a real replica (gloo on the CPU) when handed its
environment and channel; none given out before it is ready or for another device; closed, or
dying with their leader, they leave nothing behind. The GPU case is tests/gpu/test_warm_rank_gpu.py."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rankguard.deadline import Deadline
from rankguard.errors import UsageError
from rankguard.processes import proctree
from rankguard.serving.replica import Replica, StartState
from rankguard.serving.warm_spares import WARM_TRIES, WarmCount, WarmSpares, WarmStart
from rankguard.serving.warm_worker import WarmPart
from tests.conftest import ROOT

from . import rank_functions as rf
from .test_pool import wait_for
from .test_zygote import proctree_parent

READY_S = 60.0  # a warm rank's start: python and import torch, on two busy cores


class Warm:
    """A :class:`WarmSpares` whose changes wake :meth:`wait`."""

    def __init__(self, folder: Path, start_timeout: float = READY_S) -> None:
        self.changed = threading.Condition()
        self.ranks = WarmSpares({}, str(folder), start_timeout, self._change)

    def _change(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def wait(self, done: Callable[[WarmCount], bool], what: str, device: str = "cpu"
             ) -> WarmCount:
        """Wait (``READY_S`` at most) until ``done(device's counts)``."""
        limit = Deadline.after(READY_S)
        with self.changed:
            ok = self.changed.wait_for(lambda: done(self.count(device)), limit.wait_time())
        assert ok, f"timed out waiting for {what}: {self.count(device)}"
        return self.count(device)

    def count(self, device: str = "cpu") -> WarmCount:
        return self.ranks.counts().get(device, WarmCount())


@pytest.fixture
def warm(tmp_path: Path) -> Iterator[Warm]:
    made = Warm(tmp_path / "warm")
    try:
        yield made
    finally:
        made.ranks.close(Deadline.after(10.0))


def _run(replica: Replica, fn: Callable[..., Any], *args: Any, all_ranks: bool = False
         ) -> dict[int, Any]:
    return replica.run({"fn": fn, "args": args, "kwargs": {}, "all": all_ranks},
                       time.monotonic(), Deadline.after(30.0))


@pytest.mark.slow
@pytest.mark.deadline(180)
def test_warm_ranks_become_the_ranks_of_a_replica_that_serves(warm: Warm, tmp_path: Path
                                                             ) -> None:
    assert warm.ranks.fill("cpu", 2) == 2
    assert warm.ranks.fill("cpu", 2) == 0  # two are there already, warming
    warm.wait(lambda c: c.ready == 2, "two warm ranks")
    starts = [warm.ranks.take("cpu"), warm.ranks.take("cpu")]
    assert all(isinstance(s, WarmStart) for s in starts) and warm.ranks.take("cpu") is None
    pids = [s.pid for s in starts if s is not None]
    for start in starts:
        assert start is not None and start.parts[WarmPart.IMPORT_TORCH] > 0
        assert set(start.parts) == {WarmPart.IMPORT_TORCH, WarmPart.IMPORT_DISTRIBUTED}

    def start_rank(env: dict[str, str], log: str, channel_fd: int) -> Any:
        start = starts[int(env["RANK"])]
        assert start is not None
        return start(env, log, channel_fd)

    replica = Replica(0, 2, rf.load, str(tmp_path / "replica"), {}, Deadline.after(READY_S),
                      start_rank=start_rank)
    try:
        assert replica.wait_started(Deadline.after(READY_S)) == StartState.READY, \
            replica.failure
        assert replica.pids == pids and [proctree_parent(p) for p in pids] == [os.getpid()] * 2
        assert _run(replica, rf.forward, 2.0)[0] == rf.expected(2.0, 2)
        assert _run(replica, rf.pid, all_ranks=True) == {0: pids[0], 1: pids[1]}
        # its environment is the rank's: the replica's store, an instrumented group
        assert _run(replica, rf.master_port, all_ranks=True) == \
            {r: replica._store.port for r in (0, 1)}
        assert _run(replica, rf.bounded_group, all_ranks=True) == {0: True, 1: True}
        assert warm.count() == WarmCount(warmup_s=warm.count().warmup_s)  # none left
        child = _run(replica, rf.fork_sleeper)[0]  # no exec: the warm rank's /proc environ
    finally:
        replica.close(Deadline.after(10.0))
    assert [s.fallback for s in starts if s is not None] == ["", ""]
    assert [replica.ending(r) for r in (0, 1)] == ["exited with code 0"] * 2  # its own status
    assert "rank0.log" in os.listdir(tmp_path / "replica")
    warm.ranks.close(Deadline.after(10.0))
    wait_for(lambda: not proctree.alive(child), 10, f"the rank's forked child {child} to end")


def _ready_one(warm: Warm) -> WarmStart:
    warm.ranks.fill("cpu", 1)
    warm.wait(lambda c: c.ready == 1, "a warm rank")
    start = warm.ranks.take("cpu")
    assert start is not None
    return start


def _replica_of_one(folder: Path, start: WarmStart) -> Replica:
    replica = Replica(0, 1, None, str(folder), {}, Deadline.after(READY_S), start_rank=start)
    assert replica.wait_started(Deadline.after(READY_S)) == StartState.READY, replica.failure
    return replica


@pytest.mark.deadline(120)
def test_a_warm_rank_works_in_the_folder_the_leader_is_in_when_it_hands_it_over(
        warm: Warm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "then").mkdir()
    (tmp_path / "now").mkdir()
    monkeypatch.chdir(tmp_path / "then")
    start = _ready_one(warm)
    monkeypatch.chdir(tmp_path / "now")
    replica = _replica_of_one(tmp_path / "replica", start)
    try:
        assert _run(replica, rf.cwd)[0] == str(tmp_path / "now")  # as a rank started now
    finally:
        replica.close(Deadline.after(10.0))


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.deadline(120)
def test_a_warm_rank_that_died_before_the_hand_over_leaves_its_rank_to_a_cold_start(
        warm: Warm, tmp_path: Path) -> None:
    start = _ready_one(warm)
    os.kill(start.pid, signal.SIGKILL)
    wait_for(lambda: not proctree.alive(start.pid), 10, "the warm rank to die")
    replica = _replica_of_one(tmp_path / "replica", start)
    try:
        assert replica.pids[0] != start.pid and _run(replica, rf.pid)[0] == replica.pids[0]
        assert start.fallback.startswith(f"the warm rank (pid {start.pid}) could not take it")
    finally:
        replica.close(Deadline.after(10.0))
    assert warm.count().ready == 0 and warm.ranks.pids() == []


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.deadline(120)
def test_a_ready_warm_rank_that_dies_idle_is_replaced_and_counted(warm: Warm) -> None:
    warm.ranks.fill("cpu", 1)
    warm.wait(lambda c: c.ready == 1, "a warm rank")
    [pid] = warm.ranks.pids()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not proctree.alive(pid), 10, "the warm rank to die")
    assert warm.ranks.fill("cpu", 1) == 1
    count = warm.count()
    assert (count.ready, count.warming, count.failed) == (0, 1, 1)
    assert count.failure.startswith(f"warm rank {pid} on cpu exited while it waited to be "
                                    "needed (was killed by SIGKILL)")
    warm.wait(lambda c: c.ready == 1, "its replacement")
    assert warm.count().failed == 0 and warm.ranks.pids() != [pid]


@pytest.mark.deadline(120)
def test_nothing_is_taken_before_it_is_ready_nor_for_another_device(warm: Warm) -> None:
    assert warm.ranks.fill("cpu", 1) == 1
    assert warm.ranks.take("cpu") is None  # python and torch take seconds to start
    assert warm.count().warming == 1 and warm.count().ready == 0
    warm.wait(lambda c: c.ready == 1, "a warm rank")
    assert warm.ranks.take("cuda:0") is None
    start = warm.ranks.take("cpu")
    assert start is not None and proctree.alive(start.pid)
    assert warm.ranks.take("cpu") is None  # taken once
    warm.ranks.close(Deadline.after(10.0))  # a warm rank taken but not called ends too
    assert not proctree.alive(start.pid)


@pytest.mark.deadline(120)
def test_close_ends_idle_and_warming_ranks_and_is_idempotent(warm: Warm) -> None:
    warm.ranks.fill("cpu", 1)
    warm.wait(lambda c: c.ready == 1, "a warm rank")
    warm.ranks.fill("cpu", 2)  # one more, still warming at close
    procs = [w.proc for slot in warm.ranks._devices.values() for w in slot.warm]
    warm.ranks.close(Deadline.after(10.0))
    assert sorted(p.returncode for p in procs) == [-signal.SIGKILL, 0]  # ready: exits 0
    assert not any(proctree.alive(p.pid) for p in procs)
    warm.ranks.close(Deadline.after(10.0))
    assert warm.ranks.fill("cpu", 1) == 0 and warm.ranks.take("cpu") is None


@pytest.mark.deadline(120)
def test_a_warm_rank_dies_with_its_leader(tmp_path: Path) -> None:
    leader = subprocess.Popen([sys.executable, "-m", "tests.serving.warm_leader",
                               str(tmp_path)], cwd=str(ROOT), stdout=subprocess.PIPE,
                              start_new_session=True)
    try:
        assert leader.stdout is not None
        ready, _, _ = select.select([leader.stdout], [], [], READY_S + 10)
        line = leader.stdout.readline().decode().strip() if ready else ""
        assert line.isdigit(), f"the leader's warm rank was not ready: {line!r}"
        pid = int(line)
        assert proctree.alive(pid) and proctree_parent(pid) == leader.pid
        leader.kill()
        wait_for(lambda: not proctree.alive(pid), 10, "the warm rank to die with its leader")
    finally:
        proctree.signal_tree(leader.pid, signal.SIGKILL)
        leader.wait(10)


@pytest.mark.deadline(120)
def test_a_warm_up_that_fails_or_is_late_counts_as_failed_and_leaves_nothing(
        tmp_path: Path) -> None:
    late = Warm(tmp_path / "late", start_timeout=0.05)
    try:
        late.ranks.fill("cpu", 1)
        [pid] = late.ranks.pids()
        count = late.wait(lambda c: c.failed == 1, "the late warm rank to fail")
        assert (count.ready, count.warming) == (0, 0) and late.ranks.pids() == []
        assert f"warm rank {pid} on cpu was not ready within 0.05 s" in count.failure
        assert not proctree.alive(pid)
    finally:
        late.ranks.close(Deadline.after(10.0))
    broken = Warm(tmp_path / "broken")
    try:
        broken.ranks.fill("cuda:99", 1)  # no such device, on a GPU machine or not
        count = broken.wait(lambda c: c.failed == 1, "the warm-up to fail", "cuda:99")
        assert "failed its warm-up" in count.failure and "Traceback" in count.failure
        assert broken.ranks.take("cuda:99") is None
    finally:
        broken.ranks.close(Deadline.after(10.0))


@pytest.mark.deadline(60)
def test_after_failures_in_a_row_no_more_start_on_that_device(tmp_path: Path) -> None:
    late = Warm(tmp_path, start_timeout=0.05)
    try:
        for failed in range(1, WARM_TRIES + 1):
            assert late.ranks.fill("cpu", 1) == 1
            late.wait(lambda c: c.failed == failed, f"failure {failed}")
        assert late.ranks.fill("cpu", 1) == 0  # its ranks start cold from now on
        assert late.count().failed == WARM_TRIES
    finally:
        late.ranks.close(Deadline.after(10.0))


@pytest.mark.parametrize("device, count, wrong", [
    ("cpu", -1, "WarmSpares.fill(count): expected a whole number >= 0, got -1"),
    ("cpu", 1.5, "WarmSpares.fill(count): expected a whole number >= 0, got 1.5"),
    ("gpu", 1, "WarmSpares(device): 'gpu' is not a device"),
    ("cuda", 1, "WarmSpares(device): 'cuda' is not a device"),
    ("cuda:-1", 1, "WarmSpares(device): 'cuda:-1' is not a device"),
    ("cuda:01", 1, "WarmSpares(device): 'cuda:01' is not a device"),
])
def test_a_bad_device_or_count_is_refused_naming_it(tmp_path: Path, device: str, count: Any,
                                                    wrong: str) -> None:
    warm = WarmSpares({}, str(tmp_path), READY_S)
    with pytest.raises(UsageError) as caught:
        warm.fill(device, count)
    assert str(caught.value).startswith(wrong)
    assert not os.listdir(tmp_path)  # nothing started


def test_a_bad_start_timeout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"WarmSpares\(start_timeout\)"):
        WarmSpares({}, str(tmp_path), -1.0)
