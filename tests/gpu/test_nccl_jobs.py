"""NCCL jobs under ``rankguard run`` on a real GPU (``python -m pytest -m gpu``): every rank on
GPU 0, each a host of its own through ``NCCL_HOSTID``, over sockets on loopback. Skipped with
the reason where there is no CUDA GPU (CI)."""

from __future__ import annotations

from tests.conftest import script
from tests.gpu.nccl_ranks import GPU_SET, ONE_GPU

pytestmark = GPU_SET


def test_a_fault_free_nccl_job_runs_under_rankguard_run_and_keeps_its_backend(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "10",
                         script("nccl_allreduce.py"), "50"], timeout=90, env=ONE_GPU)
    assert run.code == 0, run.stderr[-3000:]
    for rank in (0, 1):
        assert f"OK rank={rank} backend=nccl" in run.stdout, run.stdout[-2000:]
    assert not [e for e in run.events if e["event"] in ("hang_detected", "straggler")]
    assert run.outcomes() == {0: "ok", 1: "ok"}


def test_a_sigkilled_nccl_rank_ends_the_job_naming_it(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "10", "--inject",
                         "kill:rank=1,at=8s", script("nccl_allreduce.py"), "100000"],
                        timeout=90, env=ONE_GPU)
    assert run.code == 1, run.stderr[-3000:]
    assert run.event("run_end")["root_cause"].startswith("rank 1 "), run.stderr[-3000:]
    assert run.outcomes()[1] == "signalled"
