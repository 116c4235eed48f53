"""The default group formed five times by the same processes: ``init_process_group``, a few
all-reduces, ``destroy_process_group``, again. Rank 1 destroys each group 1 s after rank 0,
which forms the next one meanwhile. Prints ``PHASE p DONE rank=R``."""
import time

import torch
import torch.distributed as dist

for phase in range(5):
    dist.init_process_group("gloo")
    t = torch.ones(1)
    for _ in range(3):
        dist.all_reduce(t)
    rank = dist.get_rank()
    if rank == 1:
        time.sleep(1)
    dist.destroy_process_group()
    print(f"PHASE {phase} DONE rank={rank}", flush=True)
