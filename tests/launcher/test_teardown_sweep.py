"""The sweep after each attempt, and the guardian after a SIGKILLed launcher, also find the
processes that left the job the hard way: ``setsid env -i``, orphaned by a double fork (no
marker in their environment, in no rank's process tree)."""

import os
import signal
import time
from pathlib import Path

import pytest

from rankguard.processes import proctree
from tests.conftest import finish, launch
from tests.detached import CGROUP, DAEMON, SUBREAPER, gone_within


def _daemon_pid(pidfile: Path, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while not pidfile.exists():
        if time.monotonic() > deadline:
            pytest.fail("the rank did not start its daemon")
        time.sleep(0.05)
    return int(pidfile.read_text())


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.parametrize("env", [CGROUP, SUBREAPER])
def test_the_sweep_kills_and_journals_a_process_that_cleared_its_environment_and_detached(
        run_rankguard, tmp_path, env):
    pidfile = tmp_path / "daemon.pid"
    try:
        run = run_rankguard(["--nproc-per-node", "1", DAEMON,
                             str(pidfile)], env=env)
        pid = _daemon_pid(pidfile, 0)
        assert run.code == 0, run.stderr[-3000:]
        described = run.event("leftover")["processes"]
        assert any(d.startswith(f"pid {pid} (sleep)") and "sleep 1000" in d
                   for d in described), described
        assert gone_within(pid, 2.0)
    finally:
        if pidfile.exists():
            proctree.kill_all([int(pidfile.read_text())])


@pytest.mark.parametrize("env", [CGROUP])
def test_the_guardian_kills_a_detached_process_that_cleared_its_environment_after_sigkill(
        tmp_path, env):
    pidfile = tmp_path / "daemon.pid"
    log_dir = tmp_path / "logs"
    proc = launch(["--nproc-per-node", "1", DAEMON, str(pidfile), "600"],
                  log_dir, env=env)
    try:
        pid = _daemon_pid(pidfile)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        assert gone_within(pid, 10.0), proctree.describe(pid)
    finally:
        proctree.signal_tree(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            finish(proc, log_dir, 10, time.monotonic())
        if pidfile.exists():
            proctree.kill_all([int(pidfile.read_text())])
