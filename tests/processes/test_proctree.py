"""``proctree.Tracking``: the processes started under a process, however they detached, in a
fresh Python process (a tracking changes the process that makes it: its cgroup, subreaper)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rankguard.processes import proctree
from tests.detached import CGROUP, DAEMON, SUBREAPER, gone_within

TRACK = '''
import json, os, subprocess, sys
from rankguard.processes import proctree

tracking = proctree.Tracking("test-" + os.urandom(6).hex())
subprocess.run([sys.executable, DAEMON, PIDFILE], check=True, timeout=30,
               stdout=subprocess.DEVNULL)
daemon = int(open(PIDFILE).read())
facts = {"held": daemon in tracking.processes(), "cgroup": tracking.cgroup,
         "in_cgroup": tracking.cgroup is not None
                      and daemon in proctree.cgroup_members(tracking.cgroup),
         "parent": open(f"/proc/{daemon}/stat").read().rsplit(")", 1)[1].split()[1],
         "me": os.getpid()}
tracking.close(kill=KILL)
facts["alive_after_close"] = proctree.alive(daemon)
facts["cgroup_left"] = tracking.cgroup is not None or (
    facts["cgroup"] is not None and os.path.exists(facts["cgroup"]))
facts["home_holds_it"] = daemon in proctree.cgroup_members(proctree.own_cgroup() or "/none")
print(json.dumps(facts))
'''


def _track(tmp_path: Path, env: dict[str, str], kill: bool) -> dict:
    pidfile = tmp_path / "daemon.pid"
    code = f"DAEMON, PIDFILE, KILL = {DAEMON!r}, {str(pidfile)!r}, {kill}\n" + TRACK
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], text=True,
                             capture_output=True, timeout=60, env={**os.environ, **env})
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)
    finally:
        if pidfile.exists():
            proctree.kill_all([int(pidfile.read_text())])


@pytest.mark.parametrize("env", [CGROUP, SUBREAPER])
def test_a_tracking_holds_a_detached_process_and_kills_it_when_closed(tmp_path, env):
    facts = _track(tmp_path, env, kill=True)
    assert facts["held"]
    assert not facts["alive_after_close"]
    assert not facts["cgroup_left"]
    if env:  # no cgroup: it is held as an orphan re-parented to the tracking process
        assert facts["cgroup"] is None and facts["parent"] == str(facts["me"])
    else:
        assert facts["in_cgroup"]


@pytest.mark.parametrize("env", [CGROUP])
def test_closing_a_tracking_without_kill_hands_survivors_back_and_removes_its_cgroup(
        tmp_path, env):
    facts = _track(tmp_path, env, kill=False)
    assert facts["in_cgroup"] and facts["alive_after_close"]
    assert facts["home_holds_it"] and not facts["cgroup_left"]



@pytest.mark.parametrize("env", [CGROUP])
def test_a_new_tracking_removes_the_empty_cgroups_that_killed_trackings_left(tmp_path, env):
    home = proctree.own_cgroup()
    assert home is not None
    stale = Path(home) / f"{proctree.CGROUP_PREFIX}stale-{os.urandom(4).hex()}"
    (stale / "nested").mkdir(parents=True)
    try:
        facts = _track(tmp_path, env, kill=True)
        assert facts["held"] and not stale.exists()
    finally:
        for folder in (stale / "nested", stale):
            if folder.exists():
                folder.rmdir()


def test_await_exits_wakes_on_the_exit_and_names_who_outlived_the_deadline() -> None:
    """Exits are events (pidfds): the wait ends when the last process ends, not at its deadline;
    a process still running at the deadline is returned."""
    from rankguard.deadline import Deadline

    quick = subprocess.Popen([sys.executable, "-c", "pass"])
    stays = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        limit = Deadline.after(120)
        assert proctree.await_exits([quick.pid], limit) == []
        assert not limit.passed()
        short = Deadline.after(0.2)
        assert proctree.await_exits([quick.pid, stays.pid], short) == [stays.pid]
        assert short.passed()
        stays.kill()
        assert proctree.await_exits([stays.pid], Deadline.after(120)) == []
    finally:
        for proc in (quick, stays):
            proc.kill()
            proc.wait(30)


def test_a_process_with_no_file_descriptor_left_still_signals_a_tree(tmp_path) -> None:
    """Looking up descendants reads /proc, which takes descriptors; a supervisor that has none
    left (a pool starved of them) must still kill the process and its group."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               start_new_session=True)
    hogs = []
    try:
        try:
            while True:
                hogs.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        proctree.signal_tree(sleeper.pid, 9)
    finally:
        for fd in hogs:
            os.close(fd)
        if sleeper.poll() is None:
            sleeper.kill()
    assert sleeper.wait(timeout=10) == -9
