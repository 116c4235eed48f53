"""All-reduces until argv[1] exists; then, in attempt 0, rank 1 exits 1 and the others go on.
Attempts after the first run 5 more all-reduces and finish."""
import os
import sys
import time

import torch
import torch.distributed as dist

trigger = sys.argv[1]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
t = torch.ones(2)
deadline = time.monotonic() + 120
steps = 0
while time.monotonic() < deadline:
    dist.all_reduce(t)
    t.fill_(1)
    steps += 1
    if attempt == 0 and dist.get_rank() == 1 and os.path.exists(trigger):
        os._exit(1)
    if attempt > 0 and steps >= 5:
        break
    time.sleep(0.02)
print(f"OK attempt={attempt} steps={steps}", flush=True)
dist.destroy_process_group()
