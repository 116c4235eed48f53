"""Groups that libraries make and drive, watched through torch's Flight Recorder with no change
to the script: DistributedDataParallel's gradient bucket all-reduces (issued by its C++ reducer
on the default group) and a ``DeviceMesh``'s sub-groups. On CPU, gloo groups under
``RANKGUARD_GLOO=recorder`` take the path NCCL groups take; tests/gpu/test_nccl_library_groups.py
runs the same cases on NCCL.

``torch.distributed.split_group`` is not covered here: torch 2.13 splits only a default group
bound to an accelerator (``init_process_group(device_id=...)``, which refuses ``cpu``) whose
backend can split (NCCL, XCCL); on the CPU build it raises "No device associated with the
default pg". The GPU set covers it on NCCL."""

from __future__ import annotations

import re

import pytest

from tests.launcher.test_recorded_groups import HANG, RECORDER, job


@pytest.mark.slow  # 8 s; DDP stays quick in the bucket all_reduce case
def test_a_clean_ddp_job_trains_and_ends_well(run_rankguard):
    run = run_rankguard(job("ddp"), env=RECORDER)
    assert run.code == 0, run.stderr
    assert all(f"OK rank={r} backend=gloo" in run.stdout for r in range(2)), run.stdout
    # a straggler report (a busy rank absent past --hang-timeout 2 s: 4 ranks on a loaded
    # 2-core machine) is a warning the job survives; a hang verdict would kill it
    assert not [e for e in run.events if e["event"] == "hang_detected"]


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_a_rank_that_never_reaches_ddps_bucket_all_reduce_is_blamed_for_it(run_rankguard):
    at = 4
    run = run_rankguard(job("ddp", str(at)), env=RECORDER)
    assert run.code == 3, run.stderr
    # the world group's last collective before the step, as torch counts it on rank 0: DDP's
    # bucket all-reduce is the step's only collective, the next one
    before = re.search(rf"STEP rank=0 step={at} after=(\d+)", run.stdout)
    assert before, run.stdout
    seq = int(before.group(1)) + 1
    hang = run.event("hang_detected")
    assert (hang["blamed"], hang["op"], hang["seq"], hang["group"]) == \
        ([1], "all_reduce", seq, "world"), hang
    assert (f"rankguard: hang: rank 1 never enqueued all_reduce #{seq} (made no progress); "
            "rank 0 waited" in run.stderr), run.stderr
    assert HANG <= hang["waited_s"] < HANG + 3, hang


@pytest.mark.slow  # 7 s; a device mesh stays quick in its sub-group case
def test_a_clean_job_on_a_device_mesh_ends_well(run_rankguard):
    run = run_rankguard(job("mesh", nproc=4), env=RECORDER)
    assert run.code == 0, run.stderr
    assert all(f"OK rank={r} backend=gloo" in run.stdout for r in range(4)), run.stdout
    # a straggler report (a busy rank absent past --hang-timeout 2 s: 4 ranks on a loaded
    # 2-core machine) is a warning the job survives; a hang verdict would kill it
    assert not [e for e in run.events if e["event"] == "hang_detected"]


# mesh_alone: init_device_mesh makes the default group itself, through device_mesh's own
# import of init_process_group (its groups wrapped: the recorded ones are the "mesh" case's)
@pytest.mark.parametrize("scenario, env", [
    pytest.param("mesh", RECORDER, marks=pytest.mark.slow),  # 11 s here
    pytest.param("mesh_alone", {}, marks=pytest.mark.slow)])
def test_a_rank_that_never_enqueues_in_its_device_mesh_sub_group_is_named_with_it(
        run_rankguard, scenario, env):
    run = run_rankguard(job(scenario, "2", nproc=4), env=env)
    assert run.code == 3, run.stderr
    hang = run.event("hang_detected")
    # rank 1 stopped before its dp group's (ranks 1,3) all_reduce #2: rank 3 waits there; ranks
    # 0 and 2 wait a step later in their tp groups, a consequence, not the verdict
    assert (hang["blamed"], hang["waiting"], hang["op"], hang["seq"]) == \
        ([1], [3], "all_reduce", 2), hang
    # a recorded group's collective is enqueued; a wrapped one (gloo's default) is reached
    verb = "enqueued" if env else "reached"
    assert (f"rankguard: hang: rank 1 never {verb} all_reduce #2 on group ranks 1,3 (made no "
            "progress); rank 3 waited" in run.stderr), run.stderr
