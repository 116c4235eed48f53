"""``rankguard.Pool`` with real rank processes, a real gloo group and real faults: each fault kind
on each rank mid-forward fails only that request, within its deadline, and the next one
succeeds; spares heal the pool; a setup that always fails is reported with backoff."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import rankguard
from rankguard.deadline import Deadline
from rankguard.records import journal
from rankguard.processes import proctree
from rankguard.inputs.nccl_env import NCCL_SETTINGS

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


@contextlib.contextmanager
def journaled_pool(tmp_path: Path, setup: Any, world: int = 2, timeout: float = TIMEOUT,
                   **options: Any) -> Iterator[tuple[rankguard.Pool, Path]]:
    """A pool of ``world`` ranks, no spare replica, calls of ``timeout``, its journal in
    ``tmp_path``."""
    log = tmp_path / "journal.jsonl"
    with rankguard.Pool(world, setup, spares=0, timeout=timeout, journal=str(log),
                        **options) as pool:
        yield pool, log


def kill_rank1_while_healing(pool: rankguard.Pool, log: Path) -> int:
    """Kill rank 1 of the pool's replica mid-forward; return, once its replacement is under
    way (the pool healing), rank 0's pid."""
    survivor = pool.run(rf.pid, all_ranks=True)[0]
    with pytest.raises(rankguard.RequestFailed):
        pool.run(rf.forward, 1.0, fault=(1, "kill"))
    assert pool.status().state == "healing"
    wait_for(lambda: events(log, "ranks_replace"), 10, "rank 1's replacement to start")
    return survivor


@pytest.mark.slow
@pytest.mark.deadline(180)
@pytest.mark.parametrize("rank", [0, 1])
def test_each_fault_kind_mid_forward_fails_only_that_request_and_the_next_succeeds(
        rank: int, tmp_path: Path) -> None:
    log = tmp_path / "journal.jsonl"
    with rankguard.Pool(2, rf.load, spares=1, timeout=TIMEOUT, journal=str(log),
                        log_dir=str(tmp_path / "logs")) as pool:  # kept: the stacks are read
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
        # the last fault's heal (its culprit's stacks first) ends before the pool closes: a
        # close kills the ranks, and raced the stacks of the last hang on a loaded machine
        wait_for(lambda: pool.status().spares_ready >= 1, SPARE_WAIT_S, "the last heal")
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
        assert str(rank) in event["stacks"], (stacks, events(log, "group_retire"))
        culprit = Path(event["stacks"][str(rank)]).read_text()
        assert "rank_functions.py" in culprit and "in inject" in culprit, culprit
        # grouped by stack: the culprit apart from the others, in the journal itself
        alone = [line for line in event["grouped"] if line.startswith(f"rank {rank}: ")]
        assert len(alone) == 1 and "inject (" in alone[0], event["grouped"]
    # only the culprit's process goes: a hang's after its stacks, a dead rank's at once
    heals = {"raised": "regroup", "exited": "replace", "signalled": "replace"}
    retired = [e for e in events(log, "group_retire") if e["reason"] in rf.KINDS.values()]
    assert [(e["action"], e["ranks"]) for e in retired] == [
        (heals.get(c, "stacks_then_replace"), [] if c == "raised" else [rank])
        for c in rf.KINDS.values()]


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_rank_that_got_sigterm_and_tore_itself_down_is_reported_signalled_not_exited_0(
        tmp_path: Path) -> None:
    # the rank exits 0 after its teardown: "exited with code 0" hid that a signal ended it
    with journaled_pool(tmp_path, rf.load) as (pool, log):
        with pytest.raises(rankguard.RequestFailed) as caught:
            pool.run(rf.forward, 1.0, fault=(1, "term"))
        error = caught.value
        assert (error.rank, error.cause) == (1, "signalled"), error
        assert "rank 1 got SIGTERM (tore itself down, exited with code 0) during the request" \
            in str(error), error
        assert pool.run(rf.forward, 2.0) == rf.expected(2.0, 2)
    assert [(e["rank"], e["cause"]) for e in events(log, "request_fault")] == [(1, "signalled")]


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


@pytest.mark.slow  # 5 to 11 s: the quick set stays within 5 minutes
@pytest.mark.deadline(150)
def test_calls_during_healing_wait_or_fail_fast_and_a_fault_while_healing_is_survived(
        tmp_path: Path) -> None:
    # a replacement's setup of seconds: a window to fault in while healing
    with journaled_pool(tmp_path, rf.load_slowly_as_a_replacement) as (pool, log):
        survivor = kill_rank1_while_healing(pool, log)
        # a fault during healing: the rank that was kept dies while rank 1 is replaced
        os.kill(survivor, signal.SIGKILL)
        # a call that arrives while healing waits (bounded by its timeout) and succeeds
        assert pool.run(rf.forward, 1.0, timeout=90) == rf.expected(1.0, 2)
        assert pool.metrics()["heals"] == 1
    retired = events(log, "group_retire")
    assert [(e["group"], e["action"]) for e in retired] == [(1, "replace"), (1, "kill")]
    assert retired[1]["reason"].startswith("replacing ranks 1 failed: rank 0 was killed by "
                                           "SIGKILL"), retired[1]
    assert [e["group"] for e in events(log, "group_start")] == [1, 2]

    with rankguard.Pool(2, rf.load, spares=0, timeout=TIMEOUT, on_healing="fail",
                        zygote=False) as pool:
        with pytest.raises(rankguard.RequestFailed):
            pool.run(rf.forward, 1.0, fault=(0, "exit"))
        started = time.monotonic()
        with pytest.raises(rankguard.PoolUnavailable) as caught:
            pool.run(rf.forward, 1.0, timeout=30)
        assert time.monotonic() - started < 1.0
        assert caught.value.state == "healing" and caught.value.retry_after > 0


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.deadline(120)
def test_a_spare_that_dies_while_waiting_is_replaced(tmp_path: Path) -> None:
    log = tmp_path / "journal.jsonl"
    with rankguard.Pool(2, rf.load, spares=1, timeout=TIMEOUT, journal=str(log)) as pool:
        wait_for(lambda: pool.status().spares_ready == 1, SPARE_WAIT_S, "a spare")
        spare = events(log, "group_ready")[-1]["group"]
        pids = next(e["pids"] for e in events(log, "group_start") if e["group"] == spare)
        os.kill(pids[1], signal.SIGKILL)
        wait_for(lambda: any(e["reason"] == "a rank of an idle replica died"
                             for e in events(log, "group_retire")), 10, "the spare's retirement")
        wait_for(lambda: pool.status().spares_ready == 1, SPARE_WAIT_S, "a new spare")
        with pytest.raises(rankguard.RequestFailed):
            pool.run(rf.forward, 1.0, fault=(1, "kill"))
        assert pool.run(rf.forward, 1.0) == rf.expected(1.0, 2)


@pytest.mark.parametrize("kwargs, what", [
    ({"world_size": 0}, "Pool(world_size)"),
    ({"world_size": 2, "spares": -1}, "Pool(spares)"),
    ({"world_size": 2, "timeout": "soon"}, "Pool(timeout)"),
    ({"world_size": 2, "on_healing": "maybe"}, "Pool(on_healing)"),
    ({"world_size": 2, "setup": "load"}, "Pool(setup)"),
    ({"world_size": 2, "journal": "/"}, "Pool(journal)"),
    ({"world_size": 2**64}, "Pool(world_size)"),  # never a process started for it
    ({"world_size": 1, "spares": 10**400}, "Pool(spares)"),
    ({"world_size": 4, "spares": 300}, "Pool(world_size), Pool(spares) and Pool(replicas)"),
    ({"world_size": 2, "replicas": 0}, "Pool(replicas)"),
    ({"world_size": 2, "replicas": 2.0}, "Pool(replicas)"),
    ({"world_size": 2, "max_queue": -1}, "Pool(max_queue)"),
    ({"world_size": 2, "max_queue": 10 ** 18}, "Pool(max_queue)"),
    ({"world_size": 2, "zygote": "yes"}, "Pool(zygote)"),
    ({"world_size": 2, "timeout": 1, "suspect_after": 2}, "Pool(suspect_after)"),
    ({"world_size": 2, "devices": "0,1"}, "Pool(devices)"),
    ({"world_size": 2, "devices": [0, -1]}, "Pool(devices)"),
    ({"world_size": 2, "warm_spares": -1}, "Pool(warm_spares)"),
    ({"world_size": 2, "warm_spares": 1.5}, "Pool(warm_spares)"),
    ({"world_size": 2, "warm_spares": 10 ** 6}, "Pool(warm_spares)"),
    ({"world_size": 2, "gpus_per_replica": 0}, "Pool(gpus_per_replica)"),
    ({"world_size": 2, "devices": [0, 1], "gpus_per_replica": 2},
     "Pool(devices) and Pool(gpus_per_replica)"),
])
def test_bad_arguments_are_refused_before_any_process_starts(kwargs: dict, what: str) -> None:
    with pytest.raises(rankguard.UsageError) as caught:
        rankguard.Pool(**kwargs)
    assert caught.value.what == what


@pytest.mark.deadline(120)
def test_a_cpu_pool_shows_where_each_replica_runs_in_its_status_and_journal(
        tmp_path: Path) -> None:
    log = tmp_path / "journal.jsonl"
    with rankguard.Pool(2, rf.load, spares=1, timeout=10.0, journal=str(log)) as pool:
        assert pool.run(rf.placed_on, all_ranks=True) == [("cpu", "gloo", "")] * 2
        wait_for(lambda: pool.status().spares_ready == 1, SPARE_WAIT_S, "the spare replica")
        assert pool.status().placement == {1: ("cpu", "cpu"), 2: ("cpu", "cpu")}
        with pytest.raises(rankguard.RequestFailed):
            pool.run(rf.forward, 1.0, (1, "kill"))  # rank 1 is replaced in its replica
        wait_for(lambda: pool.status().spares_ready == 1, SPARE_WAIT_S, "the healed spare")
        assert pool.status().placement == {1: ("cpu", "cpu"), 2: ("cpu", "cpu")}
        with pytest.raises(rankguard.RequestFailed):
            pool.run(rf.die)  # nothing is left of its replica: a new one starts
        wait_for(lambda: pool.status().spares_ready == 1, SPARE_WAIT_S, "the new spare")
        lost = events(log, "request_fault")[1]["group"]
        assert pool.status().placement == {3 - lost: ("cpu", "cpu"), 3: ("cpu", "cpu")}
    assert [e["backend"] for e in events(log, "pool_start")] == ["gloo"]
    starts = [(e["group"], e["slot"], e["devices"]) for e in events(log, "group_start")]
    # the replacement takes the slot (and so the devices) of the replica it replaces
    assert starts == [(1, 0, ["cpu", "cpu"]), (2, 1, ["cpu", "cpu"]),
                      (3, lost - 1, ["cpu", "cpu"])]


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, True, "5", 0, -1.0, None,
                                   1e10])  # past ~9.2e9 s the platform's timers overflow
def test_every_seconds_argument_is_refused_unless_finite_and_positive(value: object) -> None:
    names = ("timeout", "start_timeout", "max_backoff") + (() if value is None else
                                                           ("suspect_after",))  # None: default
    for name in names:
        with pytest.raises(rankguard.UsageError) as caught:
            rankguard.Pool(2, **{name: value})
        assert caught.value.what == f"Pool({name})"


def test_a_close_timeout_that_is_not_seconds_is_refused_and_the_pool_still_closes() -> None:
    # NaN killed the supervisor thread (a traceback on stderr) and left the pool half-closed
    pool = rankguard.Pool(1, spares=0, timeout=TIMEOUT, wait=False)
    try:
        for value in (math.nan, -1.0, "1", math.inf, 1e12):
            with pytest.raises(rankguard.UsageError) as caught:
                pool.close(value, cut_calls=True)  # type: ignore[arg-type]
            assert caught.value.what == "Pool.close(timeout)", value
        assert pool.status().state != "closed"
    finally:
        pool.close(0)
    assert pool.status().state == "closed"


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_a_call_timeout_or_deadline_below_the_useful_minimum_is_refused() -> None:
    with rankguard.Pool(1, spares=0, timeout=TIMEOUT) as pool:
        group = pool.run(rf.pid)
        for value in (math.inf, math.nan, True, "1", 0, pool.min_call_s / 2, 1e10):
            with pytest.raises(rankguard.UsageError) as caught:
                pool.run(rf.pid, timeout=value)
            assert caught.value.what == "Pool.run(timeout)", value
        assert pool.run(rf.pid, timeout=pool.min_call_s) == group  # the least that is useful
        assert pool.metrics().get("requests_failed", 0) == 0
        # a deadline begun before the call (a server's, at the request's arrival): one that
        # comes with less than the useful minimum left is refused busy, reaching no replica
        spent = Deadline(time.monotonic() + pool.min_call_s / 2, TIMEOUT)
        with pytest.raises(rankguard.PoolUnavailable) as unavailable:
            pool.run(rf.pid, deadline=spent)
        assert unavailable.value.state == "busy" and "min_call_s" in str(unavailable.value)
        assert pool.run(rf.pid, deadline=Deadline.after(TIMEOUT)) == group
        # the least deadline a server accepts (X-Request-Timeout: min_call_s), begun as the body
        # was read, a few ms before the call: it starts on an idle replica
        least = Deadline(time.monotonic() + pool.min_call_s - 0.01, pool.min_call_s)
        assert pool.run(rf.pid, deadline=least) == group
        # no deadline, one past what the timers hold, or not a Deadline: the caller's mistake,
        # refused before any replica is touched (an OverflowError retired the replica)
        for wrong in (Deadline.never(), Deadline.after(1e12), 5.0):
            with pytest.raises(rankguard.UsageError) as caught:
                pool.run(rf.pid, deadline=wrong)  # type: ignore[arg-type]
            assert caught.value.what == "Pool.run(deadline)", wrong
        assert pool.run(rf.pid) == group
        assert pool.metrics().get("requests_failed", 0) == 0


@pytest.mark.slow  # out of the quick run (its 5 minutes)
@pytest.mark.deadline(120)
def test_a_queued_call_that_cannot_start_in_useful_time_fails_unavailable_and_spares_the_group(
        tmp_path: Path) -> None:
    log = tmp_path / "journal.jsonl"
    with rankguard.Pool(2, rf.load, spares=0, timeout=10.0, journal=str(log)) as pool:
        pids = pool.run(rf.pid, all_ranks=True)
        holder_done: list[object] = []
        free_at = time.monotonic() + 2.0
        holder = threading.Thread(target=lambda: holder_done.append(
            pool.run(rf.sleep_until, free_at)))
        holder.start()
        try:
            time.sleep(0.3)  # the holder has the group until free_at
            # this call's deadline comes 0.5 s after the group is free, less than the pool's
            # useful minimum (a tenth of its timeout): it must not get the group
            with pytest.raises(rankguard.PoolUnavailable) as caught:
                pool.run(rf.slow, 0.7, timeout=free_at + 0.5 - time.monotonic())
            assert caught.value.state == "busy"
            assert time.monotonic() < free_at  # it gave up without waiting for the group
        finally:
            holder.join(30)
        assert holder_done == [None]
        assert pool.run(rf.pid, all_ranks=True) == pids  # the same, healthy group
    assert events(log, "group_retire") == [] and events(log, "request_fault") == []


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.deadline(120)
def test_a_call_that_overruns_its_own_deadline_blames_no_rank_and_the_group_serves_again(
        tmp_path: Path) -> None:
    log = tmp_path / "journal.jsonl"
    with rankguard.Pool(2, rf.load, spares=0, timeout=10.0, journal=str(log)) as pool:
        pids = pool.run(rf.pid, all_ranks=True)
        with pytest.raises(rankguard.RequestFailed) as caught:
            pool.run(rf.slow, 2.0, timeout=1.0)  # every rank is healthy, just slower than that
        assert (caught.value.rank, caught.value.cause) == (None, "deadline"), caught.value
        assert caught.value.victims == []
        # the ranks finish that call, regroup, and the same processes serve the next one
        assert pool.run(rf.slow, 0.0, timeout=10.0) == 2.0
        assert pool.run(rf.pid, all_ranks=True) == pids
    retired = events(log, "group_retire")
    assert [(e["action"], e["reason"]) for e in retired] == [("drain_then_regroup", "deadline")]
    assert [e["rank"] for e in events(log, "request_fault")] == [None]


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_result_or_error_that_does_not_travel_fails_its_call_at_once_naming_the_rank(
        tmp_path: Path) -> None:
    # a result the leader could not unpickle ended the replica's watcher thread (the call got
    # a no-rank deadline verdict); a result whose pickling raised RuntimeError, or an error
    # whose str() raised, ended the rank's process (cause exited); an error of 50 MB made its
    # answer 100 MB (the verdict came at the deadline)
    with journaled_pool(tmp_path, rf.load, timeout=10.0) as (pool, _):
        for kind, rank, says in [
                ("loads", 0, "ValueError: its answer cannot be unpickled in the leader"),
                ("dumps", 0, "RuntimeError: its result cannot be pickled: this result refuses"),
                ("unprintable", 1, r"Unprintable: <its str\(\) raised RuntimeError>"),
                ("huge", 1, r"ValueError: x+\.\.\. \(49934464 more characters\)")]:
            started = time.monotonic()
            with pytest.raises(rankguard.RequestFailed, match=says) as caught:
                pool.run(rf.hostile_outcome, kind)
            took = time.monotonic() - started
            assert (caught.value.rank, caught.value.cause) == (rank, "raised"), caught.value
            assert took < 10.0 / 2, f"{kind}: the verdict came after {took:.2f} s"
            assert pool.run(rf.forward, 1.0) == rf.expected(1.0, 2)


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_call_that_destroys_the_process_group_fails_and_the_next_one_is_served(
        tmp_path: Path) -> None:
    # the call succeeded, and the next one, someone else's, failed with torch's 'Default
    # process group has not been initialized'
    with journaled_pool(tmp_path, rf.load) as (pool, log):
        with pytest.raises(rankguard.RequestFailed, match="destroyed the replica's process "
                           "group") as caught:
            pool.run(rf.destroy_group)
        assert caught.value.cause == "raised", caught.value
        assert pool.run(rf.forward, 1.0) == rf.expected(1.0, 2)
        assert pool.run(rf.forward, 2.0) == rf.expected(2.0, 2)
    # the ranks cannot regroup without the group they destroyed: the replica is replaced
    assert events(log, "group_retire")[0]["reason"] == "raised"


@pytest.mark.slow  # out of the quick run (its 5 minutes)
@pytest.mark.deadline(120)
def test_when_every_rank_raises_a_collective_error_the_verdict_comes_at_once() -> None:
    with rankguard.Pool(2, rf.load, spares=0, timeout=10.0) as pool:
        started = time.monotonic()
        with pytest.raises(rankguard.RequestFailed) as caught:
            pool.run(rf.late_peer, 1.0, 0.2)
        took = time.monotonic() - started
        assert caught.value.cause == "raised", caught.value
        assert took < 10.0 / 2, f"the verdict came after {took:.2f} s, at the call's deadline"
        assert pool.run(rf.forward, 1.0) == rf.expected(1.0, 2)


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_the_pool_removes_the_folder_it_made_and_keeps_the_one_it_was_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the pool makes its folder
    with rankguard.Pool(1, spares=0, timeout=TIMEOUT) as pool:
        pool.run(rf.pid)
        assert (Path(pool.log_dir) / "group1" / "rank0.log").exists()
        assert Path(pool.log_dir).parent == temp
    with pytest.raises(rankguard.PoolUnavailable):  # a pool whose start failed cleans up too
        rankguard.Pool(1, rf.broken_setup, spares=0)
    assert list(temp.iterdir()) == []
    given = tmp_path / "logs"
    with rankguard.Pool(1, spares=0, timeout=TIMEOUT, log_dir=str(given)) as pool:
        pool.run(rf.pid)
    assert (given / "group1" / "rank0.log").exists()


@pytest.mark.deadline(120)
def test_processes_the_ranks_started_do_not_outlive_the_pool() -> None:
    with rankguard.Pool(2, rf.load, spares=0, timeout=10.0) as pool:
        started = [pid for pids in pool.run(rf.start_children, all_ranks=True) for pid in pids]
        assert all(proctree.alive(pid) for pid in started)
    deadline = time.monotonic() + 10
    while any(proctree.alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [proctree.describe(pid) for pid in started if proctree.alive(pid)]


@pytest.mark.deadline(120)
@pytest.mark.parametrize("cut_calls", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_closing_the_pool_during_a_call_fails_it_as_pool_closed_and_blames_no_rank(
        tmp_path: Path, cut_calls: bool) -> None:
    # without cut_calls the call may finish within the close's timeout; with it (its caller
    # has its answer already: rankguard serve at the end of --grace), its ranks go at once
    log = tmp_path / "journal.jsonl"
    pool = rankguard.Pool(2, rf.load, spares=1, timeout=60.0, journal=str(log))
    caught: list[BaseException] = []

    def call() -> None:
        try:
            pool.run(rf.report_then_sleep, str(address), 60.0)
        except BaseException as error:  # noqa: BLE001 (the test reads it)
            caught.append(error)

    address = tmp_path / "running.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(address))
        listener.listen(1)
        listener.settimeout(30)
        caller = threading.Thread(target=call)
        caller.start()
        try:
            with listener.accept()[0] as running:  # rank 0 is in the call
                assert running.recv(16) == b"running"  # read before closing: no EPIPE
            close_s = 30.0 if cut_calls else 1.0
            started = time.monotonic()
            pool.close(timeout=close_s, cut_calls=cut_calls)  # while the caller's call runs
            closed_in = time.monotonic() - started
        finally:
            pool.close()
            caller.join(30)
    assert len(caught) == 1 and isinstance(caught[0], rankguard.PoolClosed), caught
    assert "closed during the call" in str(caught[0])
    if cut_calls:  # killed at once, not at the close's timeout
        assert closed_in < close_s / 3, closed_in
    else:  # killed at the close's timeout, not at the call's 60 s
        assert close_s <= closed_in < close_s + 10, closed_in
    assert events(log, "request_fault") == []  # the close is no rank's fault
    assert pool.metrics().get("faults_signalled", 0) == 0
    assert pool.metrics()["requests_closed"] == 1


@pytest.mark.parametrize("env, expected", [
    ({}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_ENABLE_MONITORING": "0",
          "TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "0"}),
    pytest.param({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"},
                 {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_ENABLE_MONITORING": "0",
                  "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "0"},
                 marks=pytest.mark.slow),  # out of the quick run (its 5 minutes)
])
def test_ranks_get_the_nccl_settings_of_rankguard_run_and_keep_the_users(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: dict[str, str]) -> None:
    # torch's watchdog must not kill a rank whose peer died: the pool's heal keeps it
    for name in NCCL_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    with rankguard.Pool(2, rf.load, spares=0, timeout=10.0, env=env) as pool:
        assert pool.run(rf.environ, list(NCCL_SETTINGS), all_ranks=True) == [expected] * 2
