"""NCCL ranks for the GPU set's /proc checks: ``nccl_sleeper.py FOLDER``: every rank on GPU 0
(``NCCL_HOSTID`` per rank), 10 all-reduces, then rank 1 writes its pid to FOLDER/rank1 and
sleeps (a plain sleep: frozen), while rank 0 enqueues 10 more and waits for its GPU
(``torch.cuda.synchronize()`` behind the all-reduce rank 1 never joins), pid in FOLDER/rank0.
Both are killed by the test."""
import os
import sys
import time

import torch
import torch.distributed as dist

from gpu0 import join_nccl

folder = sys.argv[1]
rank = join_nccl()
t = torch.ones(1024, device="cuda")
for _ in range(10):
    dist.all_reduce(t)
torch.cuda.synchronize()
with open(os.path.join(folder, f"rank{rank}"), "w") as f:
    f.write(str(os.getpid()))
if rank == 1:
    time.sleep(600)
for _ in range(10):
    dist.all_reduce(t)
torch.cuda.synchronize()
