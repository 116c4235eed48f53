"""The rank script of bench/collective_overhead.py: plain torch.distributed, no rankguard import.

    python collective_worker.py SECONDS SIZE[:N] [SIZE[:N] ...]

With ``RGBENCH_BACKEND=nccl`` the tensors are on GPU 0 (each rank a host of its own through
``NCCL_HOSTID``, so that several share one GPU) and each timed span ends with a device
synchronisation; else gloo on CPU.

For each SIZE (bytes of float32): 10 all_reduces, a warm-up of N / 5 (at least 10), a barrier,
then N all_reduces timed (without N: as many as fill SECONDS by rank 0's first 10, the same on
every rank). Around each timed loop rank 0 prints ``RGBENCH-BEGIN SIZE``
and ``RGBENCH-END SIZE`` (the bench samples its launcher's CPU between them), and every rank
prints ``RGBENCH {json}``: its time per all_reduce (and to issue one: on NCCL, the CPU's
enqueue, before the device synchronisation), and the CPU each of its threads used during
the loop (``/proc/self/task/*/schedstat``, nanoseconds), threads named by Python's
``threading`` where Python started them (rankguard's are ``rankguard-...``), ``main`` for the
main thread and ``native`` for the others (gloo's, torch's).
"""
import json
import math
import os
import sys
import threading
import time

if os.environ.get("RGBENCH_PIN"):
    # each rank on its own core, by local rank, before torch and gloo start their threads (they
    # inherit it): the same placement under either launcher, run after run
    _cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {_cores[int(os.environ["LOCAL_RANK"]) % len(_cores)]})

import torch  # noqa: E402 (after the pinning)
import torch.distributed as dist  # noqa: E402

BACKEND = os.environ.get("RGBENCH_BACKEND", "gloo")
if BACKEND == "nccl":
    os.environ.setdefault("NCCL_HOSTID", f"host{os.environ['RANK']}")
    torch.cuda.set_device(0)
DEVICE = torch.device("cuda", 0) if BACKEND == "nccl" else torch.device("cpu")


def settle() -> None:
    """Wait for the device (NCCL: the CPU returns at enqueue)."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


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


def time_per_op(t: torch.Tensor, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    settle()
    return (time.perf_counter() - start) / n


def iterations(per_op: float, seconds: float) -> int:
    """How many all_reduces fill ``seconds``, rank 0's figure on every rank."""
    n = torch.tensor([max(10, math.ceil(seconds / per_op)) if dist.get_rank() == 0 else 0],
                     device=DEVICE)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    return int(n.item())


def timed_loop(numel: int, iters: int | None, seconds: float) -> dict:
    t = torch.ones(numel, device=DEVICE)
    iters = iters or iterations(time_per_op(t, 10), seconds)
    time_per_op(t, max(10, iters // 5))  # the warm-up proper
    dist.barrier()
    if dist.get_rank() == 0:
        say(f"RGBENCH-BEGIN {numel * 4}")
    before = thread_cpu()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    issued = time.perf_counter() - start  # NCCL: the CPU's enqueue of every all_reduce
    settle()
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
            "us_per_op": wall / iters * 1e6, "issue_us_per_op": issued / iters * 1e6,
            "threads": threads,
            "group": type(dist.group.WORLD).__name__, "backend": str(dist.get_backend())}


def main() -> None:
    seconds = float(sys.argv[1])
    loops = [(int(size), int(n) if n else None) for size, _, n in
             (arg.partition(":") for arg in sys.argv[2:])]
    dist.init_process_group(BACKEND)
    for size, iters in loops:
        result = timed_loop(max(1, size // 4), iters, seconds)
        say("RGBENCH " + json.dumps(result))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
