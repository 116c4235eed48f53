"""A DDP training job whose loop runs in ``rankguard.StepLoop``: a rank's fault costs no step.

    rankguard run --nproc-per-node 4 --recovery in-place --max-restarts 3 --hang-timeout 3 \
        --inject kill:rank=2,at=op40 examples/train_inplace.py

When rank 2 is killed at its 40th collective, the other three ranks are released from the
all-reduce they wait in, a warm spare becomes rank 2, receives the model and optimizer from a
healthy rank, and training goes on from the step that was cut short. The run prints the same
final checksum as a run without the fault (``--steps`` and the data are the same): every step
ran once, from the model's point of view.

The data of each step comes from the step number and the rank, so a step run again after a
recovery sees the same batch; that is what the loop's state must give a script (a data loader
would put its position into ``get_state``).

``--device cuda`` trains on GPUs over NCCL: rank r on GPU ``LOCAL_RANK % device_count``; ranks
that share a GPU are made hosts of their own (``NCCL_HOSTID``), as in the GPU test set.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist

import rankguard


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--step-time", type=float, default=0.02, help="extra seconds per step")
    p.add_argument("--width", type=int, default=64, help="hidden units of the model")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (gloo) or cuda (NCCL, a GPU per rank, or shared)")
    p.add_argument("--zero-grad-after", action="store_true",
                   help="clear the gradients after optimizer.step(), not before the backward")
    return p.parse_args()


def checksum(model: torch.nn.Module) -> str:
    """The parameters' bytes, hashed: equal only when every bit is."""
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def main() -> None:
    args = parse_args()
    device = torch.device("cpu")
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local % torch.cuda.device_count())
        if torch.cuda.device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", "1")):
            os.environ.setdefault("NCCL_HOSTID", f"host{os.environ.get('RANK', '0')}")
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    target_w = torch.randn(32, 1, generator=torch.Generator().manual_seed(7)).to(device)

    # the state a step depends on: moved from a healthy rank to a replacement
    loop = rankguard.StepLoop.of({"model": model, "optimizer": optimizer})
    ddp = loop.ddp(model)

    def step(n: int) -> None:
        rank = dist.get_rank()
        seed = torch.Generator().manual_seed(n * 1000 + rank)
        x = torch.randn(16, 32, generator=seed).to(device)
        if not args.zero_grad_after:
            optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), x @ target_w)
        loss.backward()  # DDP's all-reduce: a peer's fault raises here, before the update
        optimizer.step()
        if args.zero_grad_after:
            optimizer.zero_grad()
        time.sleep(args.step_time)
        if rank == 0 and n % 10 == 0:
            print(f"step {n} loss {loss.item():.4f}", flush=True)

    loop.run(step, args.steps)
    for recovery in loop.recoveries:
        if dist.get_rank() == 0:
            print(f"recovered at step {recovery.step}: generation {recovery.generation}, "
                  f"replaced {recovery.replaced}, state from rank {recovery.source}, "
                  f"regroup {recovery.regroup_s:.2f} s, transfer {recovery.share_s:.2f} s"
                  + (f"; failed: {recovery.error}" if recovery.error else ""), flush=True)
    if dist.get_rank() == 0:
        print(f"done: {args.steps} steps on {dist.get_world_size()} ranks, "
              f"checksum {checksum(model)}", flush=True)
    rankguard.shutdown(timeout=10)


if __name__ == "__main__":
    main()
