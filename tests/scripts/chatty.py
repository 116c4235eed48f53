"""All-reduce loop that prints a lot: ``chatty.py STEPS LINE_BYTES [SLEEP_S [err]]``.

Each step every rank prints one line of LINE_BYTES to stdout (stderr with ``err``); at the end
``DONE rank=R`` to stdout."""
import sys
import time

import torch
import torch.distributed as dist

steps = int(sys.argv[1])
width = int(sys.argv[2])
pause = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
stream = sys.stderr if sys.argv[4:] == ["err"] else sys.stdout
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
for step in range(steps):
    print(f"step {step} " + "x" * width, file=stream, flush=True)
    dist.all_reduce(t)
    time.sleep(pause)
print(f"DONE rank={rank}", flush=True)
dist.destroy_process_group()
