"""Rank 1 exits 1 after two all-reduces until attempt ``N`` (argv[1]); then every rank succeeds."""
import os
import sys

import torch
import torch.distributed as dist

last_failing = int(sys.argv[1])
dist.init_process_group("gloo")
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
t = torch.ones(4)
for step in range(3):
    dist.all_reduce(t)
    if step == 1 and attempt < last_failing and dist.get_rank() == 1:
        os._exit(1)
print(f"OK attempt={attempt}", flush=True)
dist.destroy_process_group()
