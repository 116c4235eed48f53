"""Several nodes, the pure parts: rank assignment, the round's end record and which one stands,
and the rendezvous options as parsed (no process, no store)."""

import pytest

from rankguard.errors import UsageError
from rankguard.launcher import cli
from rankguard.launcher.config import RendezvousConfig
from rankguard.launcher.monitor import Verdict
from rankguard.launcher.node_agent import left_to_another_node
from rankguard.launcher.outcome import Fault, run_status
from rankguard.launcher.rendezvous import assign
from rankguard.launcher.store_keys import agents_namespace, round_namespace
from rankguard.launcher.round_end import RoundEnd, replaces
from tests.conftest import script


@pytest.mark.parametrize("nprocs, expected", [
    ([2, 2], [(0, 4), (2, 4)]),
    ([1], [(0, 1)]),
    ([1, 3, 2], [(0, 6), (1, 6), (4, 6)]),  # torchrun's order: node after node
])
def test_ranks_are_assigned_node_after_node(nprocs, expected):
    assert assign(nprocs) == expected


def test_each_round_has_its_own_namespaces():
    spaces = {round_namespace("job", n) for n in range(3)} | \
        {agents_namespace("job", n) for n in range(3)}
    assert len(spaces) == 6
    assert all(not a.startswith(b) for a in spaces for b in spaces if a != b)


CRASH = RoundEnd(False, 1, "exited", 2, "exited with code 5")
CASCADE = RoundEnd(False, 0, "raised", 0, "raised an exception inside a collective", True)
OK = RoundEnd(True)


@pytest.mark.parametrize("standing, ours, wins", [
    (CASCADE, CRASH, True),  # the root cause takes the place of its effect
    (CRASH, CASCADE, False),
    (CRASH, RoundEnd(False, 0, "hung", None, "hang: ..."), False),  # the first fault stands
    (CASCADE, RoundEnd(False, 1, "raised", 3, "raised ... inside a collective", True), False),
    (OK, CRASH, False),
    (CASCADE, OK, False),
])
def test_only_a_root_cause_replaces_a_cascade_as_the_rounds_end(standing, ours, wins):
    assert replaces(standing, ours) is wins


def test_a_round_end_survives_the_store_and_names_its_node():
    for end in (CRASH, CASCADE, OK):
        assert RoundEnd.decode(end.encode().encode()) == end
    fault = CRASH.fault(7.0)
    assert fault == Fault("exited", 7.0, 2, "exited with code 5 (node 1)")
    assert fault.describe() == "rank 2 exited with code 5 (node 1)"
    assert run_status(fault, None) == ("failed", 1)
    assert run_status(RoundEnd(False, 0, "hung", None, "hang: x").fault(1.0), None)[1] == 3


def test_a_foreign_value_in_the_end_key_ends_the_round_as_a_fault():
    end = RoundEnd.decode(b"not json")
    assert not end.ok and end.kind == "store_lost" and "not json" in end.detail


def test_a_stopped_agent_ends_the_round_as_its_node_leaving():
    end = RoundEnd.of(Fault("launcher_signal", 1.0, None, "the launcher received SIGTERM"), 1)
    assert (end.ok, end.node, end.kind) == (False, 1, "node_left")
    assert run_status(end.fault(2.0), None) == ("failed", 1)


def _parse(tmp_path, *args):
    return cli.parse(["--log-dir", str(tmp_path), *args, script("node_env.py")])


def test_one_node_has_no_rendezvous(tmp_path):
    for nnodes in ([], ["--nnodes", "1"], ["--nnodes", "1:1"]):
        assert _parse(tmp_path, *nnodes).rendezvous is None


def test_rendezvous_options_are_parsed(tmp_path):
    cfg = _parse(tmp_path, "--nnodes", "2:4", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 "10.0.0.1:29400", "--rdzv-id", "job", "--rdzv-conf",
                 "join_timeout=7,last_call_timeout=2,is_host=0,keep_alive_interval=3")
    rdzv = cfg.rendezvous
    assert rdzv is not None and cfg.run_id == "job"
    assert (rdzv.min_nodes, rdzv.max_nodes, rdzv.host, rdzv.port) == (2, 4, "10.0.0.1", 29400)
    assert (rdzv.join_timeout, rdzv.last_call_timeout, rdzv.is_host) == (7, 2, False)
    assert rdzv.extra == (("keep_alive_interval", "3"),)
    assert rdzv.endpoint == "10.0.0.1:29400"
    v6 = _parse(tmp_path, "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                "[::1]:5", "--rdzv-id", "job").rendezvous
    assert v6 is not None and (v6.host, v6.port, v6.endpoint) == ("::1", 5, "[::1]:5")


def test_a_rank_of_another_node_may_be_injected(tmp_path):
    cfg = _parse(tmp_path, "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 "h:1", "--rdzv-id", "job", "--nproc-per-node", "2", "--inject",
                 "crash:rank=3,at=op1")
    assert cfg.injections[0].rank == 3
    with pytest.raises(UsageError, match="has ranks 0 to 3"):
        _parse(tmp_path, "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1",
               "--rdzv-id", "job", "--nproc-per-node", "2", "--inject", "crash:rank=4,at=op1")


def _stuck(group="world", waited=3.0, reason="stuck_in_collective", hung=True, blamed=(0, 1),
           elsewhere=()):
    # a sub-group's verdict carries its members (the label is for people)
    members = () if group == "world" else tuple(int(r) for r in group.split(" ")[1].split(","))
    return Verdict(hung, blamed, (0, 1), "all_reduce", 5, waited, reason, group=group,
                   elsewhere=elsewhere, members=members)


_IN_PAIR = ((1, "all_reduce #1 on group ranks 1,3"),)


@pytest.mark.parametrize("verdict, nodes, left", [
    (_stuck(), 2, True),  # the other node's agent names the rank that did not arrive
    (_stuck(waited=6.0), 2, False),  # twice --hang-timeout: blamed here, bounded
    (_stuck(), 1, False),  # one node: every member is here
    (_stuck(group="ranks 0,1"), 2, False),  # a sub-group of this node's ranks
    (_stuck(group="ranks 1,2"), 2, True),  # rank 2 is on the other node
    (_stuck(reason="no_progress"), 2, False),  # an absent rank of this node: blamed here
    (_stuck(reason="busy", hung=False), 2, False),  # straggler reports are not held back
    # only the other node's ranks blamed: its agent judges them, seeing their processes
    (_stuck(reason="straggler_timeout", blamed=(2,)), 2, True),
    (_stuck(reason="straggler_timeout", blamed=(2,), waited=6.0), 2, False),  # bounded
    (_stuck(reason="busy", hung=False, blamed=(3,)), 2, True),  # its node reports it
    (_stuck(reason="no_progress", blamed=(1, 2)), 2, False),  # rank 1 is here
    # rank 1, blamed here, waits in another group: what holds that one up may be elsewhere
    (_stuck(reason="no_progress", blamed=(1,), elsewhere=_IN_PAIR), 2, True),
    (_stuck(reason="no_progress", blamed=(1,), elsewhere=_IN_PAIR, waited=6.0), 2, False),
    (_stuck(reason="no_progress", blamed=(1,), elsewhere=_IN_PAIR), 1, False),  # one node
    (_stuck(reason="no_progress", blamed=(0, 1), elsewhere=_IN_PAIR), 2, False),  # 0 is not
    # rank 1 is still in the world's previous all_reduce, which rank 0 got past: its data is
    # due from the other node, which may have gone silent (named there, or here by the beats)
    (_stuck(reason="no_progress", blamed=(1,), elsewhere=((1, "all_reduce #4"),)), 2, True),
    # ... but not when rank 1 is stopped (SIGSTOP): nothing elsewhere holds up a stopped rank
    (_stuck(reason="stopped", blamed=(1,), elsewhere=((1, "all_reduce #4"),)), 2, False),
    (_stuck(reason="stopped", blamed=(1,), elsewhere=_IN_PAIR), 2, False),
])
def test_a_stuck_collective_spanning_nodes_is_left_to_the_other_node_for_a_while(
        verdict, nodes, left):
    assert left_to_another_node(verdict, {0, 1}, nodes, hang_timeout=3.0) is left


NEXT_ROUND_WAIT = {
    "a fixed --nnodes waits for every node up to join_timeout": (
        RendezvousConfig(2, 2, "h", 1, join_timeout=600, last_call_timeout=30),
        ["waits for 2 nodes (--nnodes) to join, up to join_timeout 600 s"],
        ["last_call_timeout"]),
    "MIN:MAX forms last_call_timeout after MIN have joined, at once with MAX": (
        RendezvousConfig(1, 3, "h", 1, join_timeout=600, last_call_timeout=30),
        ["waits for 1 to 3 nodes (--nnodes)", "forms when 3 have joined",
         "last_call_timeout 30 s after 1 have", "--rdzv-conf last_call_timeout=SECONDS"],
        ["up to join_timeout 600 s (--rdzv-conf join_timeout"]),
    "MIN:MAX waits up to join_timeout only while fewer than MIN have joined": (
        RendezvousConfig(2, 4, "h", 1, join_timeout=90, last_call_timeout=5),
        ["last_call_timeout 5 s after 2 have", "with fewer it waits up to join_timeout 90 s"],
        ["600", "30 s"]),
}


@pytest.mark.parametrize("case", NEXT_ROUND_WAIT)
def test_the_next_rounds_wait_is_worded_with_its_true_bound(case):
    cfg, said, unsaid = NEXT_ROUND_WAIT[case]
    line = cfg.next_round_wait
    assert all(part in line for part in said), line
    assert not any(part in line for part in unsaid), line
