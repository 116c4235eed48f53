"""NCCL groups that libraries and torch features make, under ``rankguard run`` with no change to
the script (``python -m pytest -m gpu``): DistributedDataParallel's bucket all-reduces on the
default group, a ``split_group`` sub-group, a mixed ``cpu:gloo,cuda:nccl`` default group (a hang
in either half), and an all_reduce captured in a CUDA graph and replayed. Two NCCL ranks on GPU
0, each a host of its own through ``NCCL_HOSTID``. The same DDP and sub-group cases run on CPU in
tests/launcher/test_library_groups.py. Skipped without a CUDA GPU."""

from __future__ import annotations

import re

from tests.gpu.nccl_ranks import GPU_SET, ONE_GPU
from tests.gpu.test_nccl_verdicts import assert_blamed, nccl_job

pytestmark = GPU_SET

MIXED = "cpu:gloo,cuda:nccl"


def assert_clean(run) -> None:
    """The job ended well on both ranks, its backend still NCCL, with no verdict."""
    assert run.code == 0, run.stderr[-3000:]
    for rank in (0, 1):
        assert f"OK rank={rank} backend=nccl" in run.stdout, run.stdout[-2000:]
    assert not [e for e in run.events if e["event"] in ("hang_detected", "straggler")]


def test_a_clean_ddp_job_on_nccl_trains_and_ends_well(run_rankguard):
    assert_clean(run_rankguard(nccl_job("ddp"), timeout=90, env=ONE_GPU))


def test_a_rank_that_never_reaches_ddps_bucket_all_reduce_on_nccl_is_blamed_for_it(
        run_rankguard):
    at = 4
    run = run_rankguard(nccl_job("ddp", str(at)), timeout=90, env=ONE_GPU)
    # the step's only collective is DDP's bucket all-reduce: the next one torch numbers
    before = re.search(rf"STEP rank=0 step={at} after=(\d+)", run.stdout)
    assert before, run.stdout[-3000:]
    seq = int(before.group(1)) + 1
    hang = assert_blamed(run, f"rank 1 never enqueued all_reduce #{seq} (made no progress); "
                              "rank 0 waited")
    assert (hang["op"], hang["seq"], hang["group"]) == ("all_reduce", seq, "world"), hang


def test_a_rank_that_never_enqueues_in_a_split_group_is_named_with_the_group(run_rankguard):
    assert_blamed(run_rankguard(nccl_job("split", "4"), timeout=90, env=ONE_GPU),
                  "rank 1 never enqueued all_reduce #4 on group ranks 0,1 (made no progress)")


def test_in_a_mixed_group_a_cuda_all_reduce_hang_is_named_and_cpu_all_reduces_work(
        run_rankguard):
    at = 5
    run = run_rankguard(nccl_job("mixed", str(at), backend=MIXED), timeout=90, env=ONE_GPU)
    assert_blamed(run, f"rank 1 never enqueued all_reduce #{at} (made no progress); rank 0 "
                       "waited")
    # the gloo half: every CPU all_reduce up to the GPU one rank 1 never reached was summed
    for rank in (0, 1):
        for step in range(1, at + 1):
            assert f"CPU rank={rank} step={step} sum=2" in run.stdout, run.stdout[-3000:]


def test_in_a_mixed_group_a_rank_that_never_reaches_a_cpu_all_reduce_is_named(run_rankguard):
    """The gloo half of the default group publishes in a slot of its own (``world/gloo``):
    before, nothing was pending in the NCCL half and no verdict came."""
    at = 5
    run = run_rankguard(nccl_job("mixed_cpu", str(at), backend=MIXED), timeout=90, env=ONE_GPU)
    hang = assert_blamed(run, f"rank 1 never enqueued all_reduce #{at} on group world/gloo "
                              "(made no progress)")
    assert (hang["op"], hang["seq"], hang["group"]) == ("all_reduce", at, "world/gloo"), hang


def test_an_all_reduce_captured_in_a_cuda_graph_replays_correctly_under_rankguard(
        run_rankguard):
    replays = 10
    run = run_rankguard(nccl_job("graph", str(replays)), timeout=90, env=ONE_GPU)
    assert_clean(run)
    # each replay doubled the tensor on 2 ranks (the script checks every element)
    assert f"replays={replays} value={2 ** replays}" in run.stdout, run.stdout[-2000:]
