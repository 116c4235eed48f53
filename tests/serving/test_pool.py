"""``rankguard.Pool`` with real rank processes, a real gloo group and real faults: each fault kind
on each rank mid-forward fails only that request, within its deadline, and the next one
succeeds; spares heal the pool; a setup that always fails is reported with backoff."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import rankguard
from rankguard import journal

from . import rank_functions as rf

TIMEOUT = 2.0
SPARE_WAIT_S = 60.0


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def events(path: Path, name: str) -> list[dict]:
    return [e for e in journal.read(str(path)) if e["event"] == name] if path.exists() else []


@pytest.mark.slow
@pytest.mark.deadline(180)
@pytest.mark.parametrize("rank", [0, 1])
def test_each_fault_kind_mid_forward_fails_only_that_request_and_the_next_succeeds(
        rank: int, tmp_path: Path) -> None:
    log = tmp_path / "journal.jsonl"
    with rankguard.Pool(2, rf.load, spares=1, timeout=TIMEOUT, journal=str(log)) as pool:
        assert pool.run(rf.forward, 1.0) == rf.expected(1.0, 2)
        for kind, cause in rf.KINDS.items():
            wait_for(lambda: pool.status().spares_ready >= 1, SPARE_WAIT_S, "a spare")
            started = time.monotonic()
            with pytest.raises(rankguard.RequestFailed) as caught:
                pool.run(rf.forward, 1.0, fault=(rank, kind))
            took = time.monotonic() - started
            error = caught.value
            assert (error.rank, error.cause) == (rank, cause), f"{kind}: {error}"
            assert error.victims == [1 - rank] or cause in ("exited", "signalled", "raised"), \
                f"{kind}: {error}"
            assert took < TIMEOUT + 0.5, f"{kind}: the error came {took:.2f} s after the call"
            if cause in ("raised", "exited", "signalled"):
                assert took < TIMEOUT / 2, f"{kind} is seen at once, not at the deadline"
            if cause == "raised":
                assert "ValueError: injected failure mid-forward" in error.remote_traceback
            assert pool.run(rf.forward, 2.0) == rf.expected(2.0, 2), f"after {kind}"
        metrics = pool.metrics()
    assert metrics["requests_failed"] == len(rf.KINDS)
    assert metrics["heals"] == len(rf.KINDS)
    assert metrics["faults_deadline"] == 2 and metrics["faults_frozen"] == 1
    faults = events(log, "request_fault")
    assert [(e["rank"], e["cause"]) for e in faults] == [(rank, c) for c in rf.KINDS.values()]
    assert len(events(log, "heal")) == len(rf.KINDS)
    stacks = events(log, "stacks")  # after each hang verdict: where every rank was
    assert len(stacks) == 3, stacks
    for event in stacks:
        culprit = Path(event["stacks"][str(rank)]).read_text()
        assert "rank_functions.py" in culprit and "in inject" in culprit, culprit
    retired = events(log, "group_retire")
    assert [e["action"] for e in retired[:len(rf.KINDS)]] == [
        "regroup" if c == "raised" else "kill" for c in rf.KINDS.values()]


def test_all_ranks_results_and_unpicklable_calls(tmp_path: Path) -> None:
    with rankguard.Pool(2, rf.load, spares=0, timeout=TIMEOUT) as pool:
        pids = pool.run(rf.pid, all_ranks=True)
        assert len(set(pids)) == 2
        with pytest.raises(rankguard.UsageError, match="cannot be pickled"):
            pool.run(lambda state: 1)
        assert pool.run(rf.pid, all_ranks=True) == pids  # nothing was sent: same group
    with pytest.raises(rankguard.PoolClosed):
        pool.run(rf.pid)


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_setup_that_always_fails_is_reported_with_backoff(tmp_path: Path) -> None:
    with pytest.raises(rankguard.PoolUnavailable) as caught:
        rankguard.Pool(2, rf.broken_setup, spares=0)
    assert caught.value.state == "failed"
    assert "failed its setup: RuntimeError: no weights at /nonexistent/shard" in str(caught.value)

    log = tmp_path / "journal.jsonl"
    pool = rankguard.Pool(2, rf.broken_setup, spares=1, max_backoff=2.0, journal=str(log),
                          wait=False)
    try:
        wait_for(lambda: len(events(log, "group_start_failed")) >= 3, 90, "3 failed start-ups")
        started = time.monotonic()
        with pytest.raises(rankguard.PoolUnavailable) as caught:
            pool.run(rf.pid, timeout=30)
        assert time.monotonic() - started < 1.0  # at once, not at the end of the 30 s
        assert caught.value.state == "failed" and caught.value.retry_after > 0
        assert "RuntimeError" in (pool.status().last_start_failure or "")
    finally:
        pool.close()
    failed = events(log, "group_start_failed")
    assert [e["consecutive"] for e in failed] == list(range(1, len(failed) + 1))
    assert [e["backoff_s"] for e in failed[:3]] == [0.5, 1.0, 2.0]
    assert all(e["backoff_s"] <= 2.0 for e in failed)
    assert "no weights at /nonexistent/shard" in failed[0]["traceback"]
    starts = [e["ts"] for e in events(log, "group_start")]
    for failure in failed:  # never a tight loop of restarts: each waits out its backoff
        later = [ts for ts in starts if ts > failure["ts"]]
        assert not later or later[0] >= failure["ts"] + failure["backoff_s"] - 0.05, \
            (failure, later[0])


@pytest.mark.deadline(150)
def test_calls_during_healing_wait_or_fail_fast_and_a_fault_while_healing_is_survived(
        tmp_path: Path) -> None:
    log = tmp_path / "journal.jsonl"
    with rankguard.Pool(2, rf.load, spares=0, timeout=TIMEOUT, journal=str(log)) as pool:
        with pytest.raises(rankguard.RequestFailed):
            pool.run(rf.forward, 1.0, fault=(1, "kill"))
        assert pool.status().state == "healing"
        # a fault during healing: a rank of the group that is starting dies
        wait_for(lambda: len(events(log, "group_start")) >= 2, 10, "the replacement's start")
        os.kill(events(log, "group_start")[-1]["pids"][0], signal.SIGKILL)
        # a call that arrives while healing waits (bounded by its timeout) and succeeds
        assert pool.run(rf.forward, 1.0, timeout=90) == rf.expected(1.0, 2)
        assert pool.metrics()["heals"] == 1
    assert len(events(log, "group_start_failed")) == 1

    with rankguard.Pool(2, rf.load, spares=0, timeout=TIMEOUT, on_healing="fail") as pool:
        with pytest.raises(rankguard.RequestFailed):
            pool.run(rf.forward, 1.0, fault=(0, "exit"))
        started = time.monotonic()
        with pytest.raises(rankguard.PoolUnavailable) as caught:
            pool.run(rf.forward, 1.0, timeout=30)
        assert time.monotonic() - started < 1.0
        assert caught.value.state == "healing" and caught.value.retry_after > 0


@pytest.mark.deadline(120)
def test_a_spare_that_dies_while_waiting_is_replaced(tmp_path: Path) -> None:
    log = tmp_path / "journal.jsonl"
    with rankguard.Pool(2, rf.load, spares=1, timeout=TIMEOUT, journal=str(log)) as pool:
        wait_for(lambda: pool.status().spares_ready == 1, SPARE_WAIT_S, "a spare")
        spare = events(log, "group_ready")[-1]["group"]
        pids = next(e["pids"] for e in events(log, "group_start") if e["group"] == spare)
        os.kill(pids[1], signal.SIGKILL)
        wait_for(lambda: any(e["reason"] == "a spare's rank died"
                             for e in events(log, "group_retire")), 10, "the spare's retirement")
        wait_for(lambda: pool.status().spares_ready == 1, SPARE_WAIT_S, "a new spare")
        with pytest.raises(rankguard.RequestFailed):
            pool.run(rf.forward, 1.0, fault=(1, "kill"))
        assert pool.run(rf.forward, 1.0) == rf.expected(1.0, 2)


@pytest.mark.parametrize("kwargs, what", [
    ({"world_size": 0}, "Pool(world_size)"),
    ({"world_size": 2, "spares": -1}, "Pool(spares)"),
    ({"world_size": 2, "timeout": "soon"}, "timeout"),
    ({"world_size": 2, "on_healing": "maybe"}, "Pool(on_healing)"),
    ({"world_size": 2, "setup": "load"}, "Pool(setup)"),
])
def test_bad_arguments_are_refused_before_any_process_starts(kwargs: dict, what: str) -> None:
    with pytest.raises(rankguard.UsageError) as caught:
        rankguard.Pool(**kwargs)
    assert caught.value.what == what
