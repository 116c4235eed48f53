"""The launcher's status line on a real terminal (a pseudo-terminal): drawn under the rank
output while the job runs, erased before every other line, gone before the summary; never drawn
with ``--no-tee`` or when stderr is not a terminal."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rankguard.processes import proctree
from tests.conftest import ROOT, launch

ERASE = b"\r\x1b[K"
RUN_S = 90.0


def _run_on_terminal(args: list[str], log_dir: Path, stdout: Path | None = None
                     ) -> tuple[int, bytes]:
    """``rankguard run ARGS`` with stdout (unless redirected to the file ``stdout``) and stderr
    on one pseudo-terminal; its exit code and every byte it wrote there."""
    master, slave = pty.openpty()
    cmd = [sys.executable, "-m", "rankguard.cli", "run", "--master-port", "0", "--log-dir",
           str(log_dir), *args]
    out = open(stdout, "wb") if stdout is not None else None  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=out if out is not None else slave, stderr=slave,
                            env={**os.environ, "TERM": "xterm"})
    if out is not None:
        out.close()
    os.close(slave)
    seen = bytearray()
    deadline = time.monotonic() + RUN_S
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        else:
            pytest.fail(f"rankguard run did not finish within {RUN_S} s:\n{seen[-3000:]!r}")
        return proc.wait(timeout=30), bytes(seen)
    finally:
        if proc.poll() is None:
            proctree.signal_tree(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        os.close(master)


def _screen_lines(raw: bytes) -> list[str]:
    """What the terminal shows at the end, line by line: ``\\r\\x1b[K`` erases the line so far."""
    lines = []
    for line in raw.replace(b"\r\n", b"\n").split(b"\n"):
        lines.append(line.split(ERASE)[-1].decode(errors="replace"))
    return lines


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_the_status_line_shows_the_attempt_and_the_furthest_collective_then_goes(tmp_path):
    code, raw = _run_on_terminal(["--nproc-per-node", "2", "examples/train.py", "--steps", "60",
                                  "--step-time", "0.05"], tmp_path / "run")
    assert code == 0, raw[-3000:]
    drawn = [part.split(b"\r")[0].split(b"\n")[0].decode(errors="replace")
             for part in raw.split(ERASE)[1:]]
    statuses = [text for text in drawn if text.startswith("rankguard: attempt 0 · ")]
    assert statuses, raw[-3000:]
    assert any("2/2 ranks running · all_reduce #" in text and "entered" in text
               for text in statuses), statuses
    screen = _screen_lines(raw)
    # nothing of the status line is left on screen: each was erased before the next output
    assert not [line for line in screen if line.startswith("rankguard: attempt 0 · ")], screen
    assert any(line.startswith("rankguard: run ") and "succeeded" in line for line in screen)


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_no_status_line_with_no_tee_or_off_a_terminal(tmp_path):
    code, raw = _run_on_terminal(["--no-tee", "--nproc-per-node", "2", "examples/train.py",
                                  "--steps", "20"], tmp_path / "quiet")
    assert code == 0 and ERASE not in raw, raw[-3000:]
    proc = launch(["--nproc-per-node", "2", "examples/train.py", "--steps", "20"],
                  tmp_path / "piped")
    out, err = proc.communicate(timeout=RUN_S)
    assert proc.returncode == 0 and "\x1b[K" not in out + err, err[-3000:]


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_stdout_redirected_to_a_file_gets_no_terminal_codes(tmp_path):
    """The status line lives on stderr's terminal: a stdout redirected to a file keeps the rank
    output byte for byte, and the terminal's status line is still erased before each line."""
    code, raw = _run_on_terminal(["--nproc-per-node", "2", "examples/train.py", "--steps", "60",
                                  "--step-time", "0.05"], tmp_path / "run",
                                 stdout=tmp_path / "out.txt")
    assert code == 0, raw[-3000:]
    kept = (tmp_path / "out.txt").read_bytes()
    assert b"\x1b" not in kept and b"\r" not in kept and b"[rank0]:step 0 loss" in kept
    assert ERASE in raw
    screen = _screen_lines(raw)
    assert not [line for line in screen if line.startswith("rankguard: attempt 0 · ")], screen
