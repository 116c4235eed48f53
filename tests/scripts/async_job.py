"""A job whose groups rankguard watches through torch's Flight Recorder: NCCL groups on GPU 0
(each rank a host of its own through ``NCCL_HOSTID``), or gloo groups under
``RANKGUARD_GLOO=recorder`` (how the suite runs that path on CPU).

``async_job.py BACKEND SCENARIO [AT] [SECONDS]``, BACKEND ``nccl`` or ``gloo``; rank 1 is the
faulty one, before the world's all_reduce #AT (counted from 1, as torch numbers them):

- ``clean``: 20 world all_reduces, 5 in a sub-group of every rank and one of ranks 0,1, the sums
  checked; prints ``OK rank=R backend=B``.
- ``sleep``: rank 1 sleeps in Python for good; the others issue AT and 9 more
  (asynchronously, ``async_op=True``), then wait for them all.
- ``busy``: rank 1 computes in Python for SECONDS, then goes on; the job ends well.
- ``gpu_stuck`` (NCCL): rank 1's GPU spins in a kernel before #AT; its CPU issues AT and 9 more.
- ``subgroup``: rank 1 sleeps for good before the sub-group (ranks 0,1)'s all_reduce #AT.
- ``bounded``: ``sleep``, run with a collective deadline: the others wait for their collectives
  as a training step does (gloo: polling in Python; NCCL: ``torch.cuda.synchronize()``), and the
  ``rankguard.CollectiveTimeout`` they raise ends them.
- ``deadline_block``: ``bounded``, with no job-wide deadline: the others wait inside
  ``rankguard.deadline(SECONDS)``.
- ``bounded_regroup``: ``bounded``, but the others catch it, check that the device is usable,
  call ``rankguard.regroup()`` (which leaves rank 1 out) and all-reduce in the new group, then
  print ``REGROUPED rank=R size=N sum=S``; rank 1 leaves (exit 0) once they did (at most
  SECONDS later).
"""
import os
import sys
import time

import torch
import torch.distributed as dist

import rankguard

backend, scenario = sys.argv[1], sys.argv[2]
at = int(sys.argv[3]) if len(sys.argv) > 3 else 0
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
FOREVER = 100000
enqueued_at = 0.0  # when this rank enqueued its last collective (reduce_until)
REGROUPED = os.path.join(os.environ.get("RANKGUARD_LOG_DIR", "."), "regrouped")

if backend == "nccl":
    os.environ.setdefault("NCCL_HOSTID", f"host{os.environ['RANK']}")
    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
else:
    device = torch.device("cpu")


def settle() -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def reduce_until(group, last: int, faulty: str) -> None:
    """All-reduces #1 to #last of ``group``; rank 1 does ``faulty`` before #at."""
    works = []
    for number in range(1, last + 1):
        if number == at and dist.get_rank() == 1:
            if faulty == "sleep" or (faulty == "bounded" and scenario != "bounded_regroup"):
                time.sleep(FOREVER)
            elif faulty == "bounded":  # bounded_regroup: leave once the others regrouped
                end = time.monotonic() + seconds
                while not os.path.exists(REGROUPED) and time.monotonic() < end:
                    time.sleep(0.05)
                os._exit(0)
            elif faulty == "busy":
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    sum(range(1000))
            elif faulty == "gpu_stuck":
                torch.cuda._sleep(2 ** 42)
        works.append(dist.all_reduce(torch.ones(1024, device=device), group=group,
                                     async_op=True))
        if faulty == "none" or number < at:
            works.pop().wait()
    global enqueued_at
    enqueued_at = time.monotonic()
    print(f"ENQUEUED rank={dist.get_rank()} last={last}", flush=True)
    if faulty == "bounded" and scenario == "deadline_block":
        with rankguard.deadline(seconds):
            wait_for_device(works[-1])
    elif faulty == "bounded":
        wait_for_device(works[-1])
    for work in works:
        work.wait()
    settle()


def wait_for_device(work) -> None:
    """Wait for ``work`` as a step waits for its results: NCCL, a device synchronisation; gloo,
    polling from Python (rankguard can only raise in Python code for a group it cannot
    abort)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    else:
        while not work.is_completed():
            time.sleep(0.005)


dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
if scenario == "clean":
    everyone = dist.new_group(list(range(world)))
    pair = dist.new_group([0, 1])
    total = torch.zeros(1, device=device)
    for _ in range(20):
        step = torch.ones(1, device=device)
        dist.all_reduce(step)
        total += step
    for _ in range(5):
        dist.all_reduce(torch.ones(1, device=device), group=everyone)
        if rank in (0, 1):
            dist.all_reduce(torch.ones(1, device=device), group=pair)
    settle()
    assert total.item() == 20 * world, total
    print(f"OK rank={rank} backend={dist.get_backend()}", flush=True)
elif scenario in ("sleep", "busy", "gpu_stuck"):
    reduce_until(None, at + 9, scenario)
elif scenario in ("bounded", "deadline_block"):
    reduce_until(None, at + 9, "bounded")
elif scenario == "bounded_regroup":
    try:
        reduce_until(None, at + 9, "bounded")
    except rankguard.CollectiveTimeout as error:
        print(f"CAUGHT rank={rank} missing={error.missing} after={time.monotonic() - enqueued_at:.2f}"
              f" {error}", flush=True)
        probe = torch.ones(8, device=device) * 2
        settle()
        assert probe.sum().item() == 16.0  # the device is usable after the abort
        generation = rankguard.regroup(timeout=30)
        total = torch.ones(1, device=device)
        dist.all_reduce(total)
        settle()
        print(f"REGROUPED rank={generation.rank} size={generation.world_size} "
              f"sum={total.item():g}", flush=True)
        if generation.rank == 0:
            open(REGROUPED, "w").close()
elif scenario == "subgroup":
    pair = dist.new_group([0, 1])
    reduce_until(None, 3, "none")
    if rank in (0, 1):
        reduce_until(pair, at + 9, "sleep")
    else:
        time.sleep(FOREVER)  # a bystander: not what the pair waits for
else:
    raise SystemExit(f"unknown scenario {scenario!r}")
dist.destroy_process_group()
