"""A small DDP training job on gloo/CPU that checkpoints and resumes: rankguard's demo.

Plain torch.distributed, as a torchrun user writes it; nothing here knows about rankguard::

    rankguard run --nproc-per-node 4 --max-restarts 1 --hang-timeout 3 \
        --inject hang:rank=2,at=op40 examples/train.py

Rank 0 saves a checkpoint every ``--ckpt-every`` steps; every rank resumes from it when a
restarted attempt begins (TORCHELASTIC_RESTART_COUNT > 0 under rankguard run and torchrun).
By default the checkpoint goes to the run's private log folder under rankguard run
(``RANKGUARD_LOG_DIR``), else to ``./checkpoints-RUN_ID``: never to a predictable path in a
folder other users can write.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ckpt-every", type=int, default=10)
    run_dir = os.environ.get("RANKGUARD_LOG_DIR")
    p.add_argument("--ckpt-dir", default=os.path.join(run_dir, "checkpoints") if run_dir
                   else f"checkpoints-{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}")
    p.add_argument("--step-time", type=float, default=0.02, help="extra seconds per step")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    ckpt = os.path.join(args.ckpt_dir, "checkpoint.pt")
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        if rank == 0:
            print(f"resumed from step {start} ({ckpt})", flush=True)
    generator = torch.Generator().manual_seed(1234 + rank)
    target_w = torch.randn(32, 1, generator=torch.Generator().manual_seed(7))
    loss = torch.tensor(0.0)
    for step in range(start, args.steps):
        x = torch.randn(16, 32, generator=generator)
        y = x @ target_w
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        time.sleep(args.step_time)
        if (step + 1) % args.ckpt_every == 0:
            if rank == 0:
                os.makedirs(args.ckpt_dir, exist_ok=True)
                tmp = ckpt + ".tmp"
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "step": step + 1}, tmp)
                os.replace(tmp, ckpt)
            dist.barrier()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if rank == 0:
        print(f"done: {args.steps} steps on {world} ranks, final loss {loss.item():.4f}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
