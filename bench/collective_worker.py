"""The rank script of bench/collective_overhead.py: plain torch.distributed, no rankguard import.

    python collective_worker.py SIZE:ITERS [SIZE:ITERS ...]

For each SIZE (bytes of float32): a warm-up of ITERS // 10 all_reduces (at least 10), a barrier,
then ITERS all_reduces timed. Around each timed loop rank 0 prints ``RGBENCH-BEGIN SIZE`` and
``RGBENCH-END SIZE`` (the bench samples its launcher's CPU between them), and every rank prints
``RGBENCH {json}``: its time per all_reduce and the CPU each of its threads used during the loop
(``/proc/self/task/*/schedstat``, nanoseconds), threads named by Python's ``threading`` where
Python started them (rankguard's are ``rankguard-...``), ``main`` for the main thread and
``native`` for the others (gloo's, torch's).
"""
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist


def say(line: str) -> None:
    """One write per line: the ranks' lines share a pipe under torchrun, and must not mix."""
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


def thread_cpu() -> dict[int, int]:
    """CPU nanoseconds used so far by each thread of this process, by thread id."""
    used = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                used[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
    return used


def thread_names() -> dict[int, str]:
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    names[threading.main_thread().native_id] = "main"
    return names


def timed_loop(numel: int, iters: int) -> dict:
    t = torch.ones(numel)
    for _ in range(max(10, iters // 10)):
        dist.all_reduce(t)
    dist.barrier()
    if dist.get_rank() == 0:
        say(f"RGBENCH-BEGIN {numel * 4}")
    before = thread_cpu()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    wall = time.perf_counter() - start
    after = thread_cpu()
    if dist.get_rank() == 0:
        say(f"RGBENCH-END {numel * 4}")
    names = thread_names()
    threads: dict[str, float] = {}
    for tid, used in after.items():
        name = names.get(tid, "native")
        threads[name] = threads.get(name, 0.0) + (used - before.get(tid, 0)) / 1e9
    return {"rank": dist.get_rank(), "size": numel * 4, "iters": iters, "wall_s": wall,
            "us_per_op": wall / iters * 1e6, "threads": threads,
            "group": type(dist.group.WORLD).__name__}


def main() -> None:
    loops = [tuple(int(x) for x in arg.split(":")) for arg in sys.argv[1:]]
    dist.init_process_group("gloo")
    for size, iters in loops:
        result = timed_loop(max(1, size // 4), iters)
        say("RGBENCH " + json.dumps(result))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
