"""The pytest plugin against deliberately bad tests, run through pytest in a subprocess.

For each: the session ends within the test deadline plus a few seconds, the report names the
culprit and shows its stack, no process is left (the autouse fixture of our conftest checks
every process the inner session started), and the good test after it still runs and passes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rankguard.processes import proctree
from rankguard.testing.watchdog import BACKSTOP_S, LAST_RESORT_S, LAST_WORDS_S
from tests.detached import CGROUP, DAEMON, SUBREAPER

from . import ipc_child_case
from .suite import run_suite

DEADLINE = 3.0
GOOD = '''

def test_good_after():
    assert 1 + 1 == 2
'''

SLEEPS = '''
import time

def test_sleeps_in_call():
    time.sleep(1000)
''' + GOOD

CHILD_NEVER_EXITS = '''
import multiprocessing as mp
import time

def child_main(lock):
    with lock:  # holds the resource, never lets go
        time.sleep(1000)

def test_joins_a_child_that_never_exits():
    lock = mp.get_context("fork").Lock()
    child = mp.get_context("fork").Process(target=child_main, args=(lock,))
    child.start()
    time.sleep(0.2)
    child.join()
''' + GOOD

GRANDCHILD = '''
import subprocess

def test_leaves_a_grandchild():
    subprocess.run(["sh", "-c", "sleep 1000 > /dev/null 2>&1 &"], check=True, timeout=10)
''' + GOOD

TEARDOWN_HANGS = '''
import time
import pytest

@pytest.fixture
def resource():
    yield 1
    time.sleep(1000)  # the teardown hangs, after a failed test

def test_fails_then_its_teardown_hangs(resource):
    assert resource == 2
''' + GOOD

DEAD_CHILD = '''
import multiprocessing as mp
import os
import pytest

def dies(queue):
    os._exit(3)  # before it ever puts anything

@pytest.fixture
def answer():
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=dies, args=(queue,))
    child.start()
    return queue.get()  # blocks forever on a dead child

def test_uses_a_fixture_that_blocks_on_a_dead_child(answer):
    assert answer
''' + GOOD


C_DEADLOCK = '''
import ctypes

def test_deadlocks_in_c():
    print("about to lock twice")
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: a default (non-recursive) pthread mutex
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)  # never returns (ctypes released the GIL)
''' + GOOD

GIL_DEADLOCK = C_DEADLOCK.replace("ctypes.CDLL(None)", "ctypes.PyDLL(None)")  # keeps the GIL


FINALIZER = '''
import time

class SlowToFinalize:
    def __del__(self):
        end = time.monotonic() + 3 * DEADLINE
        while time.monotonic() < end:  # Python code: the interruption lands in it
            pass

def test_passes_its_deadline_in_a_finalizer():
    SlowToFinalize()
'''.replace("DEADLINE", str(DEADLINE)) + GOOD


FAILS_AFTER_ITS_DEADLINE = FINALIZER.replace(
    "def test_passes_its_deadline_in_a_finalizer():\n    SlowToFinalize()\n",
    "def test_fails_on_its_own_after_its_deadline():\n    SlowToFinalize()\n"
    "    raise ValueError('the test fails on its own')\n")

# unittest records a test's own error and returns: pytest reports the error it recorded
FAILS_AFTER_ITS_DEADLINE_IN_A_UNITTEST_CASE = FAILS_AFTER_ITS_DEADLINE.replace(
    "def test_fails_on_its_own_after_its_deadline():\n    SlowToFinalize()\n    raise",
    "import unittest\n\nclass TestCase(unittest.TestCase):\n"
    "    def test_fails_on_its_own_after_its_deadline(self):\n"
    "        SlowToFinalize()\n        raise")

# and one that skips itself after its deadline passed: not a skip, a failure
SKIPS_AFTER_ITS_DEADLINE_IN_A_UNITTEST_CASE = FAILS_AFTER_ITS_DEADLINE_IN_A_UNITTEST_CASE.replace(
    "raise ValueError('the test fails on its own')", "self.skipTest('it skips on its own')")


def run(tmp_path: Path, body: str, *args: str):
    return run_suite(tmp_path, {"test_bad.py": body},
                     ["--rankguard-deadline", str(DEADLINE), *args], timeout=DEADLINE * 3 + 30)


def test_a_test_sleeping_past_its_deadline_fails_with_its_stack_and_the_session_goes_on(
        tmp_path: Path) -> None:
    session = run(tmp_path, SLEEPS)
    assert session.result("test_sleeps_in_call") == "failed"
    text = session.text("test_sleeps_in_call")
    assert "deadline of 3 s passed during the call" in text
    assert "main thread at" in text and "test_bad.py:5 in test_sleeps_in_call" in text, text
    assert session.result("test_good_after") == "passed"
    assert session.code == 1 and session.wall_s < DEADLINE + 15


@pytest.mark.slow
def test_a_test_deadlocked_in_c_ends_the_session_with_its_report_on_the_terminal_and_in_the_xml(
        tmp_path: Path) -> None:
    session = run(tmp_path, C_DEADLOCK)
    where = "main thread at " + str(tmp_path / "test_bad.py") + ":9 in test_deadlocks_in_c"
    assert session.code == 2, session.output
    assert "deadline of 3 s passed during the call" in session.output, session.output
    assert where in session.output
    assert "about to lock twice" in session.output  # what the test wrote before
    assert "(stuck inside C code); ending the session (exit 2)" in session.output
    assert session.result("test_deadlocks_in_c") == "failed"  # in the junit XML
    assert where in session.text("test_deadlocks_in_c")
    assert session.wall_s < DEADLINE + LAST_RESORT_S + LAST_WORDS_S + 15


IGNORES_THE_INTERRUPTION = '''
import signal
import time

def test_ignores_the_deadline_interruption():
    signal.signal(signal.SIGRTMAX - 1, signal.SIG_IGN)  # rankguard's
    time.sleep(1000)
'''


@pytest.mark.slow  # the last resort's 10 s
def test_a_test_that_took_the_deadline_signal_ends_the_session_saying_so_not_blaming_c_code(
        tmp_path: Path) -> None:
    session = run(tmp_path, IGNORES_THE_INTERRUPTION)
    assert session.code == 2, session.output
    assert ("did not return within 10 s of its interruption (the test replaced rankguard's "
            "handler of SIGRTMAX-1, the deadline's interruption, with SIG_IGN: leave SIGRTMAX-1 "
            "and SIGRTMAX-2 to rankguard); ending the session (exit 2)") in session.output, \
        session.output[-3000:]
    assert "stuck inside C code" not in session.output
    assert session.result("test_ignores_the_deadline_interruption") == "failed"
    assert session.wall_s < DEADLINE + LAST_RESORT_S + LAST_WORDS_S + 15

@pytest.mark.slow
def test_a_test_deadlocked_in_c_holding_the_gil_still_ends_the_session_with_its_stack(
        tmp_path: Path) -> None:
    session = run(tmp_path, GIL_DEADLOCK)
    assert session.code == 1, session.output  # faulthandler's exit: no Python thread can run
    assert f'File "{tmp_path / "test_bad.py"}", line 9 in test_deadlocks_in_c' in session.output
    assert session.wall_s < DEADLINE + BACKSTOP_S + 15


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_a_deadline_that_passes_in_a_finalizer_still_fails_the_test(tmp_path: Path) -> None:
    # Python only prints an exception raised in a finalizer ("Exception ignored in"): the
    # interruption's is lost there, and the report must reach the test another way
    session = run(tmp_path, FINALIZER)
    assert session.result("test_passes_its_deadline_in_a_finalizer") == "failed", \
        session.output[-3000:]
    text = session.text("test_passes_its_deadline_in_a_finalizer")
    assert f"the deadline of {DEADLINE:g} s passed during the call" in text, text
    assert "in __del__" in text, text  # where the main thread was
    assert session.result("test_good_after") == "passed"


@pytest.mark.parametrize("body, own", [
    (FAILS_AFTER_ITS_DEADLINE, "ValueError: the test fails on its own"),
    pytest.param(FAILS_AFTER_ITS_DEADLINE_IN_A_UNITTEST_CASE,
                 "ValueError: the test fails on its own", marks=pytest.mark.slow),
    pytest.param(SKIPS_AFTER_ITS_DEADLINE_IN_A_UNITTEST_CASE, "it skips on its own",
                 marks=pytest.mark.slow)],  # out of the quick run (its 5 minutes)
    ids=["function", "unittest", "unittest_skip"])
def test_a_test_that_fails_on_its_own_after_its_deadline_passed_fails_with_the_report(
        tmp_path: Path, body: str, own: str) -> None:
    # the release may end what the test waits for before the interruption lands (its child):
    # the test then fails on its own, and the report must not be lost (it was, 5 runs in 8
    # of the spawned-child case under load, and in CI for a torch MultiProcessTestCase, a
    # unittest case, whose ranks the release ended); its own error is the report's cause
    session = run(tmp_path, body)
    test = "test_fails_on_its_own_after_its_deadline"
    assert session.result(test) == "failed", session.output[-3000:]
    text = session.text(test)
    assert f"the deadline of {DEADLINE:g} s passed during the call" in text, text
    assert own in text, text
    assert session.result("test_good_after") == "passed"


def test_a_child_that_never_exits_is_stacked_named_and_killed(tmp_path: Path) -> None:
    session = run(tmp_path, CHILD_NEVER_EXITS)
    text = session.text("test_joins_a_child_that_never_exits")
    assert session.result("test_joins_a_child_that_never_exits") == "failed"
    assert "main thread at" in text and ("in join" in text or "in wait" in text), text
    assert "in child_main" in text, text  # the child's own stack, from the child
    assert "released: SIGTERM to 1 process(es)" in text, text
    assert session.result("test_good_after") == "passed"


def test_a_grandchild_left_running_fails_the_teardown_with_its_command_line(
        tmp_path: Path) -> None:
    session = run(tmp_path, GRANDCHILD)
    assert session.result("test_leaves_a_grandchild") == "error"  # the call passed, the teardown not
    assert "2 passed, 1 error" in session.output
    text = session.text("test_leaves_a_grandchild")
    assert "left 1 process(es) running (now killed)" in text and "sleep 1000" in text, text
    assert session.result("test_good_after") == "passed"


DETACHED = f'''
import os
import subprocess
import sys

def test_leaves_a_detached_process_with_a_cleared_environment():
    subprocess.run([sys.executable, {DAEMON!r}, os.path.join(os.path.dirname(__file__),
                    "daemon.pid")], check=True, timeout=30)
''' + GOOD


@pytest.mark.parametrize("env", [CGROUP, SUBREAPER])
def test_a_detached_process_that_cleared_its_environment_is_a_leak_and_is_killed(
        tmp_path: Path, env: dict[str, str]) -> None:
    try:
        session = run_suite(tmp_path, {"test_bad.py": DETACHED},
                            ["--rankguard-deadline", str(DEADLINE)], timeout=DEADLINE * 3 + 30,
                            env=env)
        pid = int((tmp_path / "daemon.pid").read_text())
        text = session.text("test_leaves_a_detached_process_with_a_cleared_environment")
        assert session.result("test_leaves_a_detached_process_with_a_cleared_environment") \
            == "error", session.output
        assert "left 1 process(es) running (now killed)" in text, text
        assert f"pid {pid} (sleep)" in text and "sleep 1000" in text, text
        assert not proctree.alive(pid)
        assert session.result("test_good_after") == "passed"
    finally:
        if (tmp_path / "daemon.pid").exists():
            proctree.kill_all([int((tmp_path / "daemon.pid").read_text())])


def test_leaks_can_warn_instead_of_failing(tmp_path: Path) -> None:
    session = run(tmp_path, GRANDCHILD, "--rankguard-leaks", "warn")
    assert session.result("test_leaves_a_grandchild") == "passed"
    assert "left 1 process(es) running" in session.output
    assert session.code == 0


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_the_teardown_after_a_failed_test_has_its_own_deadline(tmp_path: Path) -> None:
    session = run(tmp_path, TEARDOWN_HANGS)
    assert session.result("test_fails_then_its_teardown_hangs") in ("failed,error", "error,failed")
    text = session.text("test_fails_then_its_teardown_hangs")
    assert "assert 1 == 2" in text
    assert "passed during the teardown" in text and "in resource" in text, text
    assert session.result("test_good_after") == "passed"
    assert session.wall_s < 2 * DEADLINE + 15


def test_a_fixture_blocked_on_a_dead_child_fails_its_setup(tmp_path: Path) -> None:
    session = run(tmp_path, DEAD_CHILD)
    assert session.result("test_uses_a_fixture_that_blocks_on_a_dead_child") == "error"
    text = session.text("test_uses_a_fixture_that_blocks_on_a_dead_child")
    assert "passed during the setup" in text and "in answer" in text, text
    assert session.result("test_good_after") == "passed"


def test_a_marker_sets_one_tests_deadline(tmp_path: Path) -> None:
    body = '''
import time
import pytest

@pytest.mark.deadline(1)
def test_short():
    time.sleep(1000)
''' + GOOD
    session = run_suite(tmp_path, {"test_marker.py": body}, [], timeout=60)
    assert "deadline of 1 s passed during the call" in session.text("test_short")
    assert session.result("test_good_after") == "passed"


BAD_MARKERS = {  # test name: (marker, what the one-line error says)
    "test_text": ('deadline("1")', "@pytest.mark.deadline: expected a number of seconds, "
                  "got '1'"),
    "test_negative": ("deadline(-1)", "@pytest.mark.deadline: -1 is below 0"),
    "test_bool": ("deadline(True)", "@pytest.mark.deadline: expected a number of seconds, "
                  "got True"),
    "test_nan": ('deadline(float("nan"))', "@pytest.mark.deadline: nan is not a number"),
    "test_infinite": ('deadline(float("inf"))', "@pytest.mark.deadline: inf is not a finite"),
    "test_two_values": ("deadline(1, 2)", "@pytest.mark.deadline: takes one value, got (1, 2)"),
    "test_misspelt": ("deadline(second=5)", "@pytest.mark.deadline: unknown keyword second= "
                      "in (second=5) (it takes seconds=; give an int or a float"),
    "test_ranks_text": ('ranks("2")', "@pytest.mark.ranks: needs a number of ranks from 1 to "
                        "64, got '2'"),
    "test_ranks_other_keyword": ("ranks(2, gpus=1)", "@pytest.mark.ranks: unknown keyword "
                                 "gpus= in (2, gpus=1) (it takes n= and devices=; give an int"),
    "test_ranks_devicez": ("ranks(2, devicez=[0, 1])", "@pytest.mark.ranks: unknown keyword "
                           "devicez= in (2, devicez=[0, 1]) (it takes n= and devices=; "),
    "test_ranks_twice": ("ranks(2, n=2)", "@pytest.mark.ranks: takes one value, got (2, n=2)"),
    "test_ranks_devices_short": ("ranks(2, devices=[0])", "@pytest.mark.ranks(devices=): 1 "
                                 "device(s) [0] for 2 rank(s) per replica"),
    "test_ranks_devices_absent": ("ranks(2, devices=[0, 999])", "@pytest.mark.ranks(devices=): "
                                  "device "),  # 0 where no GPU is visible, else 999
}


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_a_bad_marker_is_one_error_of_its_test_naming_the_marker_and_the_fix(
        tmp_path: Path) -> None:
    body = "import pytest\n" + "".join(
        f"\n@pytest.mark.{marker}\ndef {name}():\n    pass\n"
        for name, (marker, _) in BAD_MARKERS.items()) + '''
@pytest.mark.deadline(seconds=30)
def test_keyword():
    pass
''' + GOOD
    session = run_suite(tmp_path, {"test_markers.py": body}, [], timeout=60)
    for name, (_, problem) in BAD_MARKERS.items():
        assert session.result(name) == "error", (name, session.output)  # once, in the setup
        text = session.text(name)
        assert f"test_markers.py::{name}: {problem}" in text
        assert ("CUDA" if "devices" in name else "e.g. @pytest.mark.ranks(2)" if "ranks" in name
                else "e.g. @pytest.mark.deadline(30); 0 turns it off") in text
        assert "Traceback" not in text and "plugin.py" not in text, text  # one line, no stack
    assert f"{len(BAD_MARKERS)} errors" in session.output
    assert session.result("test_keyword") == session.result("test_good_after") == "passed"


@pytest.mark.parametrize(("args", "message"), [
    (["--rankguard-deadline", "soon"], "--rankguard-deadline: 'soon' is not a number"),
    # the rule of every seconds value: a timer cannot wait past 1e9 s (the watchdog's overflowed)
    (["--rankguard-deadline", "1e10"], "--rankguard-deadline: '1e10' is above 1000000000"),
    # plain decimal text, as every flag of rankguard takes (0 turns it off, not infinity)
    (["--rankguard-deadline", "inf"], "--rankguard-deadline: 'inf' is not a finite number"),
    (["--rankguard-deadline", "\u0661\u0662"],
     "--rankguard-deadline: '\u0661\u0662' is not a number"),
    (["-o", "rankguard_deadline=-5"], "rankguard_deadline (ini): '-5' is below 0"),
    # the end-of-session barrier must wait, and not forever
    (["-o", "rankguard_shutdown_timeout=0"], "rankguard_shutdown_timeout (ini): '0' is not "
     "above 0 (give a positive number of seconds, e.g. 60)"),
    (["-o", "rankguard_shutdown_timeout=inf"], "rankguard_shutdown_timeout (ini): 'inf' is not "
     "a finite number"),
    (["-o", "rankguard_leaks=never"], "rankguard_leaks (ini): 'never' is not one of fail, warn, "
     "ignore"),
])
def test_bad_settings_are_refused_with_a_clear_message(tmp_path: Path, args: list[str],
                                                        message: str) -> None:
    launched = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    session = run_suite(tmp_path, {"test_x.py": GOOD}, args, timeout=60,
                        env=launched if "shutdown" in message else None)  # read under one only
    assert session.code == 4, session.output  # pytest's usage error, before any test ran
    assert message in session.output


def test_multiprocessing_helpers_shared_by_the_whole_session_are_not_leaks(
        tmp_path: Path) -> None:
    body = '''
import multiprocessing as mp

def square(x):
    return x * x

def test_uses_a_spawn_pool():
    with mp.get_context("spawn").Pool(1) as pool:
        assert pool.map(square, [3]) == [9]
''' + GOOD
    session = run(tmp_path, body)
    assert session.result("test_uses_a_spawn_pool") == "passed", session.output
    assert session.code == 0


TEARDOWN_RAISES = '''
import multiprocessing as mp
import os
import subprocess
import time
import pytest

def forever():
    time.sleep(600)

@pytest.fixture
def breaks_on_teardown():
    yield
    raise RuntimeError("the fixture's teardown breaks")

def test_starts_children_then_a_teardown_raises(breaks_on_teardown):
    sleeper = subprocess.Popen(["sleep", "600"])
    child = mp.get_context("fork").Process(target=forever)  # joined by multiprocessing at exit
    child.start()
    with open(os.path.join(os.path.dirname(__file__), "pids"), "w") as f:
        f.write(f"{sleeper.pid} {child.pid}")
''' + GOOD


def test_the_leak_check_runs_and_kills_when_a_fixtures_teardown_raises(tmp_path: Path) -> None:
    session = run(tmp_path, TEARDOWN_RAISES)
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    name = "test_starts_children_then_a_teardown_raises"
    assert session.result(name) == "error", session.output  # the call passed, the teardown not
    text = session.text(name)
    assert "the fixture's teardown breaks" in text, text  # the teardown's own error is kept
    assert "left 2 process(es) running (now killed)" in text, text
    assert "sleep 600" in text and f"pid {pids[1]} " in text, text
    assert not any(proctree.alive(pid) for pid in pids)
    assert session.result("test_good_after") == "passed"
    assert session.code == 1 and session.wall_s < DEADLINE + 15  # no hang at exit either


SIGUSR_LEFT_TO_THE_TESTS = '''
import multiprocessing as mp
import os
import signal
import time

def test_sigusr1_and_sigusr2_keep_their_default_action_here_and_in_a_forked_child():
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        assert signal.getsignal(sig) == signal.SIG_DFL, sig
        child = mp.get_context("fork").Process(target=time.sleep, args=(600,))
        child.start()
        os.kill(child.pid, sig)
        child.join(2)  # within the test's deadline
        if child.exitcode is None:
            child.kill()
            child.join(10)
        assert child.exitcode == -sig, (sig, child.exitcode)
'''


def test_the_plugin_leaves_sigusr1_and_sigusr2_to_the_test_and_its_forked_children(
        tmp_path: Path) -> None:
    session = run(tmp_path, SIGUSR_LEFT_TO_THE_TESTS)
    assert session.code == 0, session.output


OWN_SIGUSR2_HANDLER = '''
import signal
import time

def test_owns_sigusr2_then_sleeps():
    signal.signal(signal.SIGUSR2, lambda signum, frame: None)
    time.sleep(1000)
''' + GOOD


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_a_test_with_its_own_sigusr2_handler_that_hangs_is_reported_in_its_sleep(
        tmp_path: Path) -> None:
    session = run(tmp_path, OWN_SIGUSR2_HANDLER)
    assert session.result("test_owns_sigusr2_then_sleeps") == "failed", session.output
    text = session.text("test_owns_sigusr2_then_sleeps")
    assert "deadline of 3 s passed during the call" in text, text
    assert "main thread at" in text and "test_bad.py:7 in test_owns_sigusr2_then_sleeps" in text
    assert "stuck inside C code" not in session.output
    assert session.result("test_good_after") == "passed"
    assert session.code == 1 and session.wall_s < DEADLINE + 15


TORCH_MULTIPROCESS_CASE = '''
import time

import torch
import torch.distributed as dist
from torch.testing._internal.common_distributed import MultiProcessTestCase


class TestTorchStyle(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def test_rank1_hangs(self):
        dist.init_process_group("gloo", init_method=f"file://{self.file_name}",
                                rank=self.rank, world_size=self.world_size)
        if self.rank == 1:
            time.sleep(600)
        dist.all_reduce(torch.ones(1))
'''


# two spawned ranks import torch (slow under load: 20 s was once too short to reach the test)
@pytest.mark.slow
def test_a_hung_torch_multiprocess_test_case_names_its_ranks_with_their_python_stacks(
        tmp_path: Path) -> None:
    session = run_suite(tmp_path, {"test_torch_style.py": TORCH_MULTIPROCESS_CASE},
                        ["--rankguard-deadline", "30"], timeout=120)
    text = session.text("test_rank1_hangs")
    assert session.result("test_rank1_hangs") == "failed", session.output
    assert "deadline of 30 s passed during the call" in text, text
    path = tmp_path / "test_torch_style.py"
    assert re.search(rf"stuck: rank 0: pid \d+ .*\n.* main thread at .* in all_reduce, called "
                     rf"from {re.escape(str(path))}:23 in test_rank1_hangs", text), text
    assert re.search(rf"stuck: rank 1: pid \d+ .*\n.* main thread at {re.escape(str(path))}:22 "
                     rf"in test_rank1_hangs", text), text
    assert session.code == 1 and session.wall_s < 90


@pytest.mark.slow  # a spawned child imports torch (7 s)
def test_a_spawned_child_wedged_holding_the_parents_tensor_is_named_and_released(
        tmp_path: Path) -> None:
    # the cuda-python case on the CPU (shared memory): tests/gpu/test_cuda_ipc_child.py
    ipc_child_case.check_named_released_and_the_session_goes_on(
        ipc_child_case.run(tmp_path, "cpu", DEADLINE))
