"""The rank runtime against real faults: real rank processes, real gloo groups, real signals.

Each scenario runs as plain processes (the way an ``mp.spawn`` program does), and the ones the
issue names also under stock torchrun and under ``rankguard run``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from rankguard import margins
from rankguard.processes import proctree
from rankguard.runtime import stacks as rank_stacks

from .ranks import Ranks

GRACE = 3.0
LAUNCHERS = ["plain", "torchrun", "rankguard"]


def launchers(*quick: str) -> list:
    """Every launcher, those not in ``quick`` left to the slow set: the rank's own code path is
    the same under each, so the quick run proves it once."""
    return [name if name in quick else pytest.param(name, marks=pytest.mark.slow)
            for name in LAUNCHERS]


def gone_within(pid: int, timeout: float) -> bool:
    try:
        psutil.Process(pid).wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


def test_sigterm_inside_allreduce_with_frozen_peer_exits_0_within_grace(tmp_path: Path) -> None:
    with Ranks("sigterm_in_collective", 2, tmp_path, env={"SCENARIO_GRACE": str(GRACE)}) as ranks:
        pid = ranks.pid(0)
        ranks.pid(1)
        time.sleep(0.3)  # rank 0 is now blocked in the all_reduce that frozen rank 1 never joins
        started = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        code = ranks.wait(0, GRACE + 2)
        took = time.monotonic() - started
        err = ranks.stderr(0)
    assert code == 0, err
    assert took < GRACE, took
    assert "torn down" in err and "1 process group released" in err, err


@pytest.mark.parametrize("scenario", ["sigterm_idle", "sigterm_cpu"])
def test_sigterm_before_init_or_on_cpu_only_worker_exits_0_without_noise(
        tmp_path: Path, scenario: str) -> None:
    with Ranks(scenario, 1, tmp_path) as ranks:
        pid = ranks.pid(0)
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        code = ranks.wait(0, GRACE + 2)
        err = ranks.stderr(0)
    assert code == 0, err
    assert "Traceback" not in err and "Error" not in err, err
    assert err.count("\n") == 1 and "torn down" in err, err


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.parametrize("launcher", launchers("plain", "rankguard"))
def test_sigterm_inside_allreduce_exits_0_under_each_launcher(tmp_path: Path,
                                                              launcher: str) -> None:
    with Ranks("sigterm_in_collective", 2, tmp_path, launcher,
               env={"SCENARIO_GRACE": str(GRACE)}) as ranks:
        pid = ranks.pid(0)
        frozen = ranks.pid(1)
        time.sleep(0.3)
        os.kill(pid, signal.SIGTERM)
        assert gone_within(pid, GRACE), "rank 0 outlived its grace budget"
        os.kill(frozen, signal.SIGKILL)
        if launcher != "plain":
            ranks.wait_launcher(30)
        out = ranks.output()
    assert "rank 0: SIGTERM: torn down" in out and "exiting 0" in out, out


# A dead rank is a plain-launch case only: under a launcher it ends the job, the launcher's
# own business.
@pytest.mark.parametrize(("fault", "launcher"), [
    ("frozen", "rankguard"),
    *(pytest.param(fault, launcher, marks=pytest.mark.slow)
      for fault, launcher in (("dead", "plain"), ("frozen", "plain"), ("frozen", "torchrun")))])
def test_shutdown_names_the_missing_rank_on_every_rank_within_timeout_plus_1s(
        tmp_path: Path, fault: str, launcher: str) -> None:
    with Ranks(f"shutdown_peer_{fault}", 3, tmp_path, launcher,
               env={"SCENARIO_TIMEOUT": "2"}) as ranks:
        results = [ranks.result(rank) for rank in (0, 1)]
        if launcher == "plain":
            codes = [ranks.wait(rank, 10) for rank in (0, 1)]
            assert codes == [0, 0], ranks.output()  # and no exit blocks on the aborted group
    for result in results:
        assert result["clean"] is False
        assert result["missing"] == [2]
        assert 2.0 <= result["elapsed"] < 3.0
        assert result["initialized"] is False  # aborted: free to exit or start over


STORE_TIMEOUT = 2.0


@pytest.mark.parametrize(("fault", "call"), [
    *(pytest.param(fault, call, marks=pytest.mark.slow)  # 6-10 s each here
      for fault, call in [("frozen", "deadline"), ("dead", "shutdown"), ("frozen", "shutdown"), ("frozen", "regroup"),
                          ("dead", "regroup"), ("dead", "deadline")])])
def test_a_store_host_that_froze_or_died_bounds_every_runtime_call_and_the_exit(
        tmp_path: Path, fault: str, call: str) -> None:
    """Under mp.spawn rank 0 hosts the store: its freeze or death ends shutdown(), regroup()
    and a failed collective's explanation at their bounds, never after the store's own timeout
    (30 minutes)."""
    with Ranks(f"store_host_{fault}_{call}", 3, tmp_path,
               env={"SCENARIO_TIMEOUT": str(STORE_TIMEOUT)}) as ranks:
        results = [ranks.result(rank) for rank in (1, 2)]
        codes = [ranks.wait(rank, 10) for rank in (1, 2)]  # no exit blocks on the store
        output = ranks.output() if codes != [0, 0] else ""
    assert codes == [0, 0], output
    # the runtime's own bound: the timeout, plus asking the peers (a collective) or the last
    # reads of who arrived (shutdown, regroup), 1 s at most, plus this machine's load
    for result in results:
        assert result["elapsed"] < STORE_TIMEOUT + 1.0 + 1.5, result
        if call == "shutdown":
            assert result["clean"] is False and result["initialized"] is False, result
            assert "store" in result["detail"], result
            assert result["again"] is False and result["again_detail"] == result["detail"]
        elif call == "regroup":
            assert result["type"] in ("CollectiveTimeout", "PeerFailed"), result
            assert "store is unreachable" in result["message"], result
        else:
            assert result["type"] in ("CollectiveTimeout", "PeerFailed"), result
            assert result["missing"] in ([], [0]), result  # never the peer that arrived
    if call == "deadline" and fault == "frozen":  # nobody could be asked: it says so
        assert all("could not be asked" in r["message"] for r in results), results


@pytest.mark.slow  # about 15 s
@pytest.mark.parametrize("late", [(2,), (1, 2)], ids=["one", "two_together"])
def test_a_rank_late_to_shutdown_past_the_others_timeout_aborts_too_and_says_why(
        tmp_path: Path, late: tuple[int, ...]) -> None:
    # the late rank completed the barrier and reported clean, destroying a group its peers
    # had aborted: the outcome is now the first view written, the same on every rank; a late
    # rank names none that it saw arrive (two late together named each other, always)
    with Ranks("shutdown_late", 3, tmp_path,
               env={"SCENARIO_LATE": ",".join(map(str, late))}) as ranks:
        results = [ranks.result(rank, timeout=60) for rank in range(3)]
    for rank, result in enumerate(results):
        if rank not in late:
            assert (result["clean"], result["missing"], result["initialized"]) == \
                (False, list(late), False), result
            continue
        assert (result["clean"], result["initialized"]) == (False, False), result
        # never itself, nor a rank it saw arrive: the other late one only if it came first
        assert result["missing"] in ([], [r for r in late if r != rank]), result
        assert "the other ranks stopped waiting at the barrier" in result["detail"], result
        assert result["elapsed"] < 1.5, result  # it found the outcome decided: no wait


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_shutdown_is_clean_and_destroys_the_group_when_every_rank_arrives(tmp_path: Path
                                                                          ) -> None:
    with Ranks("shutdown_all", 3, tmp_path) as ranks:
        results = [ranks.result(rank) for rank in range(3)]
        codes = [ranks.wait(rank, 10) for rank in range(3)]
    assert codes == [0, 0, 0]
    assert all(r["clean"] and r["missing"] == [] and not r["initialized"] for r in results)


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.parametrize("launcher", launchers("rankguard"))
def test_deadline_on_allreduce_with_frozen_peer_raises_collective_timeout_naming_it(
        tmp_path: Path, launcher: str) -> None:
    with Ranks("deadline_peer_frozen", 2, tmp_path, launcher) as ranks:
        result = ranks.result(0)
    assert result["type"] == "CollectiveTimeout"
    assert (result["op"], result["seq"], result["missing"]) == ("all_reduce", 2, [1])
    assert 0.9 <= result["waited"] < 2.0  # the deadline counts from the `with`, not the op
    assert result["elapsed"] < 3.0  # deadline + asking the peers, bounded
    assert "rank 1 did not answer" in result["message"]
    assert result["after"] == "GroupRetired"  # the group is retired, by design


@pytest.mark.parametrize("scenario", [
    "store_host_leaves_first",
    pytest.param("store_host_leaves_first_after_shutdown", marks=pytest.mark.slow)])
def test_a_job_whose_store_host_exits_first_ends_without_a_cpp_stack_dump(
        tmp_path: Path, scenario: str) -> None:
    # rank 1's responder was blocked on rank 0's store: when rank 0 exited (as it does under
    # mp.spawn once its work is done, shutdown() or not), torch printed a C++ warning and
    # its stack dump from rank 1, in a job that ended well
    with Ranks(scenario, 2, tmp_path) as ranks:
        codes = [ranks.wait(rank, 30) for rank in range(2)]
        errs = [ranks.stderr(rank) for rank in range(2)]
    assert codes == [0, 0], errs
    assert "TCPStore" not in errs[1] and "Exception raised" not in errs[1], errs[1]


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_a_barrier_in_a_deadline_with_a_frozen_peer_ends_at_the_deadline_naming_it(
        tmp_path: Path) -> None:
    # dist.barrier() hands its options to the group by keyword: the deadline was not passed
    # to gloo, and the barrier waited for gloo's 30 min
    with Ranks("deadline_barrier_peer_frozen", 2, tmp_path) as ranks:
        result = ranks.result(0, timeout=15)
    assert result["type"] == "CollectiveTimeout", result
    assert (result["op"], result["seq"], result["missing"]) == ("barrier", 2, [1]), result
    assert 0.9 <= result["waited"] < 2.0 and result["elapsed"] < 3.0, result


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_a_send_slower_than_a_wait_slice_arrives_and_a_frozen_senders_recv_ends_at_its_deadline(
        tmp_path: Path) -> None:
    # gloo closes the connection when a send's or recv's wait times out: a bounded recv must
    # not wait in slices (a 50 MB state to a replacement failed so)
    with Ranks("send_recv_slow", 2, tmp_path) as ranks:
        result = ranks.result(0)
    assert result["received"] == 3.0 * 4 * 1024 * 1024, result
    assert result["took"] >= 0.3, result  # it did wait for the late sender
    assert result["type"] == "CollectiveTimeout", result
    assert (result["op"], result["missing"]) == ("recv", [1]), result["message"]
    assert 0.9 <= result["waited"] < 2.0 and result["elapsed"] < 3.0, result


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_regroup_of_three_survivors_after_a_rank_is_killed_then_allreduce_is_correct(
        tmp_path: Path) -> None:
    with Ranks("regroup_after_kill", 4, tmp_path) as ranks:
        results = [ranks.result(rank) for rank in range(3)]
        codes = [ranks.wait(rank, 10) for rank in range(3)]
    assert codes == [0, 0, 0]
    for old_rank, result in enumerate(results):
        assert result["type"] in ("PeerFailed", "GroupRetired"), result
        assert result["generation"] == 1 and result["world_size"] == 3
        assert result["rank"] == old_rank and result["env_rank"] == str(old_rank)
        assert result["value"] == 3.0  # the new group of 3 all-reduces correctly
        assert result["took"] < 10.0  # regroup(timeout=10): within its bound, even under load
    assert any(r["missing"] == [3] for r in results)


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_regroup_probing_a_frozen_peer_keeps_a_timeout_shorter_than_the_probe_windows(
        tmp_path: Path) -> None:
    # the probes of the survivors took their whole windows (0.5 s, then 2 s) whatever the
    # timeout: regroup(timeout=1) returned after 2.5 s, blaming the job's store
    with Ranks("regroup_short_timeout_peer_frozen", 2, tmp_path) as ranks:
        result = ranks.result(0, timeout=30)
    assert result["type"] is None, result  # the silent rank is left out, within the timeout
    assert result["members"] == [0], result
    assert result["elapsed"] < 1.0 + 0.5, result  # regroup(timeout=1): its documented bound


@pytest.mark.slow
def test_a_generation_one_rank_gave_up_on_is_not_formed_later_with_that_rank(
        tmp_path: Path) -> None:
    # rank 0's arrival at generation 2 stays in the store after it gave up and exited: rank 1
    # adopted it and connected to the dead rank for the group's timeout (30 s and more)
    with Ranks("regroup_after_a_solo_failure", 2, tmp_path, launcher="torchrun") as ranks:
        first = ranks.result(0, timeout=30)
        later = ranks.result(1, timeout=30)
    assert (first["type"], first["missing"]) == ("CollectiveTimeout", [1]), first
    assert later["type"] is None, later  # the survivor forms a generation of its own
    assert later["members"] == [1] and later["number"] == 3, later
    # regroup(timeout=15), plus this machine's load: under the group's 30 s
    assert later["elapsed"] < 15.0 + 0.5 + 3.0, later


@pytest.mark.slow  # over 4 s here: out of the quick run
@pytest.mark.parametrize("scenario", ["ddp_peer_dies", "ddp_peer_dies_before_the_first_backward"])
def test_ddp_peer_death_raises_peer_failed_from_backward_not_a_crash(tmp_path: Path,
                                                                    scenario: str) -> None:
    """Also when the all-reduce of DDP's first backward is the rank's first bounded operation
    (rankguard's wrapper of ``backward()`` must be in place before that backward begins)."""
    with Ranks(scenario, 2, tmp_path) as ranks:
        result = ranks.result(0)
        code = ranks.wait(0, 10)
    assert code == 0
    assert result["type"] == "PeerFailed" and result["missing"] == [1]
    assert result["op"] == "all_reduce"
    assert result["cause"] == "RuntimeError"  # gloo's error from inside DDP, chained
    assert result["elapsed"] < 5.0


def test_stacks_on_demand_while_the_main_thread_is_inside_a_collective(tmp_path: Path) -> None:
    with Ranks("sigterm_in_collective", 2, tmp_path) as ranks:
        pid = ranks.pid(0)
        ranks.pid(1)
        time.sleep(0.3)
        stacks = Path(rank_stacks.path_for(pid, {}))  # the default: no RANKGUARD_STACKS
        proctree.signal_main_thread(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 5
        text = ""
        while "sigterm_in_collective" not in text and time.monotonic() < deadline:
            time.sleep(0.05)
            text = stacks.read_text() if stacks.exists() else ""
        alive = psutil.pid_exists(pid)
    stacks.unlink(missing_ok=True)
    assert "in all_reduce" in text and "in sigterm_in_collective" in text, text
    assert text.count("Thread 0x") + text.count("Current thread 0x") >= 3, text
    assert alive  # answering costs the rank nothing: it is still waiting in its collective


@pytest.mark.slow  # 6 s (the 5 s connect floor)
def test_regroup_fails_within_its_connect_bound_when_a_member_dies_after_joining(
        tmp_path: Path) -> None:
    """Every member arrived, so the new group connects; rank 1 died in between: rank 0's
    regroup raises PeerFailed within what was left of its timeout plus the connect floor (5 s),
    not after gloo's 30 min group timeout."""
    with Ranks("regroup_peer_dies_before_connecting", 2, tmp_path) as ranks:
        result = ranks.result(0, timeout=60)
    assert result["type"] == "PeerFailed", result
    assert "did not form: its members did not connect within" in result["message"], result
    assert result["elapsed"] < 2 + margins.CONNECT_FLOOR_S + 10, result  # + this machine's load
    assert not result["initialized"], result


@pytest.mark.slow  # about 10 s (before the fix: 30 s)
def test_regroup_keeps_its_bound_when_a_member_dies_after_publishing_its_address(
        tmp_path: Path) -> None:
    """Of three ranks regrouping (timeout 5 s), the one gloo makes dial both others publishes its
    address and dies before it dials. Gloo lets each survivor wait for it to dial in for five
    times the group's timeout (25 s); their regroup ends within the timeout plus the connect
    floor (a member may join late), plus this machine's load, with PeerFailed and no default
    group, and each survivor exits at once, though a thread of it is still inside gloo."""
    bound = 5 + margins.CONNECT_FLOOR_S + 3.5
    with Ranks("regroup_dialer_dies_after_publishing_its_address", 3, tmp_path,
               store_outside=True) as ranks:
        dead = ranks.first_to_mark("published", timeout=60)
        survivors = [rank for rank in range(3) if rank != dead]
        results = [ranks.result(rank, timeout=60) for rank in survivors]
        codes = [ranks.wait(rank, 15) for rank in survivors]
        ports = [path.read_text() for path in tmp_path.glob("gloo_ports_*")]
    for result in results:
        assert result["type"] == "PeerFailed", (result, ports)
        assert "did not form: its members did not connect within" in result["message"], result
        assert result["elapsed"] < bound, result
        assert not result["initialized"], result
    assert codes == [0, 0], codes


@pytest.mark.slow  # about 8 s
def test_a_connect_that_ends_after_regroup_gave_up_on_it_leaves_a_retired_group_never_used(
        tmp_path: Path) -> None:
    """Of two ranks regrouping, the one gloo makes dial the other publishes its address and is
    stopped before it dials; the other, waiting to be dialed, gives up on the connect at its
    bound (PeerFailed), though gloo still waits. Resumed, the dialer dials in and gloo's connect
    succeeds late: the default group it installs is retired at once, so an all_reduce on it
    raises GroupRetired instead of running. (Which rank dials depends on the ports gloo got:
    their store is hosted outside them so that either may be stopped. Once in about 70 runs
    the waiting rank formed at once, as if it had dialed: a second try then, each rank's view
    of the ports kept for the failure's message.)"""
    seen = []
    for attempt in range(2):
        folder = tmp_path / f"attempt{attempt}"
        with Ranks("regroup_dialer_freezes_after_publishing_its_address", 2, folder,
                   store_outside=True) as ranks:
            dialer = ranks.first_to_mark("published", timeout=60)
            first = ranks.result(1 - dialer, timeout=60)
            seen.append((first, [path.read_text() for path in folder.glob("gloo_ports_*")]))
            if first["type"] is None:
                continue
            os.kill(ranks.pid(dialer, "published"), signal.SIGCONT)
            (folder / "resumed").write_text("")
            late = json.loads(ranks.text("late.json"))
            codes = [ranks.wait(rank, 30) for rank in (0, 1)]
            output = ranks.output()
        assert first["type"] == "PeerFailed" and "never dialed in" in first["message"], seen
        assert first["elapsed"] < margins.CONNECT_FLOOR_S + 3.5, first  # + this machine's load
        assert late == {"initialized": True, "raised": "GroupRetired"}, late
        assert codes == [0, 0], (codes, dialer, output)
        return
    pytest.fail(f"the rank that was to wait formed at once in both tries: {seen}")


@pytest.mark.slow  # about 10 s
def test_a_rank_left_out_by_regroup_shuts_down_at_once_naming_no_peer(tmp_path: Path) -> None:
    # the left-out rank met on its old generation's barrier, which nobody else reaches: it
    # waited its whole timeout, then said "ranks 0, 1 did not arrive" (they had, at theirs)
    with Ranks("shutdown_after_left_out", 3, tmp_path) as ranks:
        results = [ranks.result(r, timeout=60) for r in range(3)]
    for survivor in results[:2]:
        assert survivor["members"] == 2 and survivor["clean"] is True, survivor
    out = results[2]
    assert out["regroup"] == "GroupRetired", out
    assert (out["clean"], out["missing"]) == (False, []), out
    assert "left out of generation 1" in out["detail"], out
    assert out["took"] < 2.0, out  # not the 4 s timeout
