"""CUDA faults inside a forward of a ``rankguard.Pool`` replica of two NCCL ranks sharing GPU 0,
while a second replica serves (``python -m pytest -m gpu``): each fails only its own request,
naming rank 1 and the cause; rank 0, waiting in the NCCL all_reduce, is released by the
communicator's abort (a raise or a death), or at the request's deadline (a rank stuck in a
kernel); only what cannot be reused is replaced (an ordinary error: nothing, the replica regroups
its processes); the replica serves again; GPU memory is back to
its level; nothing is left running. Skipped without a CUDA GPU."""

from __future__ import annotations

import faulthandler
import time
from pathlib import Path

import pytest

import rankguard
from rankguard.processes import proctree, stack_requests
from rankguard.records import journal
from tests.gpu import pool_functions as gf
from tests.gpu.nccl_ranks import GPU_SET, ONE_GPU

pytestmark = GPU_SET

TIMEOUT = 10.0  # a request's deadline: long enough for a first NCCL collective
HEALED_S = 5.0  # the bound: fault -> the replica serves again
SLACK_BYTES = 64 << 20  # the device's free memory may move by this much (NCCL's own buffers)
WARM_S = 60.0  # the pool's warm spare on GPU 0 (a cold start: Python, torch, CUDA's context)


def _warm_spare_ready(pool: rankguard.Pool, kind: str) -> None:
    """Wait (``WARM_S`` at most) until the pool's warm spare on GPU 0 is ready. The pool
    starts it once every replica serves, and again once a heal took it: its CUDA context is
    in the device's free memory only from then on, so each reading of it waits for one."""
    until = time.monotonic() + WARM_S
    while pool.status().warm_spares.get("cuda:0", 0) < 1:
        assert time.monotonic() < until, f"{kind}: no warm spare on GPU 0: {pool.status()}"
        time.sleep(0.05)


def _served_by_group(pool: rankguard.Pool, group: int, until: float, log: Path) -> float:
    """Wait, until ``until`` (monotonic), for replica ``group`` to be healthy and both replicas
    idle; returns when (monotonic). If it is not, the live ranks' stacks go to their logs."""
    while time.monotonic() < until:
        if group in pool.status().placement and pool.status().idle >= 2:
            return time.monotonic()
        time.sleep(0.05)
    pids = {pid for e in journal.read(str(log)) for pid in e.get("pids") or ()}
    for pid in pids:
        stack_requests.request(pid)
    time.sleep(1.0)  # the dumps land in the pool's log folder (tmp_path/logs)
    with open(log.parent / "leader_threads.txt", "w") as threads:  # the heal's step
        faulthandler.dump_traceback(threads, all_threads=True)
    raise AssertionError(f"replica {group} did not serve again in time: {pool.status()}")


@pytest.mark.parametrize("kind", gf.FAULTS)
def test_each_cuda_fault_fails_one_request_and_the_replica_heals_keeping_what_is_healthy(
        tmp_path: Path, kind: str) -> None:
    cause, replaced = gf.FAULTS[kind]
    log = tmp_path / "journal.jsonl"
    with rankguard.Pool(2, gf.load, devices=[[0, 0], [0, 0]], replicas=2, spares=0,
                        timeout=TIMEOUT, start_timeout=90.0, env=ONE_GPU,
                        journal=str(log), log_dir=str(tmp_path / "logs")) as pool:
        pool.wait_ready(90.0)
        assert pool.run(gf.forward, 1.0) == gf.expected(1.0, 2)
        assert pool.run(gf.forward, 1.0) == gf.expected(1.0, 2)  # both replicas' first calls
        started = {e["group"]: e["pids"] for e in journal.read(str(log))
                   if e["event"] == "group_start"}
        _warm_spare_ready(pool, kind)
        memory = pool.run(gf.memory, all_ranks=True)
        t0 = time.monotonic()
        with pytest.raises(rankguard.RequestFailed) as caught:
            pool.run(gf.forward, 1.0, (1, kind))
        took = time.monotonic() - t0
        assert (caught.value.rank, caught.value.cause) == (1, cause), f"{kind}: {caught.value}"
        assert took < TIMEOUT + 1.0, f"{kind}: the error came after {took:.2f} s"
        if cause != "deadline":
            assert took < TIMEOUT / 2, f"{kind}: rank 0 was released by a timeout"
        # the other replica serves meanwhile
        assert pool.run(gf.forward, 2.0) == gf.expected(2.0, 2), kind
        faulty = [e for e in journal.read(str(log)) if e["event"] == "request_fault"][-1]
        # a hung rank's stacks come first (bounded by the request's deadline)
        healed = _served_by_group(
            pool, faulty["group"],
            t0 + took + HEALED_S + (TIMEOUT if cause == "deadline" else 0.0), log)
        after_pids = {e["group"]: e["pids"] for e in journal.read(str(log))
                      if e["event"] == "group_ready" and e.get("pids")}
        old = started[faulty["group"]]
        pids = after_pids.get(faulty["group"], old)
        print(f"{kind}: request failed after {took:.2f} s ({cause}); replica "
              f"{faulty['group']} healthy again {healed - t0 - took:.2f} s later; "
              f"rank 1 replaced: {pids[1] != old[1]}")
        assert pids[0] == old[0], f"{kind}: rank 0's process was not kept"
        assert (pids[1] != old[1]) == replaced, f"{kind}: rank 1 {pids} vs {old}"
        # the healed replica answers (each replica, whichever the pool picks: two calls each)
        for _ in range(4):
            assert pool.run(gf.forward, 3.0) == gf.expected(3.0, 2), kind
        _warm_spare_ready(pool, kind)  # a heal that took it started another
        now = pool.run(gf.memory, all_ranks=True)
        assert now[0][0] == memory[0][0], f"{kind}: rank 0's allocations moved"
        assert abs(now[0][1] - memory[0][1]) <= SLACK_BYTES, \
            f"{kind}: the GPU's free memory moved by {now[0][1] - memory[0][1]} bytes"
        every = [pid for group_pids in (*started.values(), pids) for pid in group_pids]
    assert not [pid for pid in every if proctree.alive(pid)], "a rank outlived the pool"
