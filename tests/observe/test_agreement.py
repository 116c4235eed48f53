"""For every kind of fault ``--inject`` performs, the launcher's summary, its journal,
``rankguard status`` and ``rankguard report`` give the same root cause (and, for a hang, the same
verdict), on real runs."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys

import pytest

from ..conftest import ROOT

KINDS = ["crash:3", "raise", "kill", "term", "stop", "hang", "gil:30", "slow:30"]


def _command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rankguard.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.slow
@pytest.mark.deadline(150)
@pytest.mark.parametrize("kind", KINDS)
def test_summary_journal_status_and_report_agree_on_the_root_cause(kind, run_rankguard) -> None:
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "2",
                         "--straggler-timeout", "4", "--grace", "2",
                         "--inject", f"{kind}:rank=1,at=op5", "examples/train.py",
                         "--steps", "30"], timeout=90)
    assert run.code in (1, 3), run.stderr[-3000:]
    said = run.stdout + run.stderr
    summary = re.search(r"^  root cause: (.*) \(attempt 0\)$", said, re.M)
    assert summary, said[-3000:]
    cause = summary.group(1)
    assert run.event("run_end")["root_cause"] == cause
    assert run.event("attempt_end")["root_cause"] == cause
    assert "rank 1" in cause, cause  # the injected rank is the one named
    status = _command("status", "--json", str(run.log_dir))
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["last_fault"] == cause
    made = _command("report", str(run.log_dir))
    assert made.returncode == 0, made.stderr
    page = (run.log_dir / "report.html").read_text()
    assert f'<p class="cause">root cause: {html.escape(cause)}</p>' in page
    hangs = [e for e in run.events if e["event"] == "hang_detected"]
    if hangs:
        verdict = hangs[0]["verdict"]
        assert f"    verdict: {verdict}" in said
        assert f'<p class="verdict">{html.escape(verdict)}</p>' in page
