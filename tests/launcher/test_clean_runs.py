"""Runs without faults: torchrun's environment, instrumentation, exit code 0."""

import pytest

from tests.conftest import script


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_two_ranks_run_to_success_with_torchrun_environment(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", script("allreduce.py"), "5"])
    assert run.code == 0, run.stderr
    for rank in (0, 1):
        assert f"[rank{rank}]:OK rank={rank} backend=gloo local_rank={rank} world=2 restart=0" \
            in run.stdout
    assert run.outcomes() == {0: "ok", 1: "ok"}
    end = run.event("run_end")
    assert (end["status"], end["exit_code"], end["root_cause"]) == ("succeeded", 0, None)
    assert run.event("first_step")["since_start_s"] > 0


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_collectives_reach_the_ledger_including_ddp_from_cpp(run_rankguard, tmp_path):
    # A DDP step issues its gradient all-reduce from C++; the attempt's first_step event needs
    # every rank's ledger to show init plus at least one completed collective.
    run = run_rankguard(["--nproc-per-node", "2", "examples/train.py", "--steps", "3",
                         "--ckpt-every", "100", "--ckpt-dir", str(tmp_path / "ckpt")])
    assert run.code == 0, run.stderr
    assert "done: 3 steps on 2 ranks" in run.stdout
    run.event("first_step")


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_module_mode_runs_a_module(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "1", "-m", "tests.scripts.allreduce", "2"])
    assert run.code == 0, run.stderr
    assert "OK rank=0 backend=gloo" in run.stdout


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_rank_output_is_kept_in_the_log_dir(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", "--no-tee", script("allreduce.py"), "2"])
    assert run.code == 0
    assert "[rank" not in run.stdout
    assert "OK rank=1" in (run.log_dir / "attempt0" / "rank1.log").read_text()


@pytest.mark.slow
def test_script_that_never_destroys_its_group_exits_cleanly(run_rankguard):
    # Works still tracked at interpreter exit must not make gloo abort the rank (SIGABRT).
    run = run_rankguard(["--nproc-per-node", "2", script("allreduce.py"), "3000", "0", "keep"])
    assert run.code == 0, run.stderr[-2000:]
    assert run.outcomes() == {0: "ok", 1: "ok"}


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_default_group_destroyed_and_formed_again_is_no_hang(run_rankguard):
    # Each default group formed in the launcher's store had the same keys: rank 0's new gloo
    # group read rank 1's old address while rank 1 still held its old group, and hung in its
    # connect (blamed as a hang, exit 3) or failed in its first all-reduce; torchrun runs it
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "5",
                         script("reinit_world.py")], timeout=90)
    assert run.code == 0, run.stderr[-2000:]
    assert all(f"PHASE 4 DONE rank={r}" in run.stdout for r in (0, 1)), run.stdout
    assert run.outcomes() == {0: "ok", 1: "ok"}
