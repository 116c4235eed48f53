"""The guardian ends its owner's marked processes once the owner is gone, however it went: a
clean close sweeps once, a SIGKILL or an exit without close sweeps, and so does an owner whose
fork still holds the guardian's pipe open."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from rankguard.processes import proctree
from rankguard.supervisor.guardian import SWEEP_S, Guardian
from tests.detached import gone_within

VAR = "RANKGUARD_TEST_GUARDED"
# the guardian's start (an interpreter) and its sweeps, on a loaded machine
GONE_WITHIN_S = SWEEP_S + 10.0

# The owner: starts a guardian, a marked `sleep` in a session of its own, then ends as `how`
# says, after printing the pids it started.
OWNER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from rankguard.supervisor.guardian import Guardian
    var, token, folder, how = sys.argv[1:]
    guardian = Guardian(var, token, [folder])
    marked = subprocess.Popen(["sleep", "300"], start_new_session=True,
                              env={**os.environ, var: token})
    holder = 0
    if how == "fork-holds-pipe":
        holder = os.fork()
        if holder == 0:  # unmarked, holding the guardian's pipe: the owner's pidfd ends it
            time.sleep(300)
            os._exit(0)
    print(marked.pid, holder, guardian._process.pid, flush=True)
    if how == "close":
        marked.kill()
        marked.wait()
        guardian.close()
        os._exit(0)
    if how == "sigkill":
        sys.stdin.read()  # the test kills this process
    os._exit(0)  # "exit", "fork-holds-pipe": no close
""")


@pytest.mark.parametrize("how", ["close", "exit", "sigkill", "fork-holds-pipe"])
def test_the_guardian_ends_the_marked_processes_and_removes_the_folder_when_its_owner_is_gone(
        tmp_path: Path, how: str) -> None:
    folder = tmp_path / "owned"
    folder.mkdir()
    token = uuid.uuid4().hex
    owner = subprocess.Popen([sys.executable, "-c", OWNER, VAR, token, str(folder), how],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    marked = holder = guardian = 0
    try:
        assert owner.stdout is not None
        marked, holder, guardian = map(int, owner.stdout.readline().split())
        if how == "sigkill":
            owner.kill()
        owner.wait(timeout=30)
        assert gone_within(marked, GONE_WITHIN_S), proctree.describe(marked)
        assert gone_within(guardian, GONE_WITHIN_S), proctree.describe(guardian)
        assert not folder.exists()
        if holder:
            assert proctree.alive(holder), "the guardian was not meant to kill the unmarked fork"
    finally:
        proctree.kill_all([pid for pid in (marked, holder, guardian) if pid])
        if owner.poll() is None:
            owner.kill()
        owner.wait(timeout=10)
        if owner.stdout is not None:
            owner.stdout.close()
        if owner.stdin is not None:
            owner.stdin.close()


def test_the_guardian_does_not_carry_the_marker_it_sweeps(tmp_path: Path) -> None:
    token = uuid.uuid4().hex
    os.environ[VAR] = token  # an owner whose own environment carries the marker
    try:
        guardian = Guardian(VAR, token)
        pid = guardian._process.pid  # type: ignore[union-attr]
        try:
            assert pid not in proctree.with_env(VAR, token)
        finally:
            guardian.close()
        assert gone_within(pid, GONE_WITHIN_S)
    finally:
        del os.environ[VAR]
