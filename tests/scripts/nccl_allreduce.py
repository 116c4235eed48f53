"""An NCCL job for the GPU set: ``nccl_allreduce.py STEPS``: every rank on GPU 0 (each a host of
its own through ``NCCL_HOSTID``, so that NCCL accepts several ranks on one device), STEPS
all-reduces of 1 MB, the sum checked; prints ``OK rank=R backend=B``."""
import sys

import torch
import torch.distributed as dist

from gpu0 import join_nccl

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
join_nccl()
world = dist.get_world_size()
t = torch.ones(256 * 1024, device="cuda")
for _ in range(steps):
    dist.all_reduce(t)
    t /= world
torch.cuda.synchronize()
assert torch.equal(t, torch.ones_like(t)), t
print(f"OK rank={dist.get_rank()} backend={dist.get_backend()}", flush=True)
dist.destroy_process_group()
