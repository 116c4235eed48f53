"""How a pool heals a replica after a fault, with real rank processes, real gloo and real faults:
only the ranks that cannot be reused get a new process, which joins the survivors' new
generation; the survivors keep theirs (their weights; on a GPU, their CUDA context). When that
fails, the replica is killed and a new one takes its slot."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import rankguard
from rankguard.processes import proctree
from rankguard.supervisor import RankProcess

from . import rank_functions as rf
from .test_pool import (TIMEOUT, events, journaled_pool, kill_rank1_while_healing,
                        wait_for)



def fault_then_serve(pool: rankguard.Pool, fn: Callable[..., Any], *args: Any,
                     timeout: float | None = None
                     ) -> tuple[list[int], list[int], rankguard.RequestFailed]:
    """Each rank's pid before and after the call ``fn(*args)`` failed and the pool served the
    next request; the call's error."""
    before = pool.run(rf.pid, all_ranks=True)
    with pytest.raises(rankguard.RequestFailed) as caught:
        pool.run(fn, *args, timeout=timeout)
    assert pool.run(rf.forward, 2.0, timeout=60.0) == rf.expected(2.0, len(before))
    return before, pool.run(rf.pid, all_ranks=True), caught.value


def healed(log: Path) -> list[dict]:
    return [e for e in events(log, "group_ready") if e["role"] == "ranks_replaced"]


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.deadline(120)
@pytest.mark.parametrize("zygote", [True, False], ids=["forked", "cold"])
def test_a_killed_rank_is_replaced_while_its_peer_keeps_its_process(
        zygote: bool, tmp_path: Path) -> None:
    with journaled_pool(tmp_path, rf.load, zygote=zygote,
                        log_dir=str(tmp_path / "logs")) as (pool, log):
        before, after, error = fault_then_serve(pool, rf.forward, 1.0, (1, "kill"))
        assert (error.rank, error.cause) == (1, "signalled")
        assert after[0] == before[0] and after[1] != before[1]
        # the same place fails again: its new process is replaced in turn
        with pytest.raises(rankguard.RequestFailed):
            pool.run(rf.forward, 1.0, (1, "exit"))
        assert pool.run(rf.forward, 3.0, timeout=60.0) == rf.expected(3.0, 2)
        last = pool.run(rf.pid, all_ranks=True)
        assert last[0] == before[0] and last[1] not in (before[1], after[1])
        ledgers = sorted(p.name for p in (tmp_path / "logs" / "group1").glob("*.ledger"))
        assert ledgers == ["rank0.ledger", "rank1.2.ledger"]
    retired = events(log, "group_retire")
    assert [(e["action"], e["ranks"]) for e in retired] == [("replace", [1])] * 2
    assert [e["ranks"] for e in events(log, "ranks_replace")] == [[1]] * 2
    replaced = healed(log)
    assert [(e["group"], e["ranks"], e["pids"]) for e in replaced] == [
        (1, [1], after), (1, [1], last)]
    for event in replaced:  # where the heal's time went, the new rank's own steps included
        assert {"stop", "spawned", "joined", "rank1_process", "rank1_init", "rank1_group", "rank1_setup"} <= set(event["parts"])
        assert all(took >= 0 for took in event["parts"].values()), event["parts"]
    assert len(events(log, "group_start")) == 1  # no new replica was needed
    # a replaced process's ledger goes with it; the log stays, appended to
    assert sorted(p.name for p in (tmp_path / "logs" / "group1").glob("*.ledger")) == []
    assert len(events(log, "heal")) == 2


@pytest.mark.deadline(120)
def test_a_rank_whose_error_says_its_cuda_context_is_lost_is_replaced_its_peer_kept(
        tmp_path: Path) -> None:
    with journaled_pool(tmp_path, rf.load) as (pool, log):
        before, after, error = fault_then_serve(pool, rf.forward, 1.0, (1, "sticky"))
        # an ordinary error keeps both processes
        _, kept, _ = fault_then_serve(pool, rf.forward, 1.0, (1, "raise"))
    assert (error.rank, error.cause, error.error_type) == (1, "raised", "RuntimeError")
    assert after[0] == before[0] and after[1] != before[1] and kept == after
    retired = events(log, "group_retire")
    assert [(e["action"], e["ranks"]) for e in retired] == [("replace", [1]), ("regroup", [])]


@pytest.mark.slow
@pytest.mark.deadline(150)
def test_a_frozen_rank_is_replaced_after_its_stacks_and_its_victims_keep_their_processes(
        tmp_path: Path) -> None:
    with journaled_pool(tmp_path, rf.load, world=3,
                        log_dir=str(tmp_path / "logs")) as (pool, log):
        before, after, error = fault_then_serve(pool, rf.forward, 1.0, (1, "freeze"))
    assert (error.rank, error.cause) == (1, "frozen")
    assert (after[0], after[2]) == (before[0], before[2]) and after[1] != before[1]
    retired = events(log, "group_retire")
    assert [(e["action"], e["ranks"]) for e in retired] == [("stacks_then_replace", [1])]
    stacks = events(log, "stacks")
    assert len(stacks) == 1 and list(stacks[0]["stacks"]) == ["1"]  # the culprit's, first
    culprit = Path(stacks[0]["stacks"]["1"]).read_text()
    assert "in inject" in culprit, culprit
    assert [e["ranks"] for e in healed(log)] == [[1]]


@pytest.mark.slow
@pytest.mark.deadline(150)
def test_when_the_new_process_fails_its_setup_the_replica_is_killed_and_a_new_one_serves(
        tmp_path: Path) -> None:
    with journaled_pool(tmp_path, rf.load_but_not_as_a_replacement) as (pool, log):
        before, after, _ = fault_then_serve(pool, rf.forward, 1.0, (0, "kill"))
    assert not set(after) & set(before)  # a whole new replica
    retired = events(log, "group_retire")
    assert [(e["group"], e["action"]) for e in retired] == [(1, "replace"), (1, "kill")]
    assert retired[1]["reason"].startswith("replacing ranks 0 failed: rank 0 failed its setup: "
                                           "RuntimeError: this shard cannot be loaded again")
    assert healed(log) == []
    assert [e["group"] for e in events(log, "group_start")] == [1, 2]


@pytest.mark.slow  # out of the quick run (its 5 minutes)
@pytest.mark.deadline(120)
def test_a_peer_waiting_for_a_rank_that_died_is_released_at_once_not_at_the_deadline(
        tmp_path: Path) -> None:
    # each rank's child holds the rank's sockets: its death breaks no connection (as on NCCL),
    # so its peer learns it only from the pool
    with journaled_pool(tmp_path, rf.load, timeout=30.0) as (pool, log):
        children = pool.run(rf.fork_sleeper, all_ranks=True)
        assert fault_then_serve(pool, rf.forward, 1.0, (1, "kill"))[2].rank == 1
    took = healed(log)[0]["took_s"]
    assert took < 15.0, f"rank 0 waited out the request's 30 s deadline: healed after {took} s"
    wait_for(lambda: not [child for child in children if proctree.alive(child)], 10,
             "the ranks' forked children to end")


@pytest.mark.slow
@pytest.mark.deadline(150)
def test_after_an_overrun_only_the_rank_that_never_finished_the_call_is_replaced(
        tmp_path: Path) -> None:
    # the pool's timeout (3 s) bounds how long the overrun call may take to finish
    with journaled_pool(tmp_path, rf.load, timeout=3.0) as (pool, log):
        before, after, error = fault_then_serve(pool, rf.sleep_by_rank, [1.5, 60.0],
                                                timeout=1.0)
    assert (error.rank, error.cause) == (None, "deadline")
    assert after[0] == before[0] and after[1] != before[1]
    retired = events(log, "group_retire")
    assert [(e["action"], e["ranks"]) for e in retired] == [
        ("drain_then_regroup", []), ("stacks_then_replace", [1])]
    assert list(events(log, "stacks")[0]["stacks"]) == ["1"]
    assert [e["ranks"] for e in healed(log)] == [[1]]


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.deadline(120)
def test_a_warm_spare_takes_the_place_of_a_killed_rank_and_another_warms_up(
        tmp_path: Path) -> None:
    with journaled_pool(tmp_path, rf.load, warm_spares=1) as (pool, log):
        wait_for(lambda: pool.status().warm_spares == {"cpu": 1}, 60, "a warm spare")
        before, after, _ = fault_then_serve(pool, rf.forward, 1.0, (1, "kill"))
        assert after[0] == before[0] and after[1] != before[1]
        wait_for(lambda: pool.status().warm_spares == {"cpu": 1}, 60, "the next warm spare")
    (event,) = healed(log)
    assert event["warm"] == [1] and event["pids"] == after


@pytest.mark.deadline(120)
def test_what_a_replaced_rank_started_goes_with_it_and_its_peers_children_stay(
        tmp_path: Path) -> None:
    with rankguard.Pool(2, rf.load, spares=0, timeout=TIMEOUT) as pool:
        started = pool.run(rf.start_sleepers, all_ranks=True)
        fault_then_serve(pool, rf.forward, 1.0, (1, "kill"))
        wait_for(lambda: not [pid for pid in started[1] if proctree.alive(pid)], 10,
                 "the killed rank's child and daemon to end")
        assert all(proctree.alive(pid) for pid in started[0]), "the survivor's were killed"
    wait_for(lambda: not [pid for pid in started[0] if proctree.alive(pid)], 10,
             "the survivor's child and daemon to end with the pool")


@pytest.mark.deadline(120)
def test_a_rank_that_dies_in_an_idle_replica_is_replaced_and_its_peers_kept(
        tmp_path: Path) -> None:
    with journaled_pool(tmp_path, rf.load, world=3) as (pool, log):
        before = pool.run(rf.pid, all_ranks=True)
        os.kill(before[1], signal.SIGKILL)
        wait_for(lambda: healed(log), 60, "the idle replica's heal")
        after = pool.run(rf.pid, all_ranks=True)
        assert pool.metrics()["heal_replace"] == 1
    assert (after[0], after[2]) == (before[0], before[2]) and after[1] != before[1]
    (retired,) = events(log, "group_retire")
    assert (retired["action"], retired["ranks"], retired["kept"]) == ("replace", [1], [0, 2])


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_survivor_still_busy_with_the_failed_call_gets_the_pools_timeout_not_more(
        tmp_path: Path) -> None:
    with journaled_pool(tmp_path, rf.load) as (pool, log):
        started = time.monotonic()
        with pytest.raises(rankguard.RequestFailed):
            pool.run(rf.die_while_peer_computes, 60.0)
        assert pool.run(rf.forward, 2.0, timeout=60.0) == rf.expected(2.0, 2)
        served_after = time.monotonic() - started
        wait_for(lambda: events(log, "stacks"), 30, "the failed heal's stacks")
    assert served_after < 40.0, "the heal waited for the busy survivor's 60 s call"
    retired = events(log, "group_retire")
    assert [e["action"] for e in retired] == ["replace", "kill"]
    assert retired[1]["reason"] == (f"replacing ranks 1 failed: ranks 0 did not finish the "
                                    f"failed call within {TIMEOUT:g} s")
    # where the survivor was when the heal gave up, in the journal before the replica's kill
    (stacks,) = events(log, "stacks")
    assert list(stacks["stacks"]) == ["0"] and stacks["ts"] >= retired[1]["ts"], stacks
    assert "die_while_peer_computes" in " ".join(stacks["grouped"]), stacks


@pytest.mark.slow
@pytest.mark.deadline(150)
def test_a_survivor_stopped_while_its_replica_heals_is_replaced_after_its_stacks(
        tmp_path: Path) -> None:
    with journaled_pool(tmp_path, rf.load_slowly_as_a_replacement) as (pool, log):
        survivor = kill_rank1_while_healing(pool, log)
        time.sleep(0.5)  # rank 0 has answered the failed call (told of rank 1's death)
        os.kill(survivor, signal.SIGSTOP)  # while the new rank 1 loads (3 s)
        assert pool.run(rf.forward, 2.0, timeout=90.0) == rf.expected(2.0, 2)
        assert survivor not in pool.run(rf.pid, all_ranks=True)
    retired = events(log, "group_retire")
    assert [(e["action"], e["ranks"]) for e in retired] == [
        ("replace", [1]), ("stacks_then_replace", [0])]
    assert retired[1]["reason"] == "a rank was stopped while its replica healed"


def leader_holds() -> dict[str, int]:
    """What the leader holds that a heal could leave behind: threads, file descriptors, and
    records of rank processes."""
    gc.collect()
    return {"threads": threading.active_count(), "fds": len(os.listdir("/proc/self/fd")),
            "rank records": sum(type(o) is RankProcess for o in gc.get_objects())}


@pytest.mark.slow
@pytest.mark.deadline(180)
def test_heal_after_heal_the_leader_holds_no_more_than_after_the_first(tmp_path: Path) -> None:
    heals = 6

    def heal_once() -> None:
        with pytest.raises(rankguard.RequestFailed):
            pool.run(rf.forward, 1.0, (1, "kill"))
        assert pool.run(rf.forward, 2.0, timeout=60.0) == rf.expected(2.0, 2)

    with journaled_pool(tmp_path, rf.load) as (pool, log):
        heal_once()  # the first heal makes what every heal reuses (the spawner's thread...)
        first = leader_holds()
        for _ in range(heals):
            heal_once()
        # a heal's own threads end just after it: each count must come back within a bound
        wait_for(lambda: all(leader_holds()[k] <= first[k] for k in first), 10,
                 f"the leader to hold no more than after the first heal ({first}) after "
                 f"{heals} more; it holds {leader_holds()}")
    assert len(healed(log)) == heals + 1
