"""A run's Flight Recorder dumps, as ``rankguard flight-recorder`` gives them, read by torch's own
trace analyser (``python -m torch.distributed.flight_recorder.fr_trace``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def analyse(log_dir: Path, into: Path) -> str:
    """The run's dumps, written into ``into`` and analysed by torch's own trace analyser: what
    it printed."""
    dumped = subprocess.run([sys.executable, "-m", "rankguard.cli", "flight-recorder",
                             str(log_dir), "-o", str(into)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert dumped.returncode == 0, dumped.stderr
    analysed = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                               str(into)], capture_output=True, text=True, timeout=120)
    assert analysed.returncode == 0, analysed.stderr[-3000:]
    return analysed.stdout + analysed.stderr
