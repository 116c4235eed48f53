"""A DDP loop in rankguard.StepLoop whose get_state raises: the error a healthy rank meets while
it sends the state to a replacement (``tests/launcher/test_in_place.py``)."""

from __future__ import annotations

import torch
import torch.distributed as dist

import rankguard


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def get_state() -> dict:
        raise RuntimeError("the script's get_state broke")

    loop = rankguard.StepLoop(get_state, lambda state: None)
    ddp = loop.ddp(model)

    def step(n: int) -> None:
        optimizer.zero_grad()
        ddp(torch.ones(4, 8) * n).sum().backward()
        optimizer.step()

    loop.run(step, 60)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
