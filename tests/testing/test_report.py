"""The report of a distributed test, from the ranks' answers (no processes: the decision only)."""

from __future__ import annotations

import pytest

from rankguard.testing.report import compose


def failed(error: str, at: float, collective: bool = False) -> dict:
    return {"outcome": "failed", "error": error, "at": at, "collective": collective,
            "traceback": f"Traceback ...\n{error}: ..."}


ENDED = {"outcome": "ended", "detail": "exited with code 0"}
PASSED = {"outcome": "passed"}
DESTROYED_IT = {"outcome": "passed", "group": False}  # the test destroyed the group


@pytest.mark.parametrize("world, answers, head", [
    (2, {0: PASSED, 1: PASSED}, None),
    (2, {0: failed("PeerFailed", 2.0, True), 1: ENDED},
     "rank 1 exited with code 0 during the test; rank 0 failed as a consequence (PeerFailed)"),
    (2, {0: {"outcome": "ended", "detail": "was killed by SIGKILL"}, 1: PASSED},
     "rank 0 was killed by SIGKILL during the test; rank 1 passed"),
    (3, {0: failed("PeerFailed", 3.0, True), 1: failed("AssertionError", 2.0), 2: ENDED},
     "rank 2 exited with code 0 during the test; rank 1 failed on its own too "
     "(AssertionError); rank 0 failed as a consequence (PeerFailed)"),
    (2, {0: failed("PeerFailed", 3.0, True), 1: failed("AssertionError", 2.0)},
     "rank 1 failed first (AssertionError); rank 0 failed as a consequence (PeerFailed)"),
    (2, {0: failed("CollectiveTimeout", 3.0, True)},
     "rank 1 never finished the test (stuck); rank 0 failed as a consequence "
     "(CollectiveTimeout)"),
    (2, {0: failed("PeerFailed", 2.0, True), 1: DESTROYED_IT},
     "rank 1 destroyed the process group (dist.destroy_process_group()) during the test while "
     "rank 0 still used it; rank 0 failed as a consequence (PeerFailed)"),
    (3, {0: failed("PeerFailed", 2.0, True), 1: DESTROYED_IT},
     "rank 1 destroyed the process group (dist.destroy_process_group()) during the test while "
     "ranks 0,2 still used it; rank 2 never finished the test (stuck); rank 0 failed as a "
     "consequence (PeerFailed)"),
    (2, {0: DESTROYED_IT, 1: DESTROYED_IT}, None),
    (3, {0: failed("PeerFailed", 3.0, True), 1: DESTROYED_IT, 2: failed("ValueError", 2.0)},
     "rank 1 destroyed the process group (dist.destroy_process_group()) during the test while "
     "rank 0 still used it; rank 2 failed on its own too (ValueError); rank 0 failed as a "
     "consequence (PeerFailed)"),
])
def test_the_headline_puts_ended_processes_destroyers_and_first_failures_before_their_cascade(
        world, answers, head):
    text = compose(world, answers, {1: "stacks", 2: "stacks"}, {})
    assert (text.split("\n", 1)[0] if text else None) == head


def test_a_rank_that_ended_gets_a_section_with_its_output_and_no_stuck_stacks() -> None:
    text = compose(2, {0: failed("PeerFailed", 2.0, True), 1: ENDED}, {},
                   {1: "bye from rank 1\n"})
    assert "----- rank 1: exited with code 0 during the test -----" in text
    assert "----- rank 1: output -----\nbye from rank 1" in text
    assert "stuck" not in text


def test_stacks_files_of_killed_sessions_are_swept_and_live_ones_kept() -> None:
    """A pytest session that was killed could not remove its stacks file; the next session
    removes it (its pid is gone), never the file of a session still running."""
    import os
    import subprocess
    import sys
    import tempfile

    from rankguard.testing import plugin

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, timeout=30)
    dead_pid = int(gone.stdout)
    made = []
    for pid in (dead_pid, os.getpid()):
        fd, path = tempfile.mkstemp(prefix=f"rankguard-pytest-{pid}-", suffix=".stacks")
        os.close(fd)
        made.append(path)
    try:
        plugin._sweep_stacks_files()
        assert not os.path.exists(made[0]) and os.path.exists(made[1])
    finally:
        for path in made:
            if os.path.exists(path):
                os.unlink(path)
