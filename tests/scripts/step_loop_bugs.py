"""A DDP loop in rankguard.StepLoop with a bug of the script's own, for
``tests/launcher/test_in_place.py``: ``step_loop_bugs.py get_state`` has a get_state that raises
(the error a healthy rank meets as it would send the state to a replacement);
``step_loop_bugs.py step`` has rank 1 raise at step 10 in every process (each replacement meets
the same bug); ``step_loop_bugs.py usage`` has rank 1 call ``rankguard.regroup`` with a bad
argument at step 10 (a ``rankguard.UsageError``, the same in every process); ``step_loop_bugs.py group_at_top`` makes a sub-group at the top of the script (a
replacement would wait in it for peers that never make it), ``group_in_on_regroup`` makes it
where the README says, and each step all-reduces over it."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

import rankguard


def main() -> None:
    bug = sys.argv[1]
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def get_state() -> dict:
        if bug == "get_state" and loop.step > 0:  # run() checks the state at step 0
            raise RuntimeError("the script's get_state broke")
        return {"model": model.state_dict()}

    loop = rankguard.StepLoop(get_state, lambda state: model.load_state_dict(state["model"]))
    ddp = loop.ddp(model)
    groups: list = []

    def make_group() -> None:
        groups[:] = [dist.new_group([0, 1])]

    if bug == "group_at_top":
        make_group()
    elif bug == "group_in_on_regroup":
        loop.on_regroup(make_group)

    def step(n: int) -> None:
        if bug == "step" and n == 10 and dist.get_rank() == 1:
            raise ValueError("the script's step 10 broke")
        if bug == "usage" and n == 10 and dist.get_rank() == 1:
            rankguard.regroup(keep_size="yes")
        optimizer.zero_grad()
        ddp(torch.ones(4, 8) * n).sum().backward()
        if groups:
            members = torch.ones(1)
            dist.all_reduce(members, group=groups[0])
            if members.item() != 2:
                raise AssertionError(f"the sub-group summed {members.item()}, not 2")
        optimizer.step()

    loop.run(step, 60)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
