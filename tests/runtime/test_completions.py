"""Completions reach the ledger from the tracker thread, for real gloo works."""

import datetime
import time

import torch
import torch.distributed as dist

from rankguard import ledger
from rankguard.runtime.completions import SWEEP_S, CompletionTracker


def test_completed_works_are_marked_done_in_their_slot_and_released(tmp_path):
    path = str(tmp_path / "r0.ledger")
    ledger.create(path, world_size=1)
    slot = ledger.LedgerWriter(path).world()
    gloo = dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=10))
    tracker = CompletionTracker()
    for _ in range(50):
        slot.enter(ledger.OP_CODES["all_reduce"])
        tracker.add(slot, gloo.allreduce([torch.ones(4)]))
    deadline = time.monotonic() + 50 * SWEEP_S + 5
    reader = ledger.LedgerReader(path)
    while reader.read().groups[0].done < 50 and time.monotonic() < deadline:
        time.sleep(SWEEP_S)
    world = reader.read().groups[0]
    assert (world.entered, world.done, world.waiting) == (50, 50, False)
    tracker.close()
    assert not tracker._thread.is_alive()
