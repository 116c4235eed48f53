"""A rank's start-up (``runtime.bootstrap``, what ``rankguard run`` starts each rank as) that
cannot do what its environment asks says so in one line and exits 2, before the script runs:
never a traceback from deep inside."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("env, problem", [
    ({"RANKGUARD_STACKS": "{tmp}/gone/stacks_rank1.txt"},
     "rankguard: stacks_file: cannot open '{tmp}/gone/stacks_rank1.txt' for stack dumps"),
    ({"RANKGUARD_GLOO": "sometimes"}, "rankguard: RANKGUARD_GLOO='sometimes'"),
])
def test_a_start_up_it_cannot_make_is_one_line_and_exit_2(tmp_path: Path, env: dict[str, str],
                                                          problem: str) -> None:
    script = tmp_path / "never.py"
    script.write_text("print('the script ran')\n")
    env = {name: value.replace("{tmp}", str(tmp_path)) for name, value in env.items()}
    done = subprocess.run([sys.executable, "-m", "rankguard.runtime.bootstrap", str(script)],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(problem.replace("{tmp}", str(tmp_path))), done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "the script ran" not in done.stdout
