"""Writes one line to stdout and one to stderr per rank, around one gloo all_reduce:
``two_streams.py``; prints ROLE_NAME and LOCAL_RANK too."""
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
rank = dist.get_rank()
print(f"out rank={rank} sum={int(t.item())} role={os.environ['ROLE_NAME']}", flush=True)
print(f"err rank={rank} local_rank={os.environ['LOCAL_RANK']}", file=sys.stderr, flush=True)
dist.destroy_process_group()
