"""A rank program that a --no-python wrapper starts: ``rankguard.init()`` (which finds the
launcher's ledger in the environment), then all_reduces in which rank 1 freezes at the 4th."""
import time

import torch
import torch.distributed as dist

import rankguard

rankguard.init()
dist.init_process_group("gloo")
t = torch.ones(1)
for step in range(5):
    if dist.get_rank() == 1 and step == 3:
        time.sleep(600)
    dist.all_reduce(t)
dist.destroy_process_group()
