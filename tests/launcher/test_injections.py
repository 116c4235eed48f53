"""An injected fault whose moment never came is said, in the summary and the journal, on real
runs: a run that "succeeded" without its fault tested nothing. The exit code stays the
scripts'. Which spec is reported, for every combination, is table-tested in
test_injection_rules.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import ROOT, Run, script

STEPS = 20  # the all-reduces allreduce.py issues


def _never_fired(run: Run) -> list[dict[str, Any]]:
    return [e for e in run.events if e["event"] == "injection_never_fired"]


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_a_step_fault_in_a_script_without_step_loop_is_said_never_to_have_fired(
        run_rankguard: Any) -> None:
    run = run_rankguard(["--nproc-per-node", "2", "--inject", "kill:rank=0,at=step5",
                         script("allreduce.py"), str(STEPS), "0"])
    assert run.code == 0, run.stderr  # a report, not a failure
    said = (f"injection kill:rank=0,at=step5 never fired (in attempt 0, rank 0 reached op "
            f"{STEPS} and no rankguard.StepLoop step)")
    lines = run.stderr.splitlines()
    result = next(i for i, line in enumerate(lines) if "succeeded after 1 attempt" in line)
    assert lines[result + 1] == f"  {said}", run.stderr  # right under the result
    (event,) = _never_fired(run)
    assert event == {**event, "injection": "kill:rank=0,at=step5", "rank": 0, "attempt": 0,
                     "step": None, "op": STEPS, "message": said}


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_a_fault_that_fired_is_not_reported_and_one_cut_short_by_it_is(
        run_rankguard: Any) -> None:
    run = run_rankguard(["--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "3",
                         "--inject", "crash:rank=1,at=op5", "--inject", "kill:rank=0,at=op500",
                         script("allreduce.py"), str(STEPS), "0"])
    assert run.code == 0, run.stderr  # attempt 1 has no fault
    (event,) = _never_fired(run)
    assert (event["injection"], event["attempt"]) == ("kill:rank=0,at=op500", 0)
    assert 0 < event["op"] < STEPS, event  # rank 0 was stopped early in attempt 0
    assert f"  {event['message']}" in run.stderr.splitlines()
    assert "crash:rank=1,at=op5 never fired" not in run.stderr


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_in_place_a_replaced_ranks_fault_counts_and_a_step_past_the_loop_is_said(
        run_rankguard: Any) -> None:
    steps = 12
    run = run_rankguard(["--nproc-per-node", "3", "--hang-timeout", "3", "--max-restarts", "1",
                         "--recovery", "in-place", "--inject", "kill:rank=1,at=step3",
                         "--inject", f"kill:rank=2,at=step{steps}",
                         str(ROOT / "examples" / "train_inplace.py"), "--steps", str(steps),
                         "--width", "16"], timeout=180)
    assert run.code == 0, run.stderr[-4000:]
    assert [e["rank"] for e in run.events if e["event"] == "replaced"] == [1]
    (event,) = _never_fired(run)  # rank 1's first process fired its fault, then was replaced
    assert (event["injection"], event["step"]) == (f"kill:rank=2,at=step{steps}", steps - 1)
    assert f"  {event['message']}" in run.stderr.splitlines()
