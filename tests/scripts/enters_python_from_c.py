"""A rank that imports torch, then for ``WORKLOAD_S`` seconds (default 3) enters Python functions
from C over and over (slots, key functions, generators, from C stacks of varying depth), as
importing torch does; then it ends, 0."""

import os
import random
import time

import torch  # noqa: F401


class Slots:
    def __init__(self, *args: int) -> None:
        self.args = args

    def __getattr__(self, name: str) -> int:
        return len(name)

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


def nested(depth: int) -> int:
    if depth == 0:
        slots = Slots(1, 2)
        sorted(range(8), key=lambda v: -v)
        list(map(lambda v: v + 1, range(4)))
        return slots.foo + sum(x for x in range(3)) + (slots == slots)
    if depth % 2:
        return nested(depth - 1)
    return min([depth], key=lambda v: nested(depth - 1))


end = time.monotonic() + float(os.environ.get("WORKLOAD_S", "3"))
while time.monotonic() < end:
    nested(random.randrange(1, 30))
