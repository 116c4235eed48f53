"""Warm ranks on GPU 0 (``serving.warm_spares``): each initialises CUDA and makes its context
there before it is needed, then becomes a rank of a replica of two NCCL ranks sharing the GPU
(each a host of its own through the ``NCCL_HOSTID`` of its placement, read after it became the
rank) that serves an all_reduce (``python -m pytest -m gpu``). The CPU cases are in
tests/serving/test_warm_spares.py. Skipped without a CUDA GPU."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from rankguard.deadline import Deadline
from rankguard.serving.placement import ReplicaPlacement
from rankguard.serving.replica import Replica, StartState
from rankguard.serving.warm_spares import WarmSpares
from rankguard.serving.warm_worker import WarmPart
from tests.gpu.nccl_ranks import GPU_SET, ONE_GPU
from tests.serving import rank_functions as rf

pytestmark = GPU_SET

READY_S = 120.0  # a cold CUDA start, then NCCL's


def test_warm_ranks_on_gpu_0_become_the_nccl_ranks_of_a_replica(tmp_path: Path) -> None:
    changed = threading.Event()
    warm = WarmSpares(ONE_GPU, str(tmp_path / "warm"), READY_S, changed.set)
    replica = None
    try:
        assert warm.fill("cuda:0", 2) == 2
        limit = Deadline.after(READY_S)
        while warm.counts()["cuda:0"].ready < 2:
            assert not limit.passed() and not warm.counts()["cuda:0"].failed, warm.counts()
            changed.wait(limit.wait_time(cap=1.0))
            changed.clear()
        starts = [warm.take("cuda:0"), warm.take("cuda:0")]
        assert all(s is not None for s in starts)
        for start in starts:
            assert start is not None and set(start.parts) == set(WarmPart)
            assert start.parts[WarmPart.CUDA_INIT] > 0 and start.parts[WarmPart.CUDA_CONTEXT] > 0

        def start_rank(env: dict[str, str], log: str, channel_fd: int) -> Any:
            start = starts[int(env["RANK"])]
            assert start is not None
            return start(env, log, channel_fd)

        replica = Replica(0, 2, rf.load, str(tmp_path / "replica"), ONE_GPU,
                          Deadline.after(READY_S), start_rank=start_rank,
                          placement=ReplicaPlacement(2, (0, 0)))
        assert replica.wait_started(Deadline.after(READY_S)) == StartState.READY, \
            replica.failure
        assert replica.pids == [s.pid for s in starts if s is not None]
        assert [s.fallback for s in starts if s is not None] == ["", ""]

        def run(fn: Any, *args: Any) -> dict[int, Any]:
            assert replica is not None
            return replica.run({"fn": fn, "args": args, "kwargs": {}, "all": True},
                               time.monotonic(), Deadline.after(30.0))

        assert run(rf.placed_on) == {0: ("cuda:0", "nccl", "host0"),
                                     1: ("cuda:0", "nccl", "host1")}
        assert run(rf.forward, 2.0)[0] == rf.expected(2.0, 2)
    finally:
        if replica is not None:
            replica.close(Deadline.after(15.0))
        warm.close(Deadline.after(10.0))
