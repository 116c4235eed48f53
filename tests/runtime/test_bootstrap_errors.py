"""How a rank's start-up (``runtime.bootstrap``) records the end of a script that failed: a
usage error (a ``rankguard.UsageError``, or argparse's refusal of the script's arguments) is
recorded in the rank's ledger with its message, so that the launcher neither replaces nor
restarts the rank; any other end is recorded as before. Real processes, a real ledger."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankguard.records import ledger

CALLABLES = "StepLoop: get_state and load_state must be callables"
# the script, its arguments, then (fault, error kind, text, exit code) as the ledger holds them
CASES: dict[str, tuple[str, list[str], tuple[int, ledger.ErrorKind, str, int]]] = {
    "a rankguard.UsageError that reaches the top is a usage error, with its message": (
        "import rankguard\nrankguard.StepLoop(1, 2)\n", [],
        (ledger.FAULT_RAISED, ledger.ErrorKind.USAGE, CALLABLES, 0)),
    "an error raised from a rankguard.UsageError is one too": (
        "import rankguard\ntry:\n    rankguard.StepLoop(1, 2)\nexcept rankguard.UsageError as e:"
        "\n    raise RuntimeError('setup failed') from e\n", [],
        (ledger.FAULT_RAISED, ledger.ErrorKind.USAGE, CALLABLES, 0)),
    "an error raised while a rankguard.UsageError was handled may have any cause": (
        "import rankguard\ntry:\n    rankguard.StepLoop(1, 2)\nexcept rankguard.UsageError:"
        "\n    raise RuntimeError('cleanup failed')\n", [],
        (ledger.FAULT_RAISED, ledger.ErrorKind.OTHER, "", 0)),
    "any other exception is recorded as before": (
        "raise ValueError('a bug')\n", [], (ledger.FAULT_RAISED, ledger.ErrorKind.OTHER, "", 0)),
    "argparse's refusal of the arguments is a usage error, with argparse's message": (
        "import argparse\nargparse.ArgumentParser(prog='train.py').parse_args()\n", ["--bogus"],
        (ledger.FAULT_EXITING, ledger.ErrorKind.USAGE,
         "train.py: error: unrecognized arguments: --bogus", 2)),
    "a script's own sys.exit(2) is an exit code, not a usage error": (
        "import sys\nsys.exit(2)\n", [], (ledger.FAULT_EXITING, ledger.ErrorKind.OTHER, "", 2)),
}


@pytest.mark.parametrize("case", CASES)
def test_the_ledger_says_whether_a_usage_error_ended_the_script(tmp_path: Path,
                                                                case: str) -> None:
    text, args, expected = CASES[case]
    script = tmp_path / "script.py"
    script.write_text(text)
    path = str(tmp_path / "rank0.ledger")
    ledger.create(path, world_size=1)
    done = subprocess.run([sys.executable, "-m", "rankguard.runtime.bootstrap", str(script),
                           *args], env={**os.environ, ledger.PATH_ENV: path},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == (expected[3] or 1), done.stderr
    reader = ledger.LedgerReader(path)
    try:
        snap = reader.read()
    finally:
        reader.close()
    assert (snap.fault, snap.error, snap.error_text, snap.exit_code) == expected, done.stderr
