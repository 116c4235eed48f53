"""Shared fixtures: run the real launcher under a deadline, and prove no process is left behind.

Every test gets a fresh ``RANKGUARD_TEST_ID`` in the environment of whatever it starts; after the
test, any live process that carries it is reported, killed, and fails the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rankguard.records import journal
from rankguard.processes import proctree
from rankguard.deadline import Deadline

# Every process the tests start imports rankguard: with this variable (set on the machines these
# tests run on, rarely on a user's) each one compiled its modules again (0.13 s of CPU each).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).parent.parent
TEST_ID_VAR = "RANKGUARD_TEST_ID"


def wait_until_gone(test_id: str, timeout: float) -> list[int]:
    """Processes tagged with ``test_id`` still alive after up to ``timeout`` s of waiting (on
    their pidfds; a process that a tagged one starts meanwhile is found by the last look)."""
    limit = Deadline.after(timeout)
    left = proctree.with_env(TEST_ID_VAR, test_id)
    while left and not limit.passed():
        proctree.await_exits(left, limit)
        again = proctree.with_env(TEST_ID_VAR, test_id)
        if set(again) == set(left):  # ended, not yet reaped by their parent: look again soon
            time.sleep(limit.wait_time(0.02))
        left = again
    return left


@pytest.fixture(autouse=True)
def no_leftover_processes(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Tag the test's processes; after it, none may be alive (a short settle is allowed)."""
    test_id = uuid.uuid4().hex
    monkeypatch.setenv(TEST_ID_VAR, test_id)
    yield
    left = wait_until_gone(test_id, 3.0)
    if left:
        described = [proctree.describe(pid) for pid in left]
        proctree.kill_all(left)
        pytest.fail(f"processes left behind: {described}")


@dataclass
class Run:
    """A finished ``rankguard run``."""

    code: int
    stdout: str
    stderr: str
    wall_s: float
    log_dir: Path

    @property
    def events(self) -> list[dict[str, Any]]:
        path = self.log_dir / "journal.jsonl"
        return list(journal.read(str(path))) if path.exists() else []

    def event(self, name: str) -> dict[str, Any]:
        found = [e for e in self.events if e["event"] == name]
        assert found, f"no {name!r} event in the journal; stderr:\n{self.stderr[-3000:]}"
        return found[0]

    def outcomes(self, attempt: int = 0) -> dict[int, str]:
        return {e["rank"]: e["outcome"] for e in self.events
                if e["event"] == "rank_exit" and e["attempt"] == attempt}


def launch(args: list[str], log_dir: Path, timeout: float = 60.0,
           env: dict[str, str] | None = None, stdout: Any = subprocess.PIPE,
           stderr: Any = subprocess.PIPE, wrap: list[str] | None = None) -> subprocess.Popen[str]:
    """Start ``rankguard run`` with a free port and ``log_dir``; the caller must finish it.
    Its stdout and stderr are pipes unless given (a file, DEVNULL); ``wrap``: a command prefix
    that execs it (``ip netns exec NS``: the same process)."""
    cmd = [*(wrap or []), sys.executable, "-m", "rankguard.cli", "run", "--master-port", "0",
           "--log-dir", str(log_dir), *args]
    return subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True,
                            cwd=str(ROOT), env={**os.environ, **(env or {})},
                            start_new_session=True)


def finish(proc: subprocess.Popen[str], log_dir: Path, timeout: float, started: float,
           what: str = "rankguard run") -> Run:
    """Wait for a launcher under a hard deadline; on expiry kill its whole tree and fail."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proctree.signal_tree(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=10)
        pytest.fail(f"{what} did not finish within {timeout} s; stderr:\n{err[-3000:]}")
    return Run(proc.returncode, out, err, time.monotonic() - started, log_dir)


@pytest.fixture
def run_rankguard(tmp_path: Path) -> Any:
    """``run_rankguard(args, timeout=60)`` runs the launcher to the end and returns a Run."""
    counter = iter(range(1000))

    def run(args: list[str], timeout: float = 60.0, env: dict[str, str] | None = None) -> Run:
        log_dir = tmp_path / f"run{next(counter)}"
        started = time.monotonic()
        return finish(launch(args, log_dir, timeout, env), log_dir, timeout, started)

    return run


def text_now(path: Path) -> str:
    """``path``'s text, "" while it does not exist: a launcher's check of its ``--journal``
    creates the file and removes it again before its run writes it."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def script(name: str) -> str:
    return str(SCRIPTS / name)
