"""The ranks of a PyTorch-style multi-process test case
(``torch.testing._internal.common_distributed.MultiProcessTestCase``), named and asked for
their stacks when its deadline passes.

Its ranks are spawned processes that import neither pytest nor rankguard: they answer no stack
request of ours, and neither their command line nor their environment carries their rank. The
test case itself holds both: ``processes[rank]`` is rank ``rank``'s process, and each rank runs
torch's event-listener thread, which answers ``Event.GET_TRACEBACK`` sent on
``pid_to_pipe[pid]`` with a faulthandler dump of all its threads (what torch's own 300 s
timeout prints). Only the test case's attributes are read, nothing of torch is imported: a test
case without them has no ranks here. A rank whose listener cannot run (its process holds the
GIL, or is stopped) does not answer by the deadline, and is described from /proc as any other.
"""

from __future__ import annotations

from multiprocessing.connection import wait
from typing import Any

from ..deadline import Deadline


def ranks(case: Any) -> dict[int, int]:
    """pid -> rank of the test case's rank processes (empty: not such a test case)."""
    processes = getattr(case, "processes", None)
    if not isinstance(processes, list):
        return {}
    return {process.pid: rank for rank, process in enumerate(processes)
            if isinstance(getattr(process, "pid", None), int)}


def ask_stacks(case: Any, pids: list[int], deadline: Deadline) -> dict[int, str]:
    """pid -> the stacks of each of ``pids`` that answered the test case's traceback request
    by ``deadline``."""
    pipes = getattr(case, "pid_to_pipe", None)
    request = getattr(getattr(case, "Event", None), "GET_TRACEBACK", None)
    if not isinstance(pipes, dict) or request is None:
        return {}
    asked = {}
    for pid in pids:
        pipe = pipes.get(pid)
        try:
            pipe.send(request)
        except (AttributeError, OSError, ValueError):  # not a pipe, or closed
            continue
        asked[pipe] = pid
    stacks: dict[int, str] = {}
    while asked and not deadline.passed():
        for pipe in wait(list(asked), deadline.wait_time()):
            pid = asked.pop(pipe)  # type: ignore[call-overload]
            try:
                answer = pipe.recv()  # type: ignore[union-attr]
            except (EOFError, OSError):
                continue
            if isinstance(answer, str):
                stacks[pid] = answer
    return stacks
