"""Warm spares: restarts take ranks that already imported torch; a dead spare is replaced cold."""

import json
import os
import signal
import time

import pytest

from tests.conftest import finish, launch, script, text_now


def _wait_for_event(log_dir, name, timeout=60.0):
    path = log_dir / "journal.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in text_now(path).splitlines():
            event = json.loads(line)
            if event["event"] == name:
                return event
        time.sleep(0.05)
    pytest.fail(f"no {name!r} event within {timeout} s")


def _spares_ready(pids, timeout=60.0):
    """Until every spare has imported torch (it then sleeps reading stdin)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all("torch" in open(f"/proc/{pid}/maps").read() and
               open(f"/proc/{pid}/stat").read().split(") ")[1][0] == "S" for pid in pids):
            return
        time.sleep(0.1)
    pytest.fail("spares did not get ready")


@pytest.mark.slow  # each spare warms up as for training (2.2 s of imports a spare): 9 to 18 s
@pytest.mark.parametrize("fault", [None, signal.SIGKILL, signal.SIGSTOP])
def test_restart_takes_warm_spares_and_replaces_a_dead_or_stopped_one(tmp_path, fault):
    """A spare that died, or that is stopped (it would never join: peers waited for it until
    the hang timeout, and an in-place replacement until its limit, 96 s), is replaced cold."""
    log_dir = tmp_path / "logs"
    trigger = tmp_path / "crash-now"
    proc = launch(["--nproc-per-node", "2", "--max-restarts", "1", script("crash_on_file.py"),
                   str(trigger)], log_dir)
    started = time.monotonic()
    spares = _wait_for_event(log_dir, "spares")
    assert spares["started"] == 2 and len(spares["pids"]) == 2
    _spares_ready(spares["pids"])
    if fault is not None:
        os.kill(spares["pids"][0], fault)
    trigger.touch()
    run = finish(proc, log_dir, 90, started)
    assert run.code == 0, run.stderr[-3000:]
    restarted = [e for e in run.events if e["event"] == "rank_start" and e["attempt"] == 1]
    warm = {e["rank"]: e["warm"] for e in restarted}
    assert warm == ({0: False, 1: True} if fault else {0: True, 1: True})
    assert {e["pid"] for e in restarted if e["warm"]} <= set(spares["pids"])
    assert run.outcomes(1) == {0: "ok", 1: "ok"}
    assert "OK attempt=1" in run.stdout


@pytest.mark.slow
def test_no_spares_without_restarts_or_with_no_spares(run_rankguard):
    for args in ([], ["--max-restarts", "1", "--no-spares"]):
        run = run_rankguard(["--nproc-per-node", "2", *args, script("allreduce.py"), "30"])
        assert run.code == 0, run.stderr
        assert not [e for e in run.events if e["event"] == "spares"]
