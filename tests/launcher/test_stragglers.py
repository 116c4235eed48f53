"""A rank that waits on something outside its own process is a straggler, never blamed as hung
within --hang-timeout: a busy child, a child that sleeps, a child whose output it reads, an
HTTP server that answers late. And watching a hang (stack requests, as ``rankguard stacks``
sends them) never hides it. Real ranks, real children, a real HTTP server.

(The rule is table-tested in test_progress_rules.py, /proc's view of each wait in
tests/processes/test_proc_waits.py.)"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import ROOT, finish, launch, script

HANG = 2.0
WAIT_S = 3 * HANG  # rank 0 is away three hang timeouts: blamed at one if judged frozen


@pytest.fixture
def late_server() -> Iterator[str]:
    """An HTTP server on loopback that answers each request after WAIT_S seconds."""

    class Late(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(WAIT_S)
            self.send_response(200)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"late")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Late)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("kind, doing", [
    pytest.param("sleep_child", "waits for child", marks=pytest.mark.slow),
    pytest.param("url", "socket to 127.0.0.1:", marks=pytest.mark.slow),  # 14 s here
    pytest.param("busy_child", "busy: ", marks=pytest.mark.slow),
    pytest.param("captured_child", "pipe from child", marks=pytest.mark.slow),
    pytest.param("poll", "polls (clock_nanosleep", marks=pytest.mark.slow),
    pytest.param("fifo", "openat of /", marks=pytest.mark.slow),
])
def test_a_rank_waiting_outside_the_job_is_a_straggler_not_hung(run_rankguard, late_server,
                                                                kind, doing):
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", str(HANG),
                         script("waits_outside.py"), kind, str(WAIT_S), late_server])
    assert run.code == 0, run.stderr
    assert "rank 0 done" in run.stdout and "rank 1 done" in run.stdout
    assert not [e for e in run.events if e["event"] == "hang_detected"]
    straggler = run.event("straggler")
    assert straggler["ranks"] == [0]
    assert "rankguard: straggler: rank 0 never reached barrier #2 (busy" in run.stderr
    assert doing in run.stderr, run.stderr


@pytest.mark.slow  # 7 s; the stacks of a hung rank stay quick in test_faults
def test_asking_a_hung_rank_for_its_stacks_again_and_again_does_not_hide_the_hang(tmp_path):
    hang = 3.0
    log_dir = tmp_path / "run"
    started = time.monotonic()
    proc = launch(["--nproc-per-node", "3", "--hang-timeout", str(hang), "--inject",
                   "hang:rank=1,at=op5", script("allreduce.py"), "400", "0.01"], log_dir)
    asked = 0
    while proc.poll() is None and time.monotonic() - started < 60:
        # what a person or a dashboard polling `rankguard stacks RUN` does, every second
        subprocess.run([sys.executable, "-m", "rankguard.cli", "stacks", str(log_dir),
                        "--timeout", "1"], cwd=str(ROOT), capture_output=True, timeout=30)
        asked += 1
        time.sleep(1.0)
    run = finish(proc, log_dir, 30, started)
    assert run.code == 3, run.stderr
    hang_event = run.event("hang_detected")
    assert hang_event["blamed"] == [1] and hang_event["reason"] == "no_progress"
    assert hang_event["waiting"] == [0, 2]
    assert asked >= 3  # the stacks were asked for while the rank hung
    # blamed one hang timeout after the others began to wait, plus the ticks and the load
    assert hang <= hang_event["waited_s"] < hang + 3.0, hang_event


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_a_rank_blocked_on_a_peer_ranks_socket_is_frozen(run_rankguard):
    """Rank 0 waits for a byte from a socket rank 1 listens on (never accepted): a wait inside
    the job, blamed one hang timeout after rank 1 began to wait at the barrier."""
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", str(HANG),
                         script("peer_socket.py")])
    assert run.code == 3, run.stderr
    hang = run.event("hang_detected")
    assert (hang["blamed"], hang["reason"], hang["waiting"]) == ([0], "no_progress", [1])
    assert hang["waited_s"] < HANG + 3.0, hang
