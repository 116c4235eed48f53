"""Two ranks that disagree on their next operation: ``mismatch.py world|sub``.

After 30 all-reduces, on the world group (``world``) or on a sub-group of both ranks
(``sub``), rank 0 calls ``recv`` from rank 1 and rank 1 calls ``barrier``."""
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
group = dist.new_group([0, 1]) if sys.argv[1] == "sub" else None
t = torch.ones(8)
for _ in range(30):
    dist.all_reduce(t, group=group)
if dist.get_rank() == 0:
    dist.recv(t, src=1, group=group)
else:
    dist.barrier(group=group)
