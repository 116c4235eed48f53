"""A ``rankguard.Pool`` whose replica is two NCCL ranks on GPU 0 (``devices=[0, 0]``: the pool
makes each a host of its own through ``NCCL_HOSTID``) serves an all_reduce request, and shows
where it runs (``python -m pytest -m gpu``). The same pool on the CPU is in
tests/serving/test_pool.py. Skipped without a CUDA GPU."""

from __future__ import annotations

from pathlib import Path

import rankguard
from rankguard.records import journal
from tests.gpu.nccl_ranks import GPU_SET, ONE_GPU
from tests.serving import rank_functions as rf

pytestmark = GPU_SET


def test_a_replica_of_two_nccl_ranks_sharing_gpu_0_serves_an_all_reduce(tmp_path: Path) -> None:
    log = tmp_path / "journal.jsonl"
    # cold CUDA and NCCL starts: 60 s to be ready, 30 s per call; each bounds its wait
    with rankguard.Pool(2, rf.load, devices=[0, 0], spares=0, timeout=30.0,
                        start_timeout=60.0, env=ONE_GPU, journal=str(log)) as pool:
        assert pool.run(rf.placed_on, all_ranks=True) == [("cuda:0", "nccl", "host0"),
                                                          ("cuda:0", "nccl", "host1")]
        assert pool.run(rf.forward, 2.0) == rf.expected(2.0, 2)
        assert pool.status().placement == {1: ("cuda:0", "cuda:0")}
    events = list(journal.read(str(log)))
    assert [e["backend"] for e in events if e["event"] == "pool_start"] == ["nccl"]
    assert [e["devices"] for e in events if e["event"] == "group_start"] == [["cuda:0"] * 2]
    assert not [e for e in events if e["event"] in ("request_fault", "group_start_failed")]
