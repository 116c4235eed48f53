"""Bounded collectives and notices on NCCL (``python -m pytest -m gpu``), with no change to
the script: rank 1 of a loop never enqueues all_reduce #51 while rank 0 waits for it in
``torch.cuda.synchronize()``. With ``--collective-timeout 3``, rank 0 raises
``rankguard.CollectiveTimeout`` naming rank 1 about 3 s into its wait (rankguard's thread
aborted the communicator), its GPU is usable after it, and ``rankguard.regroup()`` forms a new
NCCL group without rank 1 that all-reduces correctly. In bounded mode the launcher's notice
that rank 1 hung releases rank 0 the same way. Skipped without a CUDA GPU."""

from __future__ import annotations

import re

from tests.conftest import script
from tests.gpu.nccl_ranks import GPU_SET, ONE_GPU

pytestmark = GPU_SET

DEADLINE = 3.0
FLAGS = ["--collective-timeout", str(DEADLINE), "--hang-timeout", "60"]


def test_an_nccl_collective_past_its_deadline_raises_naming_the_missing_rank(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", *FLAGS, script("async_job.py"), "nccl",
                         "bounded", "51"], timeout=90, env=ONE_GPU)
    assert run.code == 3, run.stderr[-3000:]  # the rank it names is blamed for a hang
    assert ("CollectiveTimeout: rank 0: all_reduce #51 on group 'world' passed its deadline "
            "of 3 s" in run.stderr), run.stderr[-3000:]
    assert "ranks that had not arrived: 1 (rank 1 had enqueued collectives up to #50)" \
        in run.stderr, run.stderr[-3000:]
    hang = run.event("hang_detected")
    assert (hang["blamed"], hang["reason"]) == ([1], "collective_deadline"), hang


def test_after_an_nccl_deadline_the_survivors_regroup_on_the_gpu_and_all_reduce(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "3", *FLAGS, script("async_job.py"), "nccl",
                         "bounded_regroup", "51", "60"], timeout=120, env=ONE_GPU)
    print("\n".join(line for line in run.stdout.splitlines() if "CAUGHT" in line
                    or "REGROUPED" in line))
    assert run.code == 0, run.stderr[-3000:]
    for rank in (0, 2):
        caught = re.search(rf"CAUGHT rank={rank} missing=\[1\] after=([0-9.]+)", run.stdout)
        assert caught, run.stdout[-3000:]
        # raised once NCCL's abort returned: within the deadline, the probe and the abort
        assert DEADLINE <= float(caught.group(1)) < DEADLINE + 6, caught.group(0)
    for rank in (0, 1):
        assert f"REGROUPED rank={rank} size=2 sum=2" in run.stdout, run.stdout[-3000:]


def test_in_bounded_mode_the_launchers_notice_releases_an_nccl_rank_from_its_wait(
        run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", "--collective-timeout", "60", "--hang-timeout",
                         "3", "--grace", "20", script("async_job.py"), "nccl", "bounded", "51"],
                        timeout=90, env=ONE_GPU)
    assert run.code == 3, run.stderr[-3000:]
    assert run.event("hang_detected")["blamed"] == [1]
    assert ("PeerFailed: rank 0: all_reduce #51 on group 'world' was abandoned: the supervisor "
            "reported that rank 1 hung" in run.stderr), run.stderr[-3000:]
    # its communicator aborted, rank 0 left the GPU on its own: no SIGTERM, far within --grace
    assert not [e for e in run.events if e["event"] == "escalate" and e["step"] == "term"
                and 0 in e["ranks"]], run.stderr[-3000:]
