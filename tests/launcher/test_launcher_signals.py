"""Signals to the launcher itself: the same bounded teardown, and nothing outlives it."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, TEST_ID_VAR, finish, launch, script, text_now, wait_until_gone
from tests.launcher.budgets import CLEAN_TEARDOWN_GRACE_S, guardian_sweep_s, stopped_within_s

JOINING_S = 1.5  # long past the launcher's start: it imports in a fraction of that


def _wait_for_ranks(log_dir, n, timeout=30.0):
    """Until every rank printed its first line (the script is running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = [log_dir / "attempt0" / f"rank{r}.log" for r in range(n)]
        if all(p.exists() and p.read_text() for p in logs):
            return
        time.sleep(0.05)
    pytest.fail("ranks did not start")


@pytest.mark.parametrize("args, sig, code", [
    ([], signal.SIGTERM, 143), ([], signal.SIGINT, 130),
    # torchrun's default --signals-to-handle has SIGHUP and SIGQUIT
    pytest.param([], signal.SIGHUP, 129, marks=pytest.mark.slow),
    pytest.param(["--signals-to-handle", "SIGTERM,SIGUSR1"], signal.SIGUSR1, 138,  # SLURM's
                 marks=pytest.mark.slow),
])
def test_signal_to_launcher_stops_every_rank_within_grace(tmp_path, args, sig, code):
    log_dir = tmp_path / "logs"
    grace = CLEAN_TEARDOWN_GRACE_S
    proc = launch([*args, "--nproc-per-node", "2", "--grace", str(grace),
                   script("sleeper.py")], log_dir)
    started = time.monotonic()
    _wait_for_ranks(log_dir, 2)
    sent = time.monotonic()
    os.kill(proc.pid, sig)
    run = finish(proc, log_dir, 30, started)
    assert run.code == code, run.stderr
    assert time.monotonic() - sent < stopped_within_s(grace)
    assert run.outcomes() == {0: "victim", 1: "victim"}, run.stderr
    assert run.event("run_end")["root_cause"] == f"the launcher received {sig.name}"


# an optional module torch tries at its import, found first on PYTHONPATH and slow to import:
# it says who imports it, then sleeps
SLOW_OPTIONAL_MODULE = """
import os
import time

open(os.path.join(os.environ["SLOW_IMPORT_MARKS"], str(os.getpid())), "w").close()
time.sleep(60)
"""


# the same, swallowing the first exception raised inside it, as C code may (numpy's extension,
# imported by torch's, did: torch went on, and failed at numpy's next import, an internal error)
SWALLOWING_OPTIONAL_MODULE = SLOW_OPTIONAL_MODULE.replace("time.sleep(60)", """try:
    time.sleep(60)
except BaseException:
    pass
time.sleep(60)""")


# cuda (cuda-python): early in torch's import, inside torch.cuda's; opt_einsum: late
@pytest.mark.parametrize("slow_module, source", [
    ("cuda", SLOW_OPTIONAL_MODULE), ("opt_einsum", SLOW_OPTIONAL_MODULE),
    pytest.param("opt_einsum", SWALLOWING_OPTIONAL_MODULE, id="opt_einsum-swallowing")])
def test_a_signal_while_the_launcher_imports_torch_to_host_the_store_stops_the_run_at_once(
        tmp_path, slow_module, source):
    """Once the first attempt's ranks started, the launcher hosts the job's store, importing
    torch on its main thread (over 10 s under load). A signal meanwhile stops the run at once,
    not once the import ended (it did, 2 to 14 s late, the summary saying "detected in
    0.00 s"). Here the import takes 60 s. The rank, stopped inside its own import of torch,
    says nothing of torch's partial modules (its teardown printed an AttributeError)."""
    modules, marks, log_dir = tmp_path / "modules", tmp_path / "marks", tmp_path / "logs"
    modules.mkdir()
    marks.mkdir()
    (modules / f"{slow_module}.py").write_text(source)
    path = os.pathsep.join(p for p in (str(modules), os.environ.get("PYTHONPATH")) if p)
    proc = launch(["--nproc-per-node", "1", "--grace", "2", script("allreduce.py")], log_dir,
                  env={"PYTHONPATH": path, "SLOW_IMPORT_MARKS": str(marks)})
    started = time.monotonic()
    # the launcher and its rank are both inside torch's import
    while not (marks / str(proc.pid)).exists() or len(list(marks.iterdir())) < 2:
        if proc.poll() is not None or time.monotonic() - started > 60:
            run = finish(proc, log_dir, 5, started)
            pytest.fail(f"the launcher and its rank were not both in torch's import: {run}")
        time.sleep(0.05)
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    run = finish(proc, log_dir, 40, started)
    assert run.code == 143, run.stderr
    assert time.monotonic() - sent < 30, run.stderr  # the import had 60 s to go
    assert run.event("run_end")["root_cause"] == "the launcher received SIGTERM"
    rank_log = (log_dir / "attempt0" / "rank0.log").read_text()
    assert "Traceback" not in run.stderr + rank_log, run.stderr + rank_log


@pytest.mark.slow
def test_signals_that_keep_coming_until_the_launcher_exits_leave_the_first_ones_exit_code(
        tmp_path):
    """A Ctrl-C after the first signal only hurries the ranks; one that came as the interpreter
    exited, which gives the signals their default action back, killed the launcher by it (-2
    where SIGTERM's 143 was decided and written in the journal). The Ctrl-Cs begin once the
    launcher took SIGTERM: two signals pending in the kernel at once are delivered lowest
    number first, their order lost before any code of ours runs."""
    log_dir = tmp_path / "logs"
    proc = launch(["--nproc-per-node", "1", "--grace", "2", script("sleeper.py")], log_dir)
    started = time.monotonic()
    _wait_for_ranks(log_dir, 1)
    os.kill(proc.pid, signal.SIGTERM)
    until = time.monotonic() + 30
    while '"launcher_signal"' not in text_now(log_dir / "journal.jsonl"):
        assert proc.poll() is None and time.monotonic() < until, "SIGTERM was not taken"
        time.sleep(0.005)
    while proc.poll() is None and time.monotonic() < until:
        os.kill(proc.pid, signal.SIGINT)
        time.sleep(0.005)
    run = finish(proc, log_dir, 10, started)
    assert run.code == 143, run.stderr
    assert run.event("run_end")["exit_code"] == 143


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_a_launcher_started_under_nohup_outlives_a_hangup(tmp_path):
    log_dir = tmp_path / "logs"
    proc = launch(["--nproc-per-node", "1", "--grace", "2", script("sleeper.py")], log_dir,
                  wrap=["nohup"])
    started = time.monotonic()
    _wait_for_ranks(log_dir, 1)
    os.kill(proc.pid, signal.SIGHUP)
    time.sleep(1.0)  # a handled SIGHUP ends the run within this (seen in the case above)
    assert proc.poll() is None, "the hangup ended a run started under nohup"
    os.kill(proc.pid, signal.SIGTERM)
    run = finish(proc, log_dir, 30, started)
    assert run.code == 143, run.stderr


def test_sigkill_to_launcher_leaves_no_rank_or_grandchild(tmp_path):
    log_dir = tmp_path / "logs"
    proc = launch(["--nproc-per-node", "2", script("ignore_term.py")], log_dir,
                  env={"RANK_NEVER_CRASH": "1"})
    _wait_for_ranks(log_dir, 2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    left = wait_until_gone(os.environ[TEST_ID_VAR], guardian_sweep_s())
    assert left == [], "job processes outlived a SIGKILLed launcher"


def test_internal_error_stops_every_rank_and_exits_4(tmp_path):
    log_dir = tmp_path / "logs"
    proc = launch(["--nproc-per-node", "2", "--max-restarts", "1", "--no-spares",
                   script("break_ledger_dir.py")], log_dir)
    run = finish(proc, log_dir, 60, time.monotonic())
    assert run.code == 4, run.stderr[-2000:]
    assert "rankguard: internal error: LedgerError" in run.stderr
    assert "every rank was stopped" in run.stderr
    assert f"Traceback: {log_dir / 'internal_error.txt'}" in run.stderr
    assert "Traceback (most recent call last)" in (log_dir / "internal_error.txt").read_text()
    # every rank is gone: the autouse fixture fails the test otherwise


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_a_log_dir_broken_during_the_run_stops_every_rank_and_exits_2(tmp_path):
    log_dir = tmp_path / "logs"
    proc = launch(["--nproc-per-node", "2", "--max-restarts", "1", "--no-spares",
                   script("break_log_dir.py"), str(log_dir)], log_dir)
    run = finish(proc, log_dir, 60, time.monotonic())
    assert run.code == 2, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"rankguard: error: --log-dir: cannot create "
                           f"{str(log_dir / 'attempt1')!r}: Not a directory"), last
    assert last.endswith("every rank was stopped") and "Traceback" not in run.stderr
    # ranks of both attempts are gone: the autouse fixture fails the test otherwise


def _static_node(node: int, log_dir, port: int,
                 env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """One agent of a static two-node job on 127.0.0.1 whose other node never comes."""
    return subprocess.Popen(
        [sys.executable, "-m", "rankguard.cli", "run", "--nnodes", "2", "--node-rank", str(node),
         "--master-addr", "127.0.0.1", "--master-port", str(port), "--rdzv-id", "early",
         "--log-dir", str(log_dir), script("sleeper.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT),
        start_new_session=True, preexec_fn=_default_sigint, env={**os.environ, **(env or {})})


def _default_sigint() -> None:
    """The launcher starts with SIGINT as a shell's foreground job has it (an ignored one stays
    ignored, by design: ``nohup``): not as a test before this one may have left it in the
    pytest worker (this test's SIGINT case timed out in 3 of 3 full runs in a fresh venv, and
    never alone)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_before_the_job_started_ends_it_with_its_code_a_line_and_no_folder(tmp_path,
                                                                                     sig):
    # node 1 of two waits for the job's store at an address where nothing listens yet: the
    # launcher is still joining the job, before its agent took over the signals. The port is
    # held bound (not listening: a connection is refused) so that no other test's server takes
    # it meanwhile
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        log_dir = tmp_path / "logs"
        proc = _static_node(1, log_dir, held.getsockname()[1])
        started = time.monotonic()
        time.sleep(JOINING_S)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        _ended_before_the_job_started(finish(proc, log_dir, 30, started), sig, log_dir)


def _ended_before_the_job_started(run, sig: signal.Signals, log_dir) -> None:
    assert run.code == 128 + sig, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert f"interrupted ({sig.name}) before the job started; nothing was started" in run.stderr
    assert not log_dir.exists(), list(log_dir.rglob("*"))


def test_a_signal_while_a_one_node_launcher_imports_leaves_no_journal_and_no_folder(tmp_path):
    """The signal comes once the launcher holds the signals, while it imports torch: it ends
    with the one line, and the log folder it was to make (and the journal it opened before
    looking at the signal) is not left behind (it was: an empty journal.jsonl in it)."""
    from rankguard.processes import proctree

    log_dir = tmp_path / "logs"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankguard.cli", "run", "--nproc-per-node", "1",
         "--master-port", "0", "--log-dir", str(log_dir), script("sleeper.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT),
        start_new_session=True)
    started = time.monotonic()
    while not proctree.catches(proc.pid, signal.SIGTERM):  # held (early_signals.hold)
        assert proc.poll() is None and time.monotonic() - started < 30, proc.communicate()
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    _ended_before_the_job_started(finish(proc, log_dir, 30, started), signal.SIGTERM, log_dir)


def test_a_signal_while_the_endpoint_leaves_the_store_handshake_unanswered_ends_it_at_once(
        tmp_path):
    """Something at the endpoint accepts connections and says nothing (not a store): torch's
    client waits for its handshake's answer for join_timeout (600 s). A signal meanwhile ends
    the launcher at once, as before the endpoint answered (it was ignored until then)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        accepted: list[socket.socket] = []
        silent.settimeout(30)
        log_dir = tmp_path / "logs"
        proc = _static_node(1, log_dir, silent.getsockname()[1])
        try:
            # the launcher's look that something listens, its look that it does not speak
            # first, then torch's client
            for _ in range(3):
                accepted.append(silent.accept()[0])
            time.sleep(3.5)  # in torch's handshake (its client sent its part and waits)
            assert proc.poll() is None, proc.communicate()
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            run = finish(proc, log_dir, 30, started)
        finally:
            for conn in accepted:
                conn.close()
    _ended_before_the_job_started(run, signal.SIGTERM, log_dir)
    assert run.wall_s < 10, run.wall_s  # join_timeout is 600 s
    # after 3 s, once: what the agent waits for
    assert run.stderr.count("rankguard: waiting for the store at 127.0.0.1:") == 1, run.stderr
    assert "it accepts connections but has not answered torch's handshake" in run.stderr


def test_a_node_that_waits_for_its_peer_in_the_round_ends_at_once_on_ctrl_c(tmp_path):
    # node 0 hosts the job's store and waits (up to join_timeout, 600 s) for node 1's count
    from tests.launcher.test_multinode import _free_port

    log_dir = tmp_path / "logs"
    proc = _static_node(0, log_dir, _free_port())
    started = time.monotonic()
    deadline = started + 30
    journal = log_dir / "journal.jsonl"
    while "run_start" not in text_now(journal):
        assert time.monotonic() < deadline and proc.poll() is None, "the agent did not start"
        time.sleep(0.05)
    time.sleep(0.5)  # in the round's wait by now
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    run = finish(proc, log_dir, 30, started)
    assert run.code == 130, run.stderr
    assert time.monotonic() - sent < stopped_within_s(0.0), run.stderr
    assert "the agent received a signal while it waited for the round" in run.stderr


def test_a_signal_while_a_faults_ranks_are_stopped_ends_the_run_without_the_restart(tmp_path):
    """Rank 1 exits 5, rank 0 ignores SIGTERM (its teardown takes --grace); SIGTERM to the
    launcher during that teardown: no restart (one was started, then torn down again)."""
    log_dir = tmp_path / "logs"
    grace = 2.0
    proc = launch(["--nproc-per-node", "2", "--max-restarts", "2", "--grace", str(grace),
                   script("ignore_term.py")], log_dir)
    started = time.monotonic()
    journal = log_dir / "journal.jsonl"
    deadline = time.monotonic() + 60
    while '"escalate"' not in text_now(journal):  # the attempt's ranks are being stopped
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    run = finish(proc, log_dir, 60, started)
    assert run.code == 143, run.stderr
    assert time.monotonic() - sent < stopped_within_s(grace)
    assert "received SIGTERM while the ranks were being stopped; no restart" in run.stderr
    assert "restarting" not in run.stderr, run.stderr
    assert [e["attempt"] for e in run.events if e["event"] == "attempt_start"] == [0]
    assert not [e for e in run.events if e["event"] == "restart"]
    end = run.event("run_end")
    assert end["status"] == "interrupted" and end["exit_code"] == 143, end
    assert end["root_cause"] == "rank 1 exited with code 5", end  # the fault came first


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_a_second_ctrl_c_ends_the_grace_and_kills_the_ranks_at_once(tmp_path):
    log_dir = tmp_path / "logs"
    grace = 120.0  # the ranks ignore SIGTERM: without the second Ctrl-C the run takes this long
    proc = launch(["--nproc-per-node", "2", "--grace", str(grace), script("ignore_term.py")],
                  log_dir, env={"RANK_NEVER_CRASH": "1"})
    started = time.monotonic()
    _wait_for_ranks(log_dir, 2)
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(1.0)  # the ranks were sent SIGTERM, and ignore it
    assert proc.poll() is None, proc.communicate()
    again = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    run = finish(proc, log_dir, 60, started)
    assert run.code == 130, run.stderr
    assert time.monotonic() - again < stopped_within_s(0.0), run.stderr
    assert "second SIGINT: the ranks' grace is over; killing them now" in run.stderr
    assert run.outcomes() == {0: "teardown_timeout", 1: "teardown_timeout"}, run.stderr
    kills = [e for e in run.events if e["event"] == "escalate" and e["step"] == "kill"]
    assert kills and kills[0]["ranks"] == [0, 1], run.events
