"""The ledger's ring of recent operations: order, completion times however they were recorded,
wrapping, a second writer, a concurrent sweeper (real threads on a real mapping)."""

from __future__ import annotations

import threading

import pytest

from rankguard.records import ledger as L
from rankguard.records import ledger_ring

ALL_REDUCE, BARRIER = L.OP_CODES["all_reduce"], L.OP_CODES["barrier"]


@pytest.fixture
def path(tmp_path):
    file = str(tmp_path / "rank0.ledger")
    L.create(file, 2)
    return file


def _ops(path: str) -> list[L.RecentOp]:
    reader = L.LedgerReader(path)
    try:
        return reader.recent()
    finally:
        reader.close()


def test_operations_are_kept_in_order_with_their_groups(path) -> None:
    writer = L.LedgerWriter(path)
    world = writer.world()
    world.enter(L.OP_CODES["init_process_group"])
    world.step(ALL_REDUCE, 1)
    pair = writer.add_group("pair", [0, 1])
    assert pair is not None
    pair.enter(BARRIER)
    ops = _ops(path)
    assert [(op.number, op.op, op.seq, op.is_world) for op in ops] == [
        (1, "init_process_group", 0, True), (2, "all_reduce", 1, True), (3, "barrier", 1, False)]
    assert ops[2].members == 0b11 and ops[2].group_key == L.group_key("pair")
    assert ops[0].t_enter <= ops[1].t_enter <= ops[2].t_enter


def test_a_completion_recorded_at_the_next_entry_is_timed_by_it(path) -> None:
    world = L.LedgerWriter(path).world()
    world.enter(ALL_REDUCE)
    world.step(ALL_REDUCE, 1)  # the first completed, seen as the second began
    first, second = _ops(path)
    assert first.t_done == second.t_enter
    assert second.t_done is None  # still in progress


def test_a_completion_recorded_by_another_thread_is_seen(path) -> None:
    world = L.LedgerWriter(path).world()
    world.enter(ALL_REDUCE)
    world.enter(BARRIER)
    sweeper = threading.Thread(target=world.done)
    sweeper.start()
    sweeper.join(10)
    first, second = _ops(path)
    assert first.t_done is not None and first.t_done >= first.t_enter
    assert second.t_done is None


def test_completions_after_the_last_record_take_the_slots_latest_time(path) -> None:
    world = L.LedgerWriter(path).world()
    world.enter(ALL_REDUCE)
    world.enter(ALL_REDUCE)
    for _ in range(2):
        world.done()
    ops = _ops(path)
    assert all(op.t_done is not None for op in ops), ops


def test_each_groups_ring_keeps_its_latest_operations_when_it_wraps(path) -> None:
    writer = L.LedgerWriter(path)
    world, pair = writer.world(), writer.add_group("pair", [0, 1])
    assert pair is not None
    total = ledger_ring.WORLD_CAPACITY + 37
    world.enter(ALL_REDUCE)
    for index in range(total - 1):
        world.step(ALL_REDUCE, 1)  # the previous one completed
        if index < ledger_ring.GROUP_CAPACITY + 5:
            pair.enter(BARRIER)
    ops = _ops(path)
    pairs = [op.seq for op in ops if not op.is_world]
    assert pairs == list(range(6, ledger_ring.GROUP_CAPACITY + 6))
    ops = [op for op in ops if op.is_world]
    assert len(ops) == ledger_ring.WORLD_CAPACITY
    assert [op.seq for op in ops] == list(range(37, total))
    assert all(op.t_done is not None for op in ops[:-1]) and ops[-1].t_done is None


def test_a_second_writer_of_the_same_ledger_continues_the_rings(path) -> None:
    L.LedgerWriter(path).world().enter(ALL_REDUCE)
    L.LedgerWriter(path).world().enter(ALL_REDUCE)  # as rankguard.init() in a bootstrapped rank
    assert [(op.number, op.seq) for op in _ops(path)] == [(1, 0), (2, 1)]


def test_a_sweeper_racing_the_issuing_thread_leaves_every_operation_timed(path) -> None:
    """The issuing thread enters operations while another thread records their completions,
    as the completion sweeper does: each operation is seen completed, no earlier than it was
    entered, in order."""
    world = L.LedgerWriter(path).world()
    entered = threading.Semaphore(0)
    count = 300

    def sweep() -> None:
        for _ in range(count):
            if not entered.acquire(timeout=10):
                return
            world.done()

    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    for _ in range(count):
        world.enter(ALL_REDUCE)
        entered.release()
    sweeper.join(20)
    assert not sweeper.is_alive()
    ops = _ops(path)
    assert len(ops) == count
    assert all(op.t_done is not None and op.t_done >= op.t_enter - 1e-6 for op in ops), [
        op for op in ops if op.t_done is None][:3]


def test_a_new_generation_of_a_group_starts_its_entries_again(path) -> None:
    world = L.LedgerWriter(path).world()
    world.enter(ALL_REDUCE)
    world.enter(ALL_REDUCE)  # never completed: the group is rebuilt
    world.reset()
    world.enter(ALL_REDUCE)
    world.step(ALL_REDUCE, 1)
    ops = _ops(path)
    assert [op.seq for op in ops] == [0, 1]  # the old generation's records are forgotten
    assert ops[0].t_done == ops[1].t_enter and ops[1].t_done is None
