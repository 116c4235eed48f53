"""A rank stopped by a ``rankguard.UsageError`` (a mistake of the script, the same in every
process) is neither replaced in place nor restarted: the run ends at once with the rank's
error, named in the result and in ``rankguard report``.

The script is ``tests/scripts/step_loop_bugs.py usage``: rank 1 calls ``rankguard.regroup``
with a bad argument at step 10 of its ``rankguard.StepLoop``, in every process it runs in; and
``examples/train_inplace.py`` given an argument its argparse refuses (``SystemExit(2)``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import ROOT, script

ROOT_CAUSE = ("rank 1 stopped on a usage error: rankguard.regroup(keep_size): expected True or "
              "False, got 'yes'; not restarted (fix the script)")


@pytest.mark.slow
@pytest.mark.deadline(150)
@pytest.mark.parametrize("recovery", ["in-place", "restart"])
def test_a_usage_error_ends_the_run_without_a_replacement_or_a_restart(
        run_rankguard: Any, recovery: str) -> None:
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "3", "--max-restarts", "3",
                         "--recovery", recovery, script("step_loop_bugs.py"), "usage"],
                        timeout=120)
    assert run.code == 1, run.stderr[-4000:]
    names = [e["event"] for e in run.events]
    assert "replace" not in names and "restart" not in names, names
    assert run.event("run_end")["root_cause"] == ROOT_CAUSE, run.stderr[-3000:]
    assert f"root cause: {ROOT_CAUSE} (attempt 0)" in run.stderr
    assert run.outcomes(0) == {0: "victim", 1: "usage_error"}
    if recovery == "in-place":
        (refused,) = [e for e in run.events if e["event"] == "replace_refused"]
        assert "usage error" in refused["reason"], refused
    page = run.log_dir / "report.html"
    made = subprocess.run([sys.executable, "-m", "rankguard.cli", "report", "-o", str(page),
                           str(run.log_dir)], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert "rank 1 stopped on a usage error: rankguard.regroup(keep_size)" in page.read_text()


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_arguments_that_argparse_refuses_end_the_run_without_a_restart(run_rankguard: Any
                                                                       ) -> None:
    run = run_rankguard(["--nproc-per-node", "2", "--max-restarts", "3",
                         str(ROOT / "examples" / "train_inplace.py"), "--bogus"], timeout=90)
    assert run.code == 1, run.stderr[-4000:]
    assert "restart" not in [e["event"] for e in run.events]
    root = run.event("run_end")["root_cause"]
    assert re.fullmatch(r"rank [01] stopped on a usage error: train_inplace.py: error: "
                        r"unrecognized arguments: --bogus; not restarted \(fix the script\)",
                        root), root
