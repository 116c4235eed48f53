"""Rank 0's own tail of ``init_process_group`` (the store connection rankguard's probes use,
made once the group is formed) takes ``SECONDS`` (a store slow to answer on a loaded machine);
rank 1 went on and computes for ``SECONDS`` + 2 outside any collective. Then both all-reduce
five times and print ``OK rank=R``. Run in bounded mode (``--collective-timeout``), where the
probes are set up."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

import rankguard.runtime.probe as probe

SECONDS = float(sys.argv[1])
connect = probe.clone_client


slowed: list[bool] = []


def clone_client(*args, **kwargs):
    if os.environ["RANK"] == "0" and not slowed:
        slowed.append(True)
        time.sleep(SECONDS)  # the injected fault: this rank's store answers slowly, once
    return connect(*args, **kwargs)


probe.clone_client = clone_client
dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 1:
    end = time.monotonic() + SECONDS + 2
    while time.monotonic() < end:  # computing: no peer waits for it
        sum(range(1000))
for _ in range(5):
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    assert tensor.item() == 2
print(f"OK rank={rank}", flush=True)
