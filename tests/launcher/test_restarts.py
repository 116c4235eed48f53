"""Restarts: each attempt on its own store namespace, so many restarts in a row all work."""

import pytest

from tests.conftest import script


@pytest.mark.slow
@pytest.mark.deadline(300)  # 10 restarts: up to ~60 s on a loaded 2-core machine
def test_ten_restarts_in_a_row_all_form_a_working_group(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", "--max-restarts", "10",
                         script("restart_until.py"), "10"], timeout=280)
    assert run.code == 0, run.stderr[-3000:]
    attempts = [e["attempt"] for e in run.events if e["event"] == "attempt_start"]
    assert attempts == list(range(11))
    # every attempt, restarted ones included, completed collectives on every rank
    stepped = [e["attempt"] for e in run.events if e["event"] == "first_step"]
    assert stepped == list(range(11))
    for attempt in range(10):
        assert run.outcomes(attempt) == {0: "victim", 1: "exited"}
    assert run.outcomes(10) == {0: "ok", 1: "ok"}
    assert "OK attempt=10" in run.stdout


@pytest.mark.slow  # the quick set keeps restarts that succeed (above, test_spares)
def test_restarts_run_out_with_the_first_fault_as_root_cause(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", "--max-restarts", "1", "--inject",
                         "crash:4:rank=0,at=op2,attempt=any", script("allreduce.py"), "10"])
    assert run.code == 1
    assert [e["attempt"] for e in run.events if e["event"] == "restart"] == [1]
    assert run.event("run_end")["root_cause"] == "rank 0 exited with code 4"
