"""All-reduce loop that rank 1 leaves early: ``leave_early.py HOW [STEP]``.

At step STEP (default 10) rank 1 leaves before its all-reduce, by HOW: ``exit3``
(``sys.exit(3)``), ``exit0`` (``sys.exit(0)``), ``os_exit0`` (``os._exit(0)``) or ``return`` (its
script simply ends); rank 0 goes on to the all-reduce."""
import os
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    how = sys.argv[1]
    leave_at = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    dist.init_process_group("gloo")
    t = torch.ones(8)
    for step in range(400):
        if dist.get_rank() == 1 and step == leave_at:
            print(f"rank 1 leaves by {how}", flush=True)
            if how == "exit3":
                sys.exit(3)
            if how == "exit0":
                sys.exit(0)
            if how == "os_exit0":
                os._exit(0)
            return
        dist.all_reduce(t)
        time.sleep(0.01)


main()
