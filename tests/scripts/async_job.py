"""A job whose groups rankguard watches through torch's Flight Recorder: NCCL groups on GPU 0
(each rank a host of its own through ``NCCL_HOSTID``), or gloo groups under
``RANKGUARD_GLOO=recorder`` (how the suite runs that path on CPU).

``async_job.py BACKEND SCENARIO [AT] [SECONDS]``, BACKEND ``nccl``, ``gloo`` or a mixed spec
(``cpu:gloo,cuda:nccl``); rank 1 is the faulty one, before the world's all_reduce #AT (counted
from 1, as torch numbers them), or as each scenario says:

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
- ``ddp``: a small ``nn.Linear`` trained under ``DistributedDataParallel`` (whose gradient
  bucket is all-reduced on the world group by DDP's C++ reducer); each rank prints
  ``STEP rank=R step=K after=N`` before its step K (N: the world group's last collective, as
  torch numbers them). AT 0: 8 steps, the ranks' parameters checked equal, then ``OK``; else
  rank 1 sleeps for good in its step AT, before its forward pass.
- ``mesh``: a 2x2 ``DeviceMesh`` (4 ranks, dims ``dp`` and ``tp``); each step all-reduces on the
  rank's ``tp`` group, then on its ``dp`` group, then computes for ``STEP_S``. AT 0: 4 steps,
  sums checked, ``OK``; else rank 1 sleeps for good in step AT, before its ``dp`` group's
  (ranks 1,3) all_reduce #AT, and the others go on to step AT + 2: rank 3 waits for rank 1 in
  that ``dp`` all_reduce, ranks 0 and 2 (a step later) in their ``tp`` all_reduce #AT + 1.
- ``mesh_alone``: ``mesh``, with no ``init_process_group`` of the script's own:
  ``init_device_mesh`` makes the default group (the usual idiom on GPUs).
- ``split`` (NCCL): ``split_group`` makes a group of ranks 0,1 off the default group (bound to
  the GPU with ``device_id``: torch splits only such a group); rank 1 sleeps for good before
  its all_reduce #AT.
- ``mixed`` (``cpu:gloo,cuda:nccl``): each step all-reduces a CPU tensor (gloo; prints
  ``CPU rank=R step=K sum=S``) and a GPU tensor (NCCL, its sum checked) on the default group;
  AT 0: 10 steps, ``OK``; else rank 1 sleeps for good before its GPU tensor's all_reduce #AT.
- ``mixed_cpu``: ``mixed``, but rank 1 sleeps for good before its CPU tensor's all_reduce #AT
  (the gloo half's).
- ``steps``: each step enqueues three all_reduces and a broadcast from rank 0
  (``async_op=True``, in flight at once), then waits for them all; each rank prints
  ``STEP rank=R step=K first=F`` before step K (from 0; F: the number torch gives its first
  collective). Rank 1 sleeps for good before step AT; the others go on and wait in it.
- ``graph`` (NCCL): an all_reduce captured in a ``torch.cuda.CUDAGraph``, replayed AT times,
  the result checked (each replay doubles the tensor on 2 ranks), then one more eager one.
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
# mesh: a step's computing time, longer than the ledger's time resolution (the sampler's tick,
# up to 0.2 s): the waits a hang causes in later steps begin visibly after the first one
STEP_S = 0.5
enqueued_at = 0.0  # when this rank enqueued its last collective (reduce_until)
REGROUPED = os.path.join(os.environ.get("RANKGUARD_LOG_DIR", "."), "regrouped")

if "nccl" in backend:
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


if scenario == "mesh_alone":
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))
else:  # split_group splits only a default group bound to its device
    dist.init_process_group(backend, device_id=device if scenario == "split" else None)
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
elif scenario == "ddp":
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 4).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    default_group = dist.distributed_c10d._get_default_group()
    for step in range(1, (at or 8) + 1):
        print(f"STEP rank={rank} step={step} "
              f"after={default_group._get_sequence_number_for_group()}", flush=True)
        if step == at and rank == 1:
            time.sleep(FOREVER)
        optimizer.zero_grad()
        model(torch.ones(2, 8, device=device) * (rank + 1)).sum().backward()
        optimizer.step()
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = mine.clone()
    dist.all_reduce(everyone)
    assert torch.allclose(everyone, mine * world), "DDP left the ranks' parameters apart"
    print(f"OK rank={rank} backend={dist.get_backend()}", flush=True)
elif scenario in ("mesh", "mesh_alone"):
    from torch.distributed.device_mesh import init_device_mesh

    if scenario == "mesh":
        mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    for step in range(1, (at + 2 if at else 4) + 1):
        across = torch.ones(1, device=device)
        dist.all_reduce(across, group=tp)
        if step == at and rank == 1:
            time.sleep(FOREVER)
        along = torch.ones(1, device=device)
        dist.all_reduce(along, group=dp)
        assert (across.item(), along.item()) == (2, 2), (across, along)
        time.sleep(STEP_S)
    print(f"OK rank={rank} backend={dist.get_backend()}", flush=True)
elif scenario == "split":
    pair = dist.split_group(split_ranks=[[0, 1]])
    reduce_until(None, 3, "none")
    reduce_until(pair, at + 9, "sleep")
elif scenario in ("mixed", "mixed_cpu"):
    for step in range(1, (at or 10) + 1):
        if step == at and rank == 1 and scenario == "mixed_cpu":
            time.sleep(FOREVER)
        on_cpu = torch.ones(1)
        dist.all_reduce(on_cpu)
        print(f"CPU rank={rank} step={step} sum={on_cpu.item():g}", flush=True)
        if step == at and rank == 1:
            time.sleep(FOREVER)
        on_gpu = torch.ones(1, device=device)
        dist.all_reduce(on_gpu)
        settle()
        assert on_gpu.item() == world, on_gpu
    print(f"OK rank={rank} backend={dist.get_backend()}", flush=True)
elif scenario == "steps":
    issued = 0
    for step in range(FOREVER):
        print(f"STEP rank={rank} step={step} first={issued + 1}", flush=True)
        if step == at and rank == 1:
            time.sleep(FOREVER)
        works = [dist.all_reduce(torch.ones(4, device=device), async_op=True) for _ in range(3)]
        works.append(dist.broadcast(torch.ones(2, device=device), 0, async_op=True))
        issued += len(works)
        for work in works:
            work.wait()
        time.sleep(0.05)
elif scenario == "graph":
    value = torch.ones(1024, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up NCCL's communicator outside the capture
        for _ in range(3):
            dist.all_reduce(torch.ones(1024, device=device))
    torch.cuda.current_stream().wait_stream(side)
    settle()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(value)
    for _ in range(at):
        graph.replay()
    settle()
    assert torch.equal(value, torch.full_like(value, float(world ** at))), value[:4]
    after = torch.ones(1, device=device)
    dist.all_reduce(after)
    settle()
    assert after.item() == world, after
    print(f"OK rank={rank} backend={dist.get_backend()} replays={at} value={value[0].item():g}",
          flush=True)
    # torch's own counts before the teardown (a captured collective's work is never enqueued)
    import json
    status = json.loads(torch._C._distributed_c10d._dump_nccl_trace_json(False, False))
    print(f"PG_STATUS {status.get('pg_status')}", flush=True)
    # the graph holds the captured collective's NCCL resources: destroy_process_group() with it
    # alive never returns (torch 2.11, NCCL 2.28.9, on an H100: under plain torchrun too)
    del graph
    settle()
else:
    raise SystemExit(f"unknown scenario {scenario!r}")
dist.destroy_process_group()
