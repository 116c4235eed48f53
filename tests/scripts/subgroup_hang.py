"""Several nodes: ``subgroup_hang.py HANGING_RANK``: a sub-group of ranks 1 and 3 (one on each
of two nodes of two ranks). Every rank does 4 world all_reduces; ranks 0 and 2 then end well,
and ranks 1 and 3 go on in their sub-group alone. HANGING_RANK (1 or 3) sleeps for good before
the sub-group's first all_reduce: its peer, on the other node, is the only rank waiting."""
import sys
import time

import torch
import torch.distributed as dist

hanging = int(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
pair = dist.new_group([1, 3])
for step in range(1, 5):
    dist.all_reduce(torch.ones(1))
    if step == 1:
        print("STEPPED", flush=True)
    time.sleep(0.02)
if rank in (1, 3):
    if rank == hanging:
        time.sleep(100000)
    for _ in range(100000):
        dist.all_reduce(torch.ones(1), group=pair)
        time.sleep(0.02)
