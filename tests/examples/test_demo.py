"""The README's demo: an injected hang, a verdict, a restart that resumes from the checkpoint."""

import pytest


@pytest.mark.slow
def test_demo_recovers_from_a_hang_and_resumes_from_its_checkpoint(run_rankguard, tmp_path):
    run = run_rankguard(["--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "2",
                         "--inject", "hang:rank=1,at=op40", "examples/train.py", "--steps", "50",
                         "--ckpt-dir", str(tmp_path / "ckpt")], timeout=120)
    assert run.code == 0, run.stderr[-3000:]
    hang = run.event("hang_detected")
    assert hang["blamed"] == [1] and hang["op"] == "all_reduce"
    assert "[rank0]:resumed from step 30" in run.stdout
    assert "done: 50 steps on 2 ranks" in run.stdout
    assert run.outcomes(1) == {0: "ok", 1: "ok"}
    assert "fault to first step of the restarted attempt" in run.stderr
    # where each rank was, grouped: the blamed rank in the injected hang, its peer elsewhere
    assert "      rank 1: perform (rankguard/inject/perform.py:" in run.stderr, run.stderr
    assert "examples/train.py:" in run.stderr.split("      rank 0: ")[1].splitlines()[0]
