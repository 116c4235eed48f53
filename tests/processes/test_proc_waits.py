"""What /proc says a real process waits on: a child, a pipe from it, a socket to a server
inside or outside the job, a lock, a sleep, a poll, its own pipe; and its tree's CPU.
Real processes, each started by the test and killed after it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from typing import Callable, Iterator

import pytest

from rankguard.processes import proc_waits
from rankguard.deadline import Deadline
from rankguard.processes.proc_waits import Call, Fd, JobPeers, TreeSample

NOT_THE_JOB = JobPeers(roots=())


@pytest.fixture
def start() -> Iterator[Callable[[str], subprocess.Popen]]:
    started: list[subprocess.Popen] = []

    def run(code: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                                start_new_session=True)
        started.append(proc)
        return proc

    yield run
    _kill(started)


def _kill(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(5)


def settle(pid: int, ready: Callable[[TreeSample], bool],
           peers: JobPeers = NOT_THE_JOB) -> TreeSample:
    """Sample ``pid`` until ``ready`` holds (the process reached the wait under test)."""
    limit = Deadline.after(20.0)
    last = None
    while not limit.passed():
        last = proc_waits.sample(pid, peers)
        if last is not None and ready(last):
            return last
        time.sleep(0.05)
    pytest.fail(f"the process never reached the wait under test; last sample: {last}")


def test_a_process_waiting_for_its_child_names_the_child(start) -> None:
    proc = start("import subprocess; subprocess.run(['sleep', '60'])")
    seen = settle(proc.pid, lambda s: s.main.call is Call.CHILD and bool(s.children))
    assert "(sleep)" in seen.main.what
    assert not seen.stopped


def test_a_process_reading_its_childs_output_waits_on_a_pipe_from_the_child(start) -> None:
    proc = start("import subprocess; subprocess.run(['sleep', '60'], capture_output=True)")
    seen = settle(proc.pid, lambda s: s.main.call is Call.FDS and bool(s.children))
    assert Fd.CHILD in seen.main.fds, seen.main
    assert "from child" in seen.main.what


def test_a_socket_is_inside_the_job_only_when_a_process_of_the_job_holds_its_peer(start):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        proc = start(f"""
            import socket
            s = socket.create_connection(('127.0.0.1', {port}))
            s.recv(1)
        """)
        conn, _ = server.accept()
        try:
            outside = settle(proc.pid, lambda s: s.main.call is Call.FDS)
            assert outside.main.fds == (Fd.OUTSIDE,)
            assert f"127.0.0.1:{port}" in outside.main.what
            # this test's process holds the other end: as part of the job, it is inside
            inside = settle(proc.pid, lambda s: s.main.call is Call.FDS,
                            JobPeers(roots=(os.getpid(),)))
            assert inside.main.fds == (Fd.JOB,)
        finally:
            conn.close()
    finally:
        server.close()


def test_a_deadlocked_process_waits_on_a_futex_without_a_timeout(start) -> None:
    proc = start("import threading; l = threading.Lock(); l.acquire(); l.acquire()")
    seen = settle(proc.pid, lambda s: s.main.call is Call.FUTEX)
    assert seen.main.ends_in is None


def test_a_long_sleep_ends_far_away_and_a_poll_loop_soon(start) -> None:
    sleeper = start("import time; time.sleep(600)")
    poller = start("import time\nwhile True: time.sleep(0.05)")
    long = settle(sleeper.pid, lambda s: s.main.call is Call.SLEEP)
    assert long.main.ends_in is not None and long.main.ends_in > 500
    short = settle(poller.pid, lambda s: s.main.call is Call.SLEEP)
    assert short.main.ends_in is not None and short.main.ends_in <= 0.05


def test_a_process_reading_its_own_pipe_waits_on_its_own(start) -> None:
    proc = start("import os; r, w = os.pipe(); os.read(r, 1)")
    seen = settle(proc.pid, lambda s: s.main.call is Call.FDS)
    assert seen.main.fds == (Fd.OWN,)


def test_a_stopped_process_is_stopped(start) -> None:
    proc = start("import time; time.sleep(600)")
    settle(proc.pid, lambda s: s.main.call is Call.SLEEP)
    os.kill(proc.pid, signal.SIGSTOP)
    settle(proc.pid, lambda s: s.stopped)


def test_the_cpu_of_a_busy_child_counts_in_the_tree(start) -> None:
    proc = start("""
        import subprocess, sys
        subprocess.run([sys.executable, '-c', 'while True: pass'])
    """)
    first = settle(proc.pid, lambda s: s.main.call is Call.CHILD)
    limit = Deadline.after(20.0)
    while not limit.passed():
        time.sleep(0.2)
        later = proc_waits.sample(proc.pid, NOT_THE_JOB)
        assert later is not None
        if later.cpu_s - first.cpu_s >= 0.1:
            break
    else:
        pytest.fail("the child's CPU never showed in its parent's tree")


def test_a_gone_process_gives_no_sample(start) -> None:
    proc = start("pass")
    proc.wait(10)
    assert proc_waits.sample(proc.pid) is None


def test_a_socket_to_another_machine_is_inside_the_job_only_where_its_root_is_connected():
    """Two network namespaces: a server on node B; on node A, the job's root (the agent) holds
    a connection to it (the job's store on another node) and a rank blocks reading its own
    connection to the same endpoint. That is the job's store; without the root, a server
    outside the job."""
    from tests.launcher import netns

    with netns.nodes(2) as (a, b):
        where = f"('{b.address}', 29555)"
        server = f"s = socket.create_server({where})\nconns = [s.accept()[0] for _ in range(2)]"
        connect = f"c = socket.create_connection({where}, timeout=10)\nc.settimeout(None)"
        procs = []
        try:
            for node, code in ((b, f"{server}\ntime.sleep(600)"),
                               (a, f"{connect}\ntime.sleep(600)"),  # the root
                               (a, f"{connect}\nc.recv(1)")):  # the rank
                procs.append(subprocess.Popen(
                    [*node.wrap(), sys.executable, "-c", f"import socket, time\n{code}"],
                    start_new_session=True))
                time.sleep(1.0 if node is b else 0.0)  # the server listens first
            root, rank = procs[1], procs[2]
            settle(root.pid, lambda s: s.main.call is Call.SLEEP)  # connected: it sleeps after
            outside = settle(rank.pid, lambda s: s.main.call is Call.FDS)
            assert outside.main.fds == (Fd.OUTSIDE,), outside.main
            inside = settle(rank.pid, lambda s: s.main.call is Call.FDS, JobPeers((root.pid,)))
            assert inside.main.fds == (Fd.JOB,), inside.main
            assert f"{b.address}:29555 (the job's store)" in inside.main.what
        finally:
            _kill(procs)


def test_a_process_opening_a_fifo_no_one_writes_waits_on_a_file(start, tmp_path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = start(f"open({str(fifo)!r}).read()")
    seen = settle(proc.pid, lambda s: s.main.call is Call.FILE)
    assert seen.main.what == f"openat of {fifo}"


def test_a_process_waiting_for_a_file_lock_waits_on_the_file(start, tmp_path) -> None:
    import fcntl

    path = tmp_path / "lock"
    with open(path, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = start(f"import fcntl; f = open({str(path)!r}); fcntl.flock(f, fcntl.LOCK_EX)")
        seen = settle(proc.pid, lambda s: s.main.call is Call.FDS)
        assert seen.main.fds == (Fd.OUTSIDE,) and str(path) in seen.main.what


def test_a_connection_not_yet_accepted_leads_to_the_listeners_owner(start) -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # this process: the job's, never accepts
    try:
        proc = start(f"import socket; socket.create_connection(('127.0.0.1', "
                     f"{listener.getsockname()[1]})).recv(1)")
        seen = settle(proc.pid, lambda s: s.main.call is Call.FDS,
                      JobPeers(roots=(os.getpid(),)))
        assert seen.main.fds == (Fd.JOB,), seen.main
    finally:
        listener.close()


def test_a_stopped_child_is_seen_stopped(start) -> None:
    proc = start("""
        import os, signal, subprocess, sys
        subprocess.run([sys.executable, '-c', 'import os, signal; os.kill(os.getpid(), signal.SIGSTOP)'])
    """)
    seen = settle(proc.pid, lambda s: s.main.call is Call.CHILD and bool(s.stopped_children))
    assert seen.stopped_children == seen.children
