"""Ranks step together, then rank 1 sleeps forever while the others wait in monitored_barrier."""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4)
for _ in range(10):
    dist.all_reduce(t)
if dist.get_rank() == 1:
    time.sleep(3600)
dist.monitored_barrier()
