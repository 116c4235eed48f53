"""One rank of a real gloo job that reads torch's Flight Recorder (runtime/fr_progress) and
prints what it saw as one JSON line.

    fr_progress_rank.py SCENARIO WORLD_OPS SUB_OPS DUMP_FOLDER

Scenarios:
- ``counts``: WORLD_OPS all_reduces on the default group, then SUB_OPS on a ``new_group`` of
  every rank; reports the counts once each group's completions caught up, and writes torch's
  dump of the rank into DUMP_FOLDER, rank 0's while it waits in one more collective of the
  sub-group that rank 1 joins only after;
- ``pending``: the same, then rank 1 sleeps 1.5 s before one more all_reduce on the default
  group, while rank 0 reads the operations not completed from a helper thread as it waits;
- ``off``: the recorder is turned off by the environment: reports the reader's refusal.

env://, with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE set; ``FR_BACKEND=nccl`` runs the
same on NCCL (every rank on GPU 0, each with its own ``NCCL_HOSTID``). Every wait has a
deadline.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from rankguard.runtime import fr_progress as fr

# gloo records its completions a moment after the call returns (a group's last one may wait
# for its next operation)
CAUGHT_UP_S = 2.0
BACKEND = os.environ.get("FR_BACKEND", "gloo")


def _ones(size: int) -> torch.Tensor:
    return torch.ones(size, device="cuda" if BACKEND == "nccl" else "cpu")


def _upto(reader: fr.FlightRecorderReader) -> dict[int, int | None]:
    """How far each group got, as its entries show (``fr_progress.completed_upto``)."""
    entries = reader.entries(only_active=False)
    return {pg_id: fr.completed_upto(entries, pg_id) for pg_id in {e.pg_id for e in entries}}


def main() -> None:
    scenario, world_ops, sub_ops, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        sys.argv[4]
    recorder = fr.Recorder.NCCL if BACKEND == "nccl" else fr.Recorder.CPU
    if scenario == "off":
        try:
            fr.FlightRecorderReader(recorder)
        except fr.FlightRecorderUnavailable as exc:
            print(json.dumps({"refused": str(exc)}), flush=True)
        return
    if BACKEND == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(BACKEND, timeout=datetime.timedelta(seconds=60))
    reader = fr.FlightRecorderReader(recorder)
    for _ in range(world_ops):
        dist.all_reduce(_ones(4))
    sub = dist.new_group(list(range(dist.get_world_size())))
    for _ in range(sub_ops):
        dist.all_reduce(_ones(2), group=sub)
    report: dict = {}
    if scenario == "pending":
        report["active"] = _pending(reader)
    if BACKEND == "nccl":
        torch.cuda.synchronize()  # nothing is stuck here: every rank joined every collective
    deadline = time.monotonic() + CAUGHT_UP_S
    progress, upto = reader.read(), _upto(reader)
    # torch's gloo count may stay behind for good: the entries show how far each group got
    while any((c.completed if BACKEND == "nccl" else upto.get(pg_id)) != c.enqueued
              for pg_id, c in progress.groups.items()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
        progress, upto = reader.read(), _upto(reader)
    report["groups"] = {pg_id: dataclasses.asdict(c) for pg_id, c in progress.groups.items()}
    report["upto"] = upto
    report["configs"] = {name: dataclasses.asdict(c) for name, c in progress.configs.items()}
    dist.barrier()
    # rank 0 enters one more collective of the sub-group, which rank 1 joins only once both
    # dumps are written: the dumps show a collective rank 1 never reached
    late = dist.all_reduce(_ones(2), group=sub, async_op=True) \
        if dist.get_rank() == 0 else None
    report["dump"] = reader.write_dump(folder, dist.get_rank())
    dist.barrier()
    if late is None:
        dist.all_reduce(_ones(2), group=sub)
    else:
        late.wait(timeout=datetime.timedelta(seconds=30))
    dist.destroy_process_group()
    print(json.dumps(report), flush=True)


def _pending(reader: fr.FlightRecorderReader) -> list[dict]:
    """One more all_reduce on the default group, rank 1 1.5 s late; rank 0's view of the
    operations not completed, read from a helper thread while its main thread waits."""
    seen: list[dict] = []
    if dist.get_rank() == 1:
        time.sleep(1.5)
    else:
        def look() -> None:
            time.sleep(0.5)
            seen.extend(dataclasses.asdict(op) for op in reader.active())

        helper = threading.Thread(target=look, daemon=True)
        helper.start()
    dist.all_reduce(_ones(4))
    if dist.get_rank() == 0:
        helper.join(10.0)
    return seen


if __name__ == "__main__":
    main()
