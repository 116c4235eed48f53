"""``rankguard.shutdown()`` on an NCCL group, for the GPU set: ``nccl_shutdown.py MODE FOLDER``,
every rank on GPU 0 (a host of its own through ``NCCL_HOSTID``). After 10 all-reduces each rank
keeps a CUDA tensor (its "weights"); ``clean``: every rank calls ``shutdown(5)``; ``missing``:
rank 1 sleeps instead. Each rank that shut down writes FOLDER/rankR.json: the report, how long
the call took, whether its tensor is intact, and a CUDA computation after it."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import rankguard

from gpu0 import join_nccl

mode, folder = sys.argv[1], sys.argv[2]
rankguard.init()
rank = join_nccl()
t = torch.ones(1024, device="cuda")
for _ in range(10):
    dist.all_reduce(t)
    t /= dist.get_world_size()
weights = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
before = float(weights.sum().item())
if mode == "missing" and rank == 1:
    time.sleep(1000)  # never arrives
started = time.monotonic()
report = rankguard.shutdown(5.0)
took = time.monotonic() - started
result = {"clean": report.clean, "missing": list(report.missing), "took": took,
          "intact": float(weights.sum().item()) == before,
          "after": float((torch.ones(4, device="cuda") * 2).sum().item()),
          "initialized": dist.is_initialized()}
with open(os.path.join(folder, f"rank{rank}.json"), "w") as out:
    json.dump(result, out)
