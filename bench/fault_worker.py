"""The job both launchers run in bench/launcher_bench.py. Writes timestamps to $BENCH_DIR.

Every rank writes its pid (pid.RANK.ATTEMPT) and the wall time of its first completed all-reduce
(step.RANK.ATTEMPT). In attempt 0, rank FAULT_RANK performs FAULT (kill | stop) before all-reduce
number FAULT_AT, writing the time first (fault.ATTEMPT).
"""
import os
import signal
import time

import torch
import torch.distributed as dist

out = os.environ["BENCH_DIR"]
fault = os.environ.get("FAULT", "")
fault_rank = int(os.environ.get("FAULT_RANK", "1"))
fault_at = int(os.environ.get("FAULT_AT", "20"))
steps = int(os.environ.get("STEPS", "60"))
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
rank = int(os.environ["RANK"])


def note(name, value):
    with open(os.path.join(out, f"{name}.{attempt}"), "a") as f:
        f.write(f"{value}\n")


note(f"pid.{rank}", os.getpid())
dist.init_process_group("gloo")
t = torch.ones(256)
for i in range(1, steps + 1):
    if fault and attempt == 0 and rank == fault_rank and i == fault_at:
        note("fault", time.time())
        os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    dist.all_reduce(t)
    if i == 1:
        note(f"step.{rank}", time.time())
    time.sleep(0.02)
dist.destroy_process_group()
