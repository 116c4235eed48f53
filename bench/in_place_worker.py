"""The DDP job of ``in_place_bench.py``: ``in_place_worker.py MODE STEPS OUT_DIR``.

MODE ``step-loop`` runs its loop in ``rankguard.StepLoop``; ``checkpoint`` is the usual script:
rank 0 saves a checkpoint every ``CKPT_EVERY`` steps and a restarted attempt resumes from it
(``TORCHELASTIC_RESTART_COUNT`` > 0); ``plain`` is that script without checkpoints (the
baseline of the step-time comparison); ``torchft`` is one replica group of one rank under
torchft's Manager (``BENCH_REPLICA`` numbers the groups, ``TORCHFT_LIGHTHOUSE`` names the
lighthouse), whose replicas heal from a live peer; ``paired`` measures StepLoop's own cost
(see :func:`paired`). All train the same model on the same data (drawn from the step and the
rank, or replica group). Ranks 0 and 1 append ``{"step", "t", "pid"}`` to
``OUT_DIR/steps_rankR.jsonl`` as each step completes; rank 0 writes the final parameters'
checksum to ``OUT_DIR/checksum``. With ``BENCH_DEVICE=cuda`` the ranks train on GPU 0 over
NCCL (each a host of its own through ``NCCL_HOSTID``, so that several share the device).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Callable

import torch
import torch.distributed as dist

CKPT_EVERY = 20
WIDTH = 256
DEVICE = torch.device("cuda", 0) if os.environ.get("BENCH_DEVICE") == "cuda" \
    else torch.device("cpu")


def batch(step: int, rank: int) -> torch.Tensor:
    """The data of ``step`` on ``rank`` (or replica group): the same in every way."""
    return torch.randn(32, 64, generator=torch.Generator().manual_seed(step * 1000 + rank)
                       ).to(DEVICE)


def main() -> None:
    mode, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "torchft":
        rank = int(os.environ["BENCH_REPLICA"])  # the replica group stands for the rank
    else:
        if DEVICE.type == "cuda":
            os.environ.setdefault("NCCL_HOSTID", f"host{os.environ['RANK']}")
            torch.cuda.set_device(DEVICE)
        dist.init_process_group("nccl" if DEVICE.type == "cuda" else "gloo")
        rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, WIDTH), torch.nn.ReLU(),
                                torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                                torch.nn.Linear(WIDTH, 1)).to(DEVICE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    log = open(os.path.join(out, f"steps_rank{rank}.jsonl"), "a") if rank < 2 else None

    def compute(ddp: object, n: int) -> None:
        optimizer.zero_grad()
        ddp(batch(n, rank)).pow(2).mean().backward()  # type: ignore[operator]
        optimizer.step()

    def done(n: int) -> None:
        if log is not None:
            log.write(json.dumps({"step": n, "t": time.time(),
                                  "pid": os.getpid()}) + "\n")
            log.flush()

    if mode == "paired":
        paired(model, optimizer, steps, out, rank)
    elif mode == "step-loop":
        import rankguard

        loop = rankguard.StepLoop.of({"model": model, "optimizer": optimizer})
        ddp = loop.ddp(model)

        def step(n: int) -> None:
            compute(ddp, n)
            done(n)

        loop.run(step, steps)
    elif mode == "torchft":
        torchft_loop(model, optimizer, done, steps, rank)
    else:
        from torch.nn.parallel import DistributedDataParallel

        ckpt = os.path.join(out, "checkpoint.pt")
        start = 0
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and os.path.exists(ckpt):
            state = torch.load(ckpt, map_location=DEVICE)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = state["step"]
        ddp = DistributedDataParallel(model)
        for n in range(start, steps):
            compute(ddp, n)
            done(n)
            if mode == "checkpoint" and rank == 0 and (n + 1) % CKPT_EVERY == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "step": n + 1}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)
    if rank == 0:
        digest = hashlib.sha256()
        for param in model.parameters():
            digest.update(param.detach().cpu().numpy().tobytes())
        with open(os.path.join(out, "checksum"), "w") as f:
            f.write(digest.hexdigest()[:16])
    if mode != "torchft":
        dist.destroy_process_group()


def paired(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int, out: str,
           rank: int) -> None:
    """StepLoop's cost per step, within one process: each call of a StepLoop's step function
    first runs a step of the plain DDP loop on a copy of the model (DDP's all-reduce in C++),
    then the StepLoop's own step (its DDP with rankguard's communication hook). The plain step
    is timed from its start to its end; the StepLoop step from there to the next plain step's
    start, which takes in the loop's work between steps. Rank 0 writes the medians, skipping
    the first 50 steps, to ``OUT_DIR/paired.json``. Pairing the two steps cancels what varies
    from one process to the next on a shared machine, which runs apart cannot."""
    import copy
    import statistics

    import rankguard
    from torch.nn.parallel import DistributedDataParallel

    twin = copy.deepcopy(model)
    twin_optimizer = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)
    plain = DistributedDataParallel(twin)
    loop = rankguard.StepLoop.of({"model": model, "optimizer": optimizer})
    ddp = loop.ddp(model)
    plain_s: list[float] = []
    looped_s: list[float] = []
    ended = [0.0]

    def step(n: int) -> None:
        started = time.perf_counter()
        if ended[0]:
            looped_s.append(started - ended[0])
        twin_optimizer.zero_grad()
        plain(batch(n, rank)).pow(2).mean().backward()
        twin_optimizer.step()
        ended[0] = time.perf_counter()
        plain_s.append(ended[0] - started)
        optimizer.zero_grad()
        ddp(batch(n, rank)).pow(2).mean().backward()
        optimizer.step()

    loop.run(step, steps)
    if rank == 0:
        with open(os.path.join(out, "paired.json"), "w") as f:
            json.dump({"plain_s": statistics.median(plain_s[50:]),
                       "step_loop_s": statistics.median(looped_s[50:]),
                       "steps": len(looped_s[50:])}, f)


def torchft_loop(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 done: Callable[[int], None], steps: int, replica: int) -> None:
    """The loop as torchft's examples write it: a step's optimizer update happens only if the
    Manager's quorum commits it; a new replica heals from a peer's state."""
    from datetime import timedelta

    from torchft import Manager, ProcessGroupGloo
    from torchft.ddp import DistributedDataParallel as FTDistributedDataParallel
    from torchft.optim import OptimizerWrapper

    def load(state: dict) -> None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])

    manager = Manager(pg=ProcessGroupGloo(), min_replica_size=1, load_state_dict=load,
                      state_dict=lambda: {"model": model.state_dict(),
                                          "optimizer": optimizer.state_dict()},
                      replica_id=f"bench{replica}", hostname="127.0.0.1",
                      timeout=timedelta(seconds=10))
    ddp = FTDistributedDataParallel(manager, model)
    wrapped = OptimizerWrapper(manager, optimizer)
    while manager.current_step() < steps:
        wrapped.zero_grad()  # starts the quorum, which heals a new replica (async)
        ddp(batch(manager.current_step(), replica)).pow(2).mean().backward()
        if manager.should_commit():
            optimizer.step()
            done(manager.current_step() - 1)  # the commit counted the step
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
