"""The DDP job of ``in_place_bench.py``: ``in_place_worker.py MODE STEPS OUT_DIR``.

MODE ``step-loop`` runs its loop in ``rankguard.StepLoop``; ``checkpoint`` is the usual script:
rank 0 saves a checkpoint every ``CKPT_EVERY`` steps and a restarted attempt resumes from it
(``TORCHELASTIC_RESTART_COUNT`` > 0); ``plain`` is that script without checkpoints (the
baseline of the step-time comparison). Both train the same model on the same data (drawn from the
step and the rank). Ranks 0 and 1 append ``{"step", "t", "pid"}`` to
``OUT_DIR/steps_rankR.jsonl`` as each step completes; rank 0 writes the final parameters'
checksum to ``OUT_DIR/checksum``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist

CKPT_EVERY = 20
WIDTH = 256


def main() -> None:
    mode, steps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, WIDTH), torch.nn.ReLU(),
                                torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
                                torch.nn.Linear(WIDTH, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    log = open(os.path.join(out, f"steps_rank{rank}.jsonl"), "a") if rank < 2 else None

    def compute(ddp: object, n: int) -> None:
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(n * 1000 + rank))
        optimizer.zero_grad()
        ddp(x).pow(2).mean().backward()  # type: ignore[operator]
        optimizer.step()

    def done(n: int) -> None:
        if log is not None:
            log.write(json.dumps({"step": n, "t": time.time(),
                                  "pid": os.getpid()}) + "\n")
            log.flush()

    if mode == "step-loop":
        import rankguard

        loop = rankguard.StepLoop.of({"model": model, "optimizer": optimizer})
        ddp = loop.ddp(model)

        def step(n: int) -> None:
            compute(ddp, n)
            done(n)

        loop.run(step, steps)
    else:
        from torch.nn.parallel import DistributedDataParallel

        ckpt = os.path.join(out, "checkpoint.pt")
        start = 0
        if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and os.path.exists(ckpt):
            state = torch.load(ckpt)
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
            digest.update(param.detach().numpy().tobytes())
        with open(os.path.join(out, "checksum"), "w") as f:
            f.write(digest.hexdigest()[:16])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
