"""Hang verdicts on NCCL under ``rankguard run`` (``python -m pytest -m gpu``), with no change
to the script: two NCCL ranks on GPU 0; rank 1 holds up all_reduce #51 of a loop in which
the other rank keeps enqueueing. The launcher names rank 1 and the all_reduce from what torch's
Flight Recorder counted in each rank (published in the ledger by the rank's sampler), within
``--hang-timeout`` + 2 s: (a) rank 1 asleep in Python never enqueued it; (b) rank 1 enqueued it
but its GPU, stuck in a kernel, never started it (with ``TORCH_NCCL_ENABLE_TIMING=1``; without,
the collective is stuck on every rank). In (a), ``rankguard flight-recorder`` gives torch's own
dumps of every rank, and torch's analyser names rank 1 as missing. Skipped without a CUDA GPU."""

from __future__ import annotations

import re

import pytest

from tests.conftest import script
from tests.observe import fr_dumps
from tests.gpu.nccl_ranks import GPU_SET, ONE_GPU

pytestmark = GPU_SET

HANG = 3.0
BOUND_S = HANG + 2.0  # issue 29: a verdict within --hang-timeout + 2 s of the fault


def nccl_job(*args: str, nproc: int = 2, backend: str = "nccl") -> list[str]:
    """``rankguard run`` arguments for ``async_job.py BACKEND ARGS...`` on ``nproc`` ranks."""
    return ["--nproc-per-node", str(nproc), "--hang-timeout", str(HANG),
            script("async_job.py"), backend, *args]


def assert_blamed(run, verdict: str) -> dict:
    """Rank 1 was blamed for a hang within ``BOUND_S`` of the fault, in these words (after
    ``rankguard: hang: ``); returns the journal's event."""
    assert run.code == 3, run.stderr[-3000:]
    hang = run.event("hang_detected")
    assert hang["blamed"] == [1], hang
    assert f"rankguard: hang: {verdict}" in run.stderr, run.stderr[-3000:]
    detected = float(re.search(r"detected in ([0-9.]+) s", run.stderr).group(1))
    print(f"{hang['verdict']}; detected in {detected:.2f} s")
    assert detected <= BOUND_S, run.stderr[-3000:]
    return hang


TIMING = {"TORCH_NCCL_ENABLE_TIMING": "1"}  # the user's opt-in: see README, "NCCL"


@pytest.mark.parametrize("scenario, env, verdict", [
    ("sleep", {}, "rank 1 never enqueued all_reduce #51 (made no progress); rank 0 waited"),
    ("gpu_stuck", TIMING, "rank 1 enqueued all_reduce #51 on group world but its GPU never "
                          "started it: a kernel before it is stuck; rank 0 waited"),
])
def test_the_rank_that_held_up_an_nccl_all_reduce_is_named_within_the_hang_timeout(
        run_rankguard, scenario, env, verdict):
    run = run_rankguard(nccl_job(scenario, "51"), timeout=90, env={**ONE_GPU, **env})
    hang = assert_blamed(run, verdict)
    assert (hang["op"], hang["seq"]) == ("all_reduce", 51), hang
    if scenario == "sleep":  # torch's own dumps of every rank name the rank that never came
        found = fr_dumps.analyse(run.log_dir, run.log_dir / "fr")
        assert "Not all ranks joining collective, sequence number: 51" in found, found[-3000:]
        assert "missing ranks: {1}" in found, found[-3000:]


def test_without_timing_a_gpu_stuck_before_a_collective_is_a_stuck_collective(run_rankguard):
    run = run_rankguard(nccl_job("gpu_stuck", "51"), timeout=90, env=ONE_GPU)
    assert run.code == 3, run.stderr[-3000:]
    assert ("ranks 0,1 enqueued all_reduce #51 on group world but none completed it (whether a "
            "GPU started it is not known: TORCH_NCCL_ENABLE_TIMING is off)" in run.stderr), \
        run.stderr[-3000:]


def test_a_rank_that_never_enqueues_in_an_nccl_sub_group_is_named_with_the_group(
        run_rankguard):
    run = run_rankguard(nccl_job("subgroup", "4", nproc=3), timeout=90, env=ONE_GPU)
    assert run.code == 3, run.stderr[-3000:]
    assert run.event("hang_detected")["blamed"] == [1]
    assert ("rank 1 never enqueued all_reduce #4 on group ranks 0,1 (made no progress)"
            in run.stderr), run.stderr[-3000:]


def test_a_clean_nccl_job_with_sub_groups_steps_and_ends_well(run_rankguard):
    run = run_rankguard(nccl_job("clean", nproc=3), timeout=90, env=ONE_GPU)
    assert run.code == 0, run.stderr[-3000:]
    assert all(f"OK rank={r} backend=nccl" in run.stdout for r in range(3)), run.stdout
    assert not [e for e in run.events if e["event"] in ("hang_detected", "straggler")]
