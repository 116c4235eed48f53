"""Replicas of a ``rankguard.Pool`` serving at the same time: which replica takes a call
(``serving.dispatch``), and, with real rank processes, a fault of every kind in one replica
while the calls on the others all succeed, a hung call's replica drained after
``suspect_after``, the pool refilled."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import rankguard
from rankguard.serving.dispatch import Dispatch

from . import rank_functions as rf
from .test_pool import SPARE_WAIT_S, events, wait_for

TIMEOUT = 3.0
SUSPECT_S = 0.3


def test_dispatch_serves_in_order_of_arrival_within_the_replicas() -> None:
    dispatch: Dispatch[str] = Dispatch(replicas=2, suspect_after=60.0)
    for name in ("a", "b", "c"):
        dispatch.add(name)
    first, second, third = dispatch.enqueue(), dispatch.enqueue(), dispatch.enqueue()
    assert (dispatch.free(), dispatch.spare_replicas()) == (2, 1)
    assert dispatch.can_take(second) and not dispatch.can_take(third)
    assert dispatch.take(first) == "a" and dispatch.take(second) == "b"
    assert (dispatch.free(), dispatch.spare_replicas(), dispatch.waiting()) == (0, 1, 1)
    assert not dispatch.can_take(third)  # "c" is a spare: two calls run already
    assert dispatch.done("a") is not None  # "a" serves again, after the spare in line
    assert dispatch.ready == ["c", "a"] and dispatch.can_take(third)
    assert dispatch.take(third) == "c"
    assert dispatch.remove("b") and not dispatch.remove("b")
    assert dispatch.healthy() == 2 and dispatch.next_suspicion() is not None


def test_dispatch_lends_a_spare_in_place_of_a_suspect_and_counts_it_once() -> None:
    dispatch: Dispatch[str] = Dispatch(replicas=1, suspect_after=5.0)
    dispatch.add("serving")
    dispatch.add("spare")
    dispatch.take(dispatch.enqueue())
    waiting = dispatch.enqueue()
    started = dispatch.busy["serving"]
    assert not dispatch.can_take(waiting, now=started + 4.9)
    assert dispatch.next_suspicion(now=started + 4.9) == pytest.approx(0.101)
    assert dispatch.can_take(waiting, now=started + 5.1)
    assert dispatch.newly_suspect(now=started + 5.1) == ["serving"]
    assert dispatch.newly_suspect(now=started + 6.0) == []  # once per call
    assert dispatch.take(waiting) == "spare"
    dispatch.leave(dispatch.enqueue())
    assert dispatch.waiting() == 0
    assert dispatch.done("serving") is not None and dispatch.ready == ["serving"]
    assert dispatch.clear() == ["spare", "serving"] and dispatch.healthy() == 0


def _whole(pool: rankguard.Pool) -> None:
    wait_for(lambda: (lambda s: s.idle + s.spares_ready == 3)(pool.status()), SPARE_WAIT_S,
             "every replica and spare ready")


def _pool(tmp_path: Path, replicas: int) -> rankguard.Pool:
    """Two ranks per replica, one spare, suspects after SUSPECT_S; journal.jsonl in tmp_path."""
    return rankguard.Pool(2, rf.load, replicas=replicas, spares=1, timeout=TIMEOUT,
                          suspect_after=SUSPECT_S, journal=str(tmp_path / "journal.jsonl"))


@pytest.mark.slow
@pytest.mark.deadline(300)
def test_a_fault_of_each_kind_in_one_replica_fails_only_its_call(tmp_path: Path) -> None:
    log = tmp_path / "journal.jsonl"
    with _pool(tmp_path, replicas=2) as pool:
        for kind, cause in rf.KINDS.items():
            _whole(pool)
            faulty: list[BaseException] = []

            def call_with_fault() -> None:
                try:
                    pool.run(rf.forward, 1.0, fault=(1, kind))
                except rankguard.RequestFailed as error:
                    faulty.append(error)

            caller = threading.Thread(target=call_with_fault)
            started = time.monotonic()
            caller.start()
            wait_for(lambda: pool.status().serving >= 1 or not caller.is_alive(), 10,
                     "the faulty call to start")  # (a raise or crash may be over at once)
            served = 0
            while caller.is_alive() or served < 4:  # the other replica goes on serving
                assert pool.run(rf.forward, 2.0) == rf.expected(2.0, 2), kind
                served += 1
                assert time.monotonic() - started < TIMEOUT + 5, kind
            caller.join(TIMEOUT + 5)
            assert [(e.rank, e.cause) for e in faulty] == [(1, cause)], (kind, faulty)
        metrics = pool.metrics()
    assert metrics["requests_failed"] == len(rf.KINDS)
    assert metrics.get("requests_unavailable", 0) == 0
    # the three that hang past suspect_after had their replica drained while calls waited
    hung = [e["group"] for e in events(log, "request_fault")
            if e["cause"] in ("frozen", "deadline")]
    suspected = [e["group"] for e in events(log, "group_suspect")]
    assert len(hung) == 3 and set(hung) <= set(suspected), (hung, suspected)
    assert metrics["heals"] == len(rf.KINDS)


@pytest.mark.slow
@pytest.mark.deadline(180)
def test_calls_behind_a_hung_call_go_to_a_spare_after_suspect_after(tmp_path: Path) -> None:
    log = tmp_path / "journal.jsonl"
    with _pool(tmp_path, replicas=1) as pool:
        wait_for(lambda: pool.status().spares_ready == 1, SPARE_WAIT_S, "a spare")
        caller = threading.Thread(target=lambda: pytest.raises(
            rankguard.RequestFailed, pool.run, rf.forward, 1.0, fault=(0, "sleep")))
        caller.start()
        wait_for(lambda: pool.status().serving == 1, 10, "the hung call to start")
        started = time.monotonic()
        assert pool.run(rf.forward, 2.0) == rf.expected(2.0, 2)
        waited = time.monotonic() - started
        status = pool.status()
        caller.join(TIMEOUT + 5)
    assert SUSPECT_S * 0.5 < waited < TIMEOUT - 0.5, waited  # after suspicion, not the verdict
    assert (status.suspect, status.serving) == (1, 1), status
    assert [e["running_s"] >= SUSPECT_S for e in events(log, "group_suspect")] == [True]


@pytest.mark.deadline(120)
def test_a_full_queue_is_refused_at_once(tmp_path: Path) -> None:
    with rankguard.Pool(1, spares=0, timeout=TIMEOUT, max_queue=0) as pool:
        blocker = threading.Thread(target=pool.run, args=(rf.slow, 1.5))
        blocker.start()
        wait_for(lambda: pool.status().serving == 1, 10, "the first call to start")
        started = time.monotonic()
        with pytest.raises(rankguard.PoolUnavailable) as caught:
            pool.run(rf.pid)
        refused_after = time.monotonic() - started
        blocker.join(10)
    assert refused_after < 1.0  # not after the running call
    assert caught.value.state == "busy" and "max_queue=0" in str(caught.value)
