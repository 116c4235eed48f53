"""``@pytest.mark.ranks(N)``: distributed tests on a warm pool of real rank processes, run
through pytest in a subprocess. A bad test fails with the first failure apart from its cascade,
the pool heals, and the good tests after it pass."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .suite import run_suite

HEADER = '''
import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist
'''

GOOD = '''

@pytest.mark.ranks(2)
def test_good_after():
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [2.0, 2.0, 2.0]
'''


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_a_passing_distributed_test_runs_on_every_rank_of_a_reused_warm_pool(
        tmp_path: Path) -> None:
    body = HEADER + '''
HERE = os.path.dirname(os.path.abspath(__file__))

@pytest.mark.ranks(3)
def test_first():
    t = torch.full((2,), float(dist.get_rank()))
    dist.all_reduce(t)
    assert t.tolist() == [3.0, 3.0] and dist.get_world_size() == 3
    with open(os.path.join(HERE, f"pid{dist.get_rank()}"), "w") as f:
        f.write(str(os.getpid()))

@pytest.mark.ranks(3)
def test_second(tmp_path):
    with open(os.path.join(HERE, f"pid{dist.get_rank()}")) as f:
        assert f.read() == str(os.getpid())  # the same warm process ran both tests
    assert tmp_path.is_dir()  # fixture values travel to the ranks

@pytest.mark.ranks(3)
class TestInAClass:
    factor = 2.0

    def helper(self):
        return torch.full((1,), self.factor)

    def test_method(self):
        t = self.helper()
        dist.all_reduce(t)
        assert t.item() == 6.0
'''
    temp = tmp_path / "temp"
    temp.mkdir()
    session = run_suite(tmp_path, {"test_dist.py": body}, [], timeout=120,
                        env={"TMPDIR": str(temp)})
    assert session.result("test_first") == "passed", session.output
    assert session.result("test_second") == "passed", session.output
    assert session.result("test_method") == "passed", session.output
    assert session.code == 0
    assert not list(temp.glob("rankguard-*"))  # the pools' folders are removed at the end


@pytest.mark.slow
def test_a_rank_that_raises_while_the_other_waits_is_reported_first_and_the_other_as_victim(
        tmp_path: Path) -> None:
    body = HEADER + '''
@pytest.mark.ranks(2)
def test_rank1_disagrees():
    if dist.get_rank() == 1:
        assert dist.get_rank() == 0, "rank 1 disagrees"
    dist.all_reduce(torch.ones(1))
''' + GOOD
    session = run_suite(tmp_path, {"test_dist.py": body}, [], timeout=120)
    text = session.text("test_rank1_disagrees")
    assert session.result("test_rank1_disagrees") == "failed"
    # rank 0 learns of it inside its all_reduce (PeerFailed) or, if rank 1's notice came
    # first, as it starts it (GroupRetired): a victim either way
    assert re.match(r"rank 1 failed first \(AssertionError\); rank 0 failed as a consequence "
                    r"\((PeerFailed|GroupRetired)\)", text), text
    assert "AssertionError: rank 1 disagrees" in text  # rank 1's traceback
    assert "----- rank 0: victim -----" in text and "rank 1 raised AssertionError" in text
    assert session.result("test_good_after") == "passed"  # the pool formed a new generation


@pytest.mark.slow
def test_a_rank_that_raises_releases_its_peer_waiting_in_a_sub_group_at_once(
        tmp_path: Path) -> None:
    body = HEADER + '''
@pytest.mark.ranks(2)
@pytest.mark.deadline(60)
def test_rank1_fails_between_sub_group_collectives():
    group = dist.new_group([0, 1])
    dist.all_reduce(torch.ones(1), group=group)
    if dist.get_rank() == 1:
        assert False, "rank 1 fails"
    dist.all_reduce(torch.ones(1), group=group)  # rank 0 waits here for rank 1
''' + GOOD
    session = run_suite(tmp_path, {"test_dist.py": body}, [], timeout=120)
    text = session.text("test_rank1_fails_between_sub_group_collectives")
    # inside its all_reduce (PeerFailed) or, if rank 1's notice came first, as it starts it
    assert re.match(r"rank 1 failed first \(AssertionError\); rank 0 failed as a consequence "
                    r"\((PeerFailed|GroupRetired)\)", text), text
    assert re.search(r"PeerFailed: rank 0: all_reduce #2 on group '(?!world)[^']+' was "
                     r"abandoned: rank 1 raised AssertionError|GroupRetired: process group "
                     r"'(?!world)[^']+' is retired \(rank 1 raised AssertionError\)", text), text
    assert session.result("test_good_after") == "passed"
    assert session.wall_s < 40  # told at once, not at the 60 s deadline


@pytest.mark.slow  # a second pool starts (5 s)
def test_a_test_that_destroys_the_process_group_passes_and_the_next_test_finds_one(
        tmp_path: Path) -> None:
    body = HEADER + '''
@pytest.mark.ranks(2)
def test_destroys_the_group():
    dist.destroy_process_group()
''' + GOOD
    session = run_suite(tmp_path, {"test_dist.py": body}, [], timeout=120)
    assert session.result("test_destroys_the_group") == "passed", session.output
    assert session.result("test_good_after") == "passed", session.output  # on a new pool
    assert session.code == 0


@pytest.mark.slow  # a second pool starts (5 s)
def test_a_rank_that_destroys_the_group_while_its_peer_waits_in_it_is_named_as_the_cause(
        tmp_path: Path) -> None:
    body = HEADER + '''
@pytest.mark.ranks(2)
def test_rank1_destroys_the_group():
    if dist.get_rank() == 1:
        time.sleep(0.5)  # rank 0 is inside the all_reduce by then
        dist.destroy_process_group()
        return
    dist.all_reduce(torch.ones(1))
''' + GOOD
    session = run_suite(tmp_path, {"test_dist.py": body}, [], timeout=120)
    text = session.text("test_rank1_destroys_the_group")
    assert session.result("test_rank1_destroys_the_group") == "failed", session.output
    assert text.startswith("rank 1 destroyed the process group (dist.destroy_process_group()) "
                           "during the test while rank 0 still used it; rank 0 failed as a "
                           "consequence"), text
    assert "rank 1 passed" not in text
    # rank 0 was told by rank 1, inside its all_reduce (or, were it late, as it began it)
    assert re.search(r"(PeerFailed: rank 0: all_reduce #1 on group 'world' was abandoned: "
                     r"|GroupRetired: process group 'world' is retired \()rank 1 destroyed the "
                     r"process group \(dist\.destroy_process_group\(\)\) during the test",
                     text), text
    assert session.result("test_good_after") == "passed", session.output  # on a new pool
    assert session.wall_s < 60  # released at once, not at the test's deadline (600 s)


@pytest.mark.slow
def test_a_rank_frozen_inside_allreduce_is_named_with_its_stack_within_the_deadline(
        tmp_path: Path) -> None:
    body = HEADER + '''
@pytest.mark.ranks(2)
@pytest.mark.deadline(5)
def test_rank1_freezes_inside_allreduce():
    if dist.get_rank() == 1:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    else:
        time.sleep(0.6)  # rank 1 is already inside the all_reduce, frozen
    dist.all_reduce(torch.ones(1))
''' + GOOD
    session = run_suite(tmp_path, {"test_dist.py": body}, [], timeout=120)
    text = session.text("test_rank1_freezes_inside_allreduce")
    assert session.result("test_rank1_freezes_inside_allreduce") == "failed"
    assert text.startswith("rank 1 never finished the test (stuck); rank 0 failed as a "
                           "consequence (CollectiveTimeout)"), text
    assert "----- rank 1: stuck; its stacks -----" in text
    assert "in all_reduce" in text and "test_rank1_freezes_inside_allreduce" in text
    assert "ranks that had not arrived: 1" in text
    assert session.result("test_good_after") == "passed"  # on a new pool
    assert session.wall_s < 60


@pytest.mark.slow
def test_a_rank_whose_process_ends_during_a_test_is_reported_with_its_exit_code_or_signal(
        tmp_path: Path) -> None:
    body = HEADER + '''
@pytest.mark.ranks(2)
def test_rank1_exits_0():
    if dist.get_rank() == 1:
        os._exit(0)
    dist.all_reduce(torch.ones(1))

@pytest.mark.ranks(2)
def test_rank1_exits_3():
    if dist.get_rank() == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(1))

@pytest.mark.ranks(2)
def test_rank0_is_killed():
    if dist.get_rank() == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))
'''
    session = run_suite(tmp_path, {"test_dist.py": body}, [], timeout=180)
    for test, head in (("test_rank1_exits_0", "rank 1 exited with code 0 during the test; "
                        "rank 0 failed as a consequence"),
                       ("test_rank1_exits_3", "rank 1 exited with code 3 during the test; "
                        "rank 0 failed as a consequence"),
                       ("test_rank0_is_killed", "rank 0 was killed by SIGKILL during the "
                        "test; rank 1 failed as a consequence")):
        text = session.text(test)
        assert session.result(test) == "failed", session.output
        assert text.startswith(head), text
        assert "stuck" not in text and "(gone)" not in text, text


@pytest.mark.slow  # a pool of two ranks and a 6 s deadline
def test_a_collective_that_times_out_in_a_ranks_test_says_how_long_it_really_had(
        tmp_path: Path) -> None:
    body = HEADER + '''
@pytest.mark.ranks(2)
@pytest.mark.deadline(6)
def test_rank1_never_joins():
    time.sleep(1)  # the test's deadline began before the collective
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))
''' + GOOD
    session = run_suite(tmp_path, {"test_dist.py": body}, [], timeout=120)
    text = session.text("test_rank1_never_joins")
    found = re.search(r"all_reduce #1 on group 'world' passed its deadline \(([\d.]+) s away "
                      r"when it began\) after ([\d.]+) s", text)
    assert found, text
    had, waited = map(float, found.groups())
    assert had < 6 - 1 and abs(waited - had) < 0.5, text  # what it had, and waited it out
    assert session.result("test_good_after") == "passed"


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.parametrize("name, value", [("TORCH_FR_BUFFER_SIZE", "abc"),
                                         ("TORCH_NCCL_ENABLE_MONITORING", "maybe")])
def test_warm_ranks_that_torch_would_abort_fail_the_test_at_once_naming_the_variable(
        tmp_path: Path, name: str, value: str) -> None:
    # torch aborts a rank on such a Flight Recorder size: the pool would wait 90 s for it
    session = run_suite(tmp_path, {"test_env.py": HEADER + GOOD}, [], timeout=60,
                        env={name: value})
    assert session.result("test_good_after") == "failed", session.output
    text = session.text("test_good_after")
    assert f"the warm ranks cannot start: {name}={value!r}" in text, text
    assert session.wall_s < 30, session.wall_s
