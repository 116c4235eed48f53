"""The shared-memory ledger: what a rank writes is what the supervisor reads."""

import sys
import threading

import pytest

from rankguard.records import ledger
from rankguard.errors import LedgerError


def test_writer_entries_are_read_back_per_group(tmp_path):
    path = str(tmp_path / "r0.ledger")
    ledger.create(path, world_size=4)
    writer, reader = ledger.LedgerWriter(path), ledger.LedgerReader(path)
    world = writer.world()
    world.enter(ledger.OP_CODES["init_process_group"])
    world.done()
    world.enter(ledger.OP_CODES["all_reduce"])
    sub = writer.add_group("5", [1, 3])
    sub.enter(ledger.OP_CODES["broadcast"])
    snap = reader.read()
    assert snap.pid > 0
    w, s = snap.groups
    assert (w.is_world, w.entered, w.done, w.kind, w.waiting) == (True, 2, 1, "all_reduce", True)
    assert w.member_ranks(4) == [0, 1, 2, 3]
    assert (s.is_world, s.member_ranks(4), s.kind) == (False, [1, 3], "broadcast")
    assert writer.in_collective()


def test_a_reused_sub_group_slot_holds_the_new_group_alone(tmp_path):
    # a mixed default group's gloo half made anew (after a regroup) takes over its old slot
    path = str(tmp_path / "r0.ledger")
    ledger.create(path, world_size=3)
    writer, reader = ledger.LedgerWriter(path), ledger.LedgerReader(path)
    old = writer.add_group(ledger.WORLD_GLOO_HALF, [0, 1, 2])
    old.publish(ledger.OP_CODES["all_reduce"], 7, -1, 6, 1.0, 1.0, on_host=True)
    new = writer.reuse_group(old, ledger.WORLD_GLOO_HALF, [0, 2])
    (slot,) = [g for g in reader.read().groups if not g.is_world]
    assert (slot.key, slot.member_ranks(3), slot.entered, slot.done, slot.asynchronous) == (
        ledger.group_key(ledger.WORLD_GLOO_HALF), [0, 2], 0, 0, False)
    new.publish(ledger.OP_CODES["broadcast"], 2, -1, 1, 2.0, 2.0, on_host=True)
    (slot,) = [g for g in reader.read().groups if not g.is_world]
    assert (slot.entered, slot.done, slot.kind, slot.asynchronous) == (2, 1, "broadcast", True)


def test_fault_and_flags_are_recorded(tmp_path):
    path = str(tmp_path / "r0.ledger")
    ledger.create(path, world_size=2)
    writer = ledger.LedgerWriter(path)
    writer.set_flag(ledger.FLAG_STACKS_READY)
    writer.record_fault(ledger.FAULT_RAISED, in_collective=True)
    snap = ledger.LedgerReader(path).read()
    assert snap.stacks_ready and snap.fault == ledger.FAULT_RAISED and snap.fault_in_collective
    assert snap.t_fault >= snap.t_start > 0


def test_a_notice_carries_the_supervisors_refusal_cut_at_a_characters_end(tmp_path):
    path = str(tmp_path / "r0.ledger")
    ledger.create(path, world_size=2)
    writer = ledger.LedgerWriter(path)
    ledger.post_notice(path, ledger.NOTICE_DIED, 1)
    assert writer.notice() == ("died", 1) and writer.refusal() is None  # a replacement comes
    why = "é" * ledger.REFUSAL_TEXT_MAX  # two bytes a character: cut at the 127th
    ledger.post_notice(path, ledger.NOTICE_HUNG, 1, why)
    assert writer.notice() == ("hung", 1)
    assert writer.refusal() == "é" * (ledger.REFUSAL_TEXT_MAX // 2)
    writer.clear_notice()  # a regroup that formed meanwhile: the attempt ends all the same
    assert writer.refusal() == "é" * (ledger.REFUSAL_TEXT_MAX // 2)


def test_foreign_file_is_refused(tmp_path):
    path = tmp_path / "junk"
    path.write_bytes(b"x" * ledger.SIZE)
    with pytest.raises(LedgerError, match="magic"):
        ledger.LedgerReader(str(path))
    with pytest.raises(LedgerError, match="cannot open"):
        ledger.LedgerReader(str(tmp_path / "missing"))


def _slot(entered: int) -> ledger.GroupProgress:
    return ledger.GroupProgress(key=0, members=0, is_world=True, size=3, entered=entered,
                                done=entered - 1, kind="all_reduce", t_enter=0.0, t_done=0.0)


@pytest.mark.parametrize("entries, target, expected", [
    ({0: 5, 1: 5, 2: 5}, None, ([], 5)),
    ({0: 5, 1: 4, 2: 5}, None, ([1], 5)),
    ({0: 5, 2: 3}, None, ([1, 2], 5)),         # rank 1 has no slot: it entered nothing
    ({0: 5, 1: 4, 2: 3}, 4, ([2], 4)),          # judged against a given operation number
    ({}, None, ([0, 1, 2], 0)),
])
def test_behind_names_members_short_of_the_furthest_entry(entries: dict, target: int | None,
                                                           expected: tuple) -> None:
    slots = {rank: _slot(entered) for rank, entered in entries.items()}
    assert ledger.behind(range(3), slots, target) == expected


def test_a_step_records_the_entry_and_earlier_completions_in_one_write(tmp_path):
    path = str(tmp_path / "r0.ledger")
    ledger.create(path, world_size=2)
    world = ledger.LedgerWriter(path).world()
    reader = ledger.LedgerReader(path)
    assert world.step(ledger.OP_CODES["init_process_group"], 0) == 1
    first = reader.read().groups[0]
    assert (first.entered, first.done, first.t_done) == (1, 0, 0.0)
    assert world.step(ledger.OP_CODES["all_reduce"], 1) == 2
    got = reader.read().groups[0]
    assert (got.entered, got.done, got.kind, got.waiting) == (2, 1, "all_reduce", True)
    assert got.t_done == got.t_enter > first.t_enter  # one clock read for both


def test_completions_marked_by_another_thread_are_never_lost(tmp_path):
    """The completion sweeper's ``done`` races the issuing thread's ``step``: every count
    reaches the ledger (thread switches forced as often as the interpreter allows)."""
    path = str(tmp_path / "r0.ledger")
    ledger.create(path, world_size=1)
    world = ledger.LedgerWriter(path).world()
    n = 20000
    for _ in range(n):
        world.step(ledger.OP_CODES["all_reduce"], 0)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        sweeper = threading.Thread(target=lambda: [world.done() for _ in range(n)])
        sweeper.start()
        for _ in range(n):
            world.step(ledger.OP_CODES["all_reduce"], 1)
        sweeper.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not sweeper.is_alive()
    got = ledger.LedgerReader(path).read().groups[0]
    assert (got.entered, got.done) == (2 * n, 2 * n)


def test_an_asynchronous_groups_progress_is_read_back_with_its_started_count(tmp_path):
    path = str(tmp_path / "r0")
    ledger.create(path, world_size=2)
    writer = ledger.LedgerWriter(path)
    sub = writer.add_group("1", [0, 1])
    assert sub is not None
    sub.publish(ledger.OP_CODES["all_reduce"], 51, 50, 49, 12.5, 11.0)
    writer.world().enter(ledger.OP_CODES["init_process_group"])
    world, group = ledger.LedgerReader(path).read().groups
    assert not world.asynchronous and world.started == -1
    assert (group.asynchronous, group.entered, group.started, group.done) == (True, 51, 50, 49)
    assert (group.kind, group.t_enter, group.t_done) == ("all_reduce", 12.5, 11.0)
    # torch numbers an asynchronous group's collectives from 1: no init entry to skip
    assert (group.current, group.seq, group.waiting) == (50, 50, True)
    assert writer.in_collective()
    sub.reset()
    again = ledger.LedgerReader(path).read().groups[1]
    assert (again.asynchronous, again.entered, again.done) == (False, 0, 0)


@pytest.mark.parametrize("is_world, asynchronous, done, stepped", [
    (True, False, 1, False),  # the world's first entry is init_process_group
    (True, False, 2, True),
    (True, True, 1, True),  # torch's numbers: the first collective is 1
    (False, False, 1, True),
    (False, True, 0, False),
])
def test_a_group_has_stepped_once_its_first_collective_completed(is_world, asynchronous, done,
                                                                 stepped):
    group = ledger.GroupProgress(0, 3, is_world, 2, done, done, "all_reduce", 0.0, 0.0,
                                 asynchronous=asynchronous)
    assert group.stepped is stepped


@pytest.mark.parametrize("args, label", [
    (("all_reduce", 57), "all_reduce #57"),
    (("init_process_group", 0), "init_process_group"),
    (("barrier", 3, "ranks 0,2"), "barrier #3 on group ranks 0,2"),
    # a recorded group's operation whose kind no rank has learnt yet
    (("none", 11), "collective #11"),
    (("none", 2, "ranks 1,3"), "collective #2 on group ranks 1,3"),
])
def test_an_operation_is_labelled_by_kind_and_number(args, label) -> None:
    assert ledger.op_label(*args) == label


def test_an_operation_whose_kind_is_not_known_is_shown_as_a_collective() -> None:
    assert (ledger.op_shown("none"), ledger.op_shown("broadcast")) == ("collective", "broadcast")


def test_injected_faults_and_the_last_step_are_read_back(tmp_path):
    path = str(tmp_path / "r0.ledger")
    ledger.create(path, world_size=2)
    writer, reader = ledger.LedgerWriter(path), ledger.LedgerReader(path)
    fresh = reader.injections()
    assert (fresh.fired, fresh.step, fresh.op, fresh.bootstrapped) == (frozenset(), None, 0, False)
    writer.set_flag(ledger.FLAG_BOOTSTRAPPED)
    world = writer.world()
    for kind in ("init_process_group", "all_reduce", "all_reduce"):
        world.enter(ledger.OP_CODES[kind])
    writer.record_step(0)
    writer.record_step(7)
    writer.record_injection(0)
    writer.record_injection(ledger.MAX_INJECTIONS - 1)
    seen = reader.injections()
    assert seen.fired == {0, ledger.MAX_INJECTIONS - 1}
    assert (seen.step, seen.op, seen.bootstrapped) == (7, 2, True)  # init is no collective
