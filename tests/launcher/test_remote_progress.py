"""The other nodes' ranks from their beats, as the hang rules see them: decoding (bad values
left out), when each rank's progress was first seen, and the verdict a node makes about its own
rank when every rank waiting for it is on another node. Tables over plain values, no clock."""

from __future__ import annotations

import pytest

from rankguard.records import ledger as L
from rankguard.records.beats import (beat_async, beat_entry, beat_left, decode, decode_async,
                                     decode_ranks, encode)
from rankguard.records.ledger_ring import wall_offset
from rankguard.launcher.outcome import remote_departure
from rankguard.launcher.monitor import Activity, HangRules
from rankguard.launcher.remote_progress import RemoteProgress
from tests.launcher.snapshots import leaving, ledger, raised_in, world

ALL_REDUCE = L.OP_CODES["all_reduce"]
HANG = 3.0


def _beat(*ranks: list[int], seq: int = 1) -> bytes:
    return encode(seq, "h1", list(ranks)).encode()


@pytest.mark.parametrize("value, expected", [
    (_beat([2, 6, 5, ALL_REDUCE], [3, 6, 6, ALL_REDUCE]),
     [[2, 6, 5, ALL_REDUCE], [3, 6, 6, ALL_REDUCE]]),
    (_beat([2, 6, 5], [3, "x", 1, 2], [4, 1, 1, 2], [5, 1.5, 1, 2], 7),
     [[4, 1, 1, ALL_REDUCE]]),  # bad entries
    (b"not json", []),
    (b'{"seq": 1, "ranks": 7}', []),
    (b'{"seq": 1}', []),
])
def test_a_beats_ranks_are_decoded_and_what_is_not_ours_is_left_out(value, expected):
    assert decode_ranks(value) == expected


@pytest.mark.parametrize("code, name", [(ALL_REDUCE, "all_reduce"), (999, "op999"),
                                        (-1, "op-1")])
def test_kind_codes_are_named_as_the_ledger_names_them(code, name):
    assert L.op_name(code) == name


def test_a_ranks_progress_dates_from_when_it_was_first_seen_as_it_is():
    remote = RemoteProgress(world_size=4, local={0, 1})
    remote.update({1: (_beat([2, 6, 5, ALL_REDUCE], [3, 5, 5, ALL_REDUCE], seq=1), 10.0)})
    # a new beat: rank 2 unchanged (still since 10.0), rank 3 entered a new operation
    remote.update({1: (_beat([2, 6, 5, ALL_REDUCE], [3, 6, 5, ALL_REDUCE], seq=2), 11.0)})
    assert remote.snapshots(cutoff=9.0, local_waiting=False) == {}  # nobody waited long enough
    snaps = remote.snapshots(cutoff=10.0, local_waiting=False)  # rank 2 has, since 10.0
    assert snaps == remote.snapshots(cutoff=0.0, local_waiting=True)
    assert sorted(snaps) == [2, 3]
    two, three = snaps[2].groups[0], snaps[3].groups[0]
    assert (two.entered, two.done, two.waiting, two.last_event) == (6, 5, True, 10.0)
    assert (three.entered, three.done, three.last_event) == (6, 5, 11.0)
    assert two.is_world and two.key == L.group_key("world") and two.member_ranks(4) == [0, 1, 2, 3]


def test_this_nodes_ranks_and_ranks_outside_the_world_are_not_taken_from_a_beat():
    remote = RemoteProgress(world_size=4, local={0, 1})
    remote.update({1: (_beat([0, 9, 9, ALL_REDUCE], [7, 1, 1, ALL_REDUCE],
                             [-1, 1, 1, ALL_REDUCE], [2, 1, 1, ALL_REDUCE]), 5.0)})
    assert sorted(remote.snapshots(0.0, local_waiting=True)) == [2]


def test_a_rank_waited_for_only_by_another_nodes_ranks_is_named_by_its_own_node():
    """Node 1 holds rank 1 alone; rank 0, on node 0, waits in all_reduce #5 since T=1.0.
    Node 1's rules, given rank 0 from node 0's beat, name rank 1 as frozen."""
    remote = RemoteProgress(world_size=2, local={1})
    remote.update({0: (_beat([0, 6, 5, ALL_REDUCE]), 1.0)})
    snaps = {**remote.snapshots(1.0, local_waiting=False), 1: ledger(world(5))}
    activity = {0: Activity(0.0), 1: Activity(idle_s=HANG)}
    rules = HangRules(2, HANG, 20.0)
    assert rules.judge(snaps, activity, (), now=1.0 + HANG - 0.1) == []  # not waited enough
    [verdict] = rules.judge(snaps, activity, (), now=1.0 + HANG)
    assert (verdict.hung, verdict.blamed, verdict.waiting, verdict.reason) == (
        True, (1,), (0,), "no_progress")
    assert verdict.describe() == ("rank 1 never reached all_reduce #5 (made no progress); "
                                  "rank 0 waited 3.0 s")


def test_a_remote_rank_waiting_in_init_is_not_a_waiter_nodes_start_at_different_times():
    """Node 0's ranks wait in init_process_group (warm spares) while node 1's own ranks are
    still importing torch: node 1 must not call its own starting ranks hung."""
    remote = RemoteProgress(world_size=4, local={2, 3})
    init = L.OP_CODES["init_process_group"]
    remote.update({0: (_beat([0, 1, 0, init], [1, 1, 0, init]), 1.0)})
    snaps = {**remote.snapshots(1.0, local_waiting=True), 2: ledger(world(0)), 3: ledger(world(0))}
    assert not snaps[0].groups[0].waiting and snaps[0].groups[0].entered == 1
    frozen = Activity(idle_s=10 * HANG)
    activity = {0: Activity(0.0), 1: Activity(0.0), 2: frozen, 3: frozen}
    assert HangRules(4, HANG, 20.0).judge(snaps, activity, (), now=1.0 + 10 * HANG) == []


def test_a_sub_group_spanning_nodes_names_its_absent_member_on_that_members_node():
    """Ranks 0,1 on node 0, ranks 2,3 on node 1, a sub-group of ranks 1 and 3. Rank 1 waits in
    the sub-group's all_reduce #3 since T=1.0 (the world group idle); rank 3, node 1's own,
    never got there. Node 1's rules, given rank 1's sub-group from node 0's beat, name rank 3
    in that group."""
    key, members = L.group_key("tp"), 0b1010
    remote = RemoteProgress(world_size=4, local={2, 3})
    beat = _beat([0, 8, 8, ALL_REDUCE], [1, 8, 8, ALL_REDUCE, key, members, 3, 2, ALL_REDUCE])
    remote.update({0: (beat, 1.0)})
    snaps = remote.snapshots(1.0, local_waiting=False)  # rank 1 waits since 1.0
    tp = snaps[1].groups[1]
    assert (tp.key, tp.is_world, tp.member_ranks(4), tp.size) == (key, False, [1, 3], 2)
    assert (tp.entered, tp.done, tp.last_event) == (3, 2, 1.0)
    local_tp = L.GroupProgress(key, members, False, 2, 2, 2, "all_reduce", 0.5, 0.5)
    snaps = {**snaps, 2: ledger(world(8)), 3: ledger(world(8), local_tp)}
    activity = {0: Activity(0.0), 1: Activity(0.0), 2: Activity(0.0),
                3: Activity(idle_s=HANG)}
    [verdict] = HangRules(4, HANG, 20.0).judge(snaps, activity, (), now=1.0 + HANG)
    assert (verdict.hung, verdict.blamed, verdict.waiting, verdict.reason, verdict.group) == (
        True, (3,), (1,), "no_progress", "ranks 1,3")


def test_a_beat_entry_carries_every_group_and_decodes_to_itself():
    snap = ledger(world(8, 7), L.GroupProgress(L.group_key("tp"), 0b1010, False, 2, 3, 2,
                                               "broadcast", 0.0, 0.0))
    entry = beat_entry(1, snap)
    assert entry == [1, 8, 7, ALL_REDUCE, L.group_key("tp"), 0b1010, 3, 2,
                     L.OP_CODES["broadcast"]]
    assert decode_ranks(_beat(entry)) == [entry]
    remote = RemoteProgress(world_size=4, local=set())
    remote.update({0: (_beat([*entry[:-1], "x"]), 1.0)})  # a sub-group field not a number
    assert [g.is_world for g in remote.snapshots(0.0, local_waiting=True)[1].groups] == [True]
    assert decode_ranks(_beat(entry[:-1])) == []  # a group cut short is not ours


def test_a_ranks_asynchronous_groups_travel_in_the_beat_with_their_started_count():
    nccl = L.GroupProgress(L.group_key("world"), 0b11, True, 2, 60, 50, "all_reduce", 0.0, 0.0,
                           51, True)
    sub = L.GroupProgress(L.group_key("tp"), 0b11, False, 2, 4, 4, "broadcast", 0.0, 0.0)
    snap = ledger(nccl, sub)
    assert beat_async(1, snap) == [[1, 0, 51]]
    value = encode(1, "h1", [beat_entry(1, snap)], beat_async(1, snap)).encode()
    assert decode_async(value) == {(1, 0): 51}
    assert decode_async(_beat(beat_entry(1, snap))) == {}  # a gloo-only beat has none
    assert decode_async(b'{"async": [[1, 0, "x"], [2], 7]}') == {}  # not ours: left out
    remote = RemoteProgress(world_size=2, local={0})
    remote.update({1: (value, 4.0)})
    world, tp = remote.snapshots(0.0, local_waiting=True)[1].groups
    assert (world.asynchronous, world.started, world.entered, world.done) == (True, 51, 60, 50)
    assert (tp.asynchronous, tp.started) == (False, -1)


def test_a_remote_nccl_rank_in_its_first_collective_is_shown_waiting_in_it():
    nccl = L.GroupProgress(L.group_key("world"), 0b11, True, 2, 1, 0, "all_reduce", 0.0, 0.0,
                           0, True)
    snap = ledger(nccl)
    remote = RemoteProgress(world_size=2, local={0})
    remote.update({1: (encode(1, "h1", [beat_entry(1, snap)], beat_async(1, snap)).encode(),
                       4.0)})
    [world] = remote.snapshots(0.0, local_waiting=True)[1].groups
    assert (world.entered, world.done, world.waiting) == (1, 0, True)  # not init_process_group


def test_a_rank_that_left_with_code_0_travels_in_the_beat_with_when_it_left():
    offset = wall_offset()
    assert beat_left(1, leaving(11, 5.0, 0), offset) == [1, round((5.0 + offset) * 1000)]
    assert beat_left(1, leaving(11, 5.0, 3), offset) is None  # a non-zero exit: its own fault
    assert beat_left(1, ledger(world(11)), offset) is None  # still running
    value = encode(1, "h1", [beat_entry(1, leaving(11, 5.0, 0))], None,
                   [beat_left(1, leaving(11, 5.0, 0), offset)]).encode()
    assert decode(value).left == {1: round((5.0 + offset) * 1000) / 1000}
    assert decode(b'{"left": [[1, "x"], [2], 7, [3, 4.5]]}').left == {}  # not ours: left out
    remote = RemoteProgress(world_size=3, local={0})
    remote.update({1: (value, 6.0)})
    (progress, left_at), = remote.departures().values()
    assert progress.groups[0].entered == 11 and abs(left_at - 5.0) < 0.01
    assert remote.node_of(1) == 1 and remote.node_of(2) is None


DEPARTURES = {
    "a rank of another node left before the collective this node's rank failed in": (
        {1: (ledger(world(11)), 1.0)}, {0: raised_in(12, 1.2)}, 1.3,
        "rank 1 exited with code 0 before all_reduce #11 (rank 0 went on to it)"),
    "a rank that left after the same number of collectives explains nothing": (
        {1: (ledger(world(12)), 1.0)}, {0: raised_in(12, 1.2)}, 1.3, None),
    "the earliest of two departures is named": (
        {1: (ledger(world(11)), 1.1), 2: (ledger(world(11)), 1.0)}, {0: raised_in(12, 1.2)},
        1.3, "rank 2 exited with code 0 before all_reduce #11 (rank 0 went on to it)"),
    "no departure: this node's error stands": ({}, {0: raised_in(12, 1.2)}, 1.3, None),
}


@pytest.mark.parametrize(("departed", "local", "now", "named"), DEPARTURES.values(),
                         ids=DEPARTURES.keys())
def test_another_nodes_rank_that_left_early_is_the_cause_of_this_nodes_error(
        departed, local, now, named):
    fault = remote_departure(departed, local, now, hang_timeout=3.0)
    assert (fault.describe() if fault is not None else None) == named
