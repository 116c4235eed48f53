"""Functions the pool tests run on their ranks (module-level, so the ranks import them by name).

``fault`` is ``(rank, kind)``: that rank injects a real fault between the forward's two
all_reduces, while its peers wait for it in the second one.
"""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

KINDS = {  # kind -> the cause the pool must report
    "raise": "raised",
    "exit": "exited",
    "kill": "signalled",
    "freeze": "frozen",
    "sleep": "deadline",
    "busy": "deadline",
}


def inject(kind: str) -> None:
    if kind == "raise":
        raise ValueError("injected failure mid-forward")
    if kind == "sticky":  # as torch words a CUDA error that loses the process's CUDA context
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if kind == "exit":
        os._exit(3)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "term":  # the rank's SIGTERM teardown ends it (exit 0), on a thread of its own
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)
    if kind == "freeze":
        os.kill(os.getpid(), signal.SIGSTOP)
    if kind == "sleep":
        time.sleep(60)
    if kind == "busy":  # a C-level loop that holds the GIL (catastrophic regex backtracking)
        re.match(r"(a+)+$", "a" * 64 + "b")
    time.sleep(0.01)  # frozen ranks continue here once SIGCONT arrives


def load(rank: int, world_size: int) -> dict[str, Any]:
    """A stand-in for loading a model shard, on the device the pool placed the rank on."""
    import torch

    import rankguard

    return {"weight": torch.full((4,), float(rank + 1), device=rankguard.device()),
            "world": world_size}


def forward(state: dict[str, Any], x: float, fault: tuple[int, str] | None = None) -> list[float]:
    """Each rank scales x by its shard; the partial outputs are summed across ranks."""
    import torch
    import torch.distributed as dist

    out = state["weight"] * x
    dist.all_reduce(out)
    if fault is not None and dist.get_rank() == fault[0]:
        inject(fault[1])
    dist.all_reduce(out)
    return out.tolist()


def expected(x: float, world_size: int) -> list[float]:
    """``forward``'s result: sum over ranks of (rank + 1) * x, all-reduced twice."""
    total = sum(r + 1 for r in range(world_size)) * x * world_size
    return [total] * 4


def load_but_not_as_a_replacement(rank: int, world_size: int) -> dict[str, Any]:
    """:func:`load`, which fails in a process started to replace an unusable rank."""
    if os.environ.get("RANKGUARD_REPLACING") == "1":
        raise RuntimeError("this shard cannot be loaded again")
    return load(rank, world_size)


def load_slowly_as_a_replacement(rank: int, world_size: int) -> dict[str, Any]:
    """:func:`load`, which takes 3 s more in a process started to replace an unusable rank."""
    if os.environ.get("RANKGUARD_REPLACING") == "1":
        time.sleep(3.0)
    return load(rank, world_size)


def broken_setup(rank: int, world_size: int) -> None:
    raise RuntimeError(f"no weights at /nonexistent/shard{rank}.pt")


def pid(state: Any) -> int:
    return os.getpid()


def die(state: Any) -> None:
    """Every rank is killed: nothing of the replica is left to keep."""
    os.kill(os.getpid(), signal.SIGKILL)


def master_port(state: Any) -> int:
    """The port of the group's store, as the rank was told it."""
    return int(os.environ["MASTER_PORT"])


def sleep_until(state: Any, at: float) -> None:
    """Hold the group until ``at`` on the monotonic clock (system-wide on Linux)."""
    time.sleep(max(0.0, at - time.monotonic()))


def slow(state: Any, seconds: float) -> float:
    """A healthy call that takes ``seconds`` on every rank, then one all_reduce."""
    import torch
    import torch.distributed as dist

    time.sleep(seconds)
    out = torch.ones(1)
    dist.all_reduce(out)
    return out.item()


def sleep_by_rank(state: Any, seconds: list[float]) -> None:
    """Each rank sleeps its own time (no collective: no rank is behind another)."""
    import torch.distributed as dist

    time.sleep(seconds[dist.get_rank()])


def late_peer(state: Any, late: float, window: float) -> None:
    """Every rank raises a collective error: rank 0's all_reduce passes its own ``window``
    while rank 1 is ``late``; rank 1 then finds the group retired."""
    import torch
    import torch.distributed as dist

    import rankguard

    if dist.get_rank() == 1:
        time.sleep(late)
    with rankguard.deadline(window):
        dist.all_reduce(torch.ones(1))


def start_children(state: Any) -> list[int]:
    """Start a child and a double-forked grandchild that outlive this call; their pids."""
    import subprocess

    child = subprocess.Popen(["sleep", "1000"])
    shell = subprocess.run(["sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, timeout=10)
    return [child.pid, int(shell.stdout)]


def report_then_sleep(state: Any, address: str, seconds: float) -> None:
    """Rank 0 tells the test at the Unix socket ``address`` that the call is running; every
    rank then sleeps ``seconds`` (a call still in flight when the test acts)."""
    import socket

    import torch.distributed as dist

    if dist.get_rank() == 0:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(address)
            sock.sendall(b"running")
    time.sleep(seconds)


def fork_sleeper(state: Any) -> int:
    """Fork a child (no exec) that sleeps 120 s and outlives this call; its pid."""
    child = os.fork()
    if child == 0:
        time.sleep(120)
        os._exit(0)
    return child


def placed_on(state: Any) -> tuple[str, str, str]:
    """Where the pool placed this rank: its device (``rankguard.device()``), its group's
    backend, and the host id NCCL was given ("" when none)."""
    import torch.distributed as dist

    import rankguard

    return str(rankguard.device()), str(dist.get_backend()), os.environ.get("NCCL_HOSTID", "")


def bounded_group(state: Any) -> bool:
    """Whether this rank's default group is one rankguard instrumented (bounded collectives)."""
    from torch.distributed import distributed_c10d as c10d

    from rankguard.runtime.state import current

    return current().groups.of(c10d._get_default_group()) is not None


def cwd(state: Any) -> str:
    return os.getcwd()


def start_sleepers(state: Any) -> list[int]:
    """A child (same session) and a daemon (a session of its own, double-forked) of this rank,
    each sleeping 120 s; their pids."""
    import subprocess
    import sys

    child = subprocess.Popen(["sleep", "120"])
    daemon = subprocess.run(
        [sys.executable, "-c", "import subprocess; p = subprocess.Popen(['sleep', '120'], "
         "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
         "print(p.pid)"],
        capture_output=True, text=True, check=True, timeout=30)
    return [child.pid, int(daemon.stdout)]


def die_while_peer_computes(state: Any, seconds: float) -> None:
    """Rank 1 is killed 0.2 s in, while rank 0 is still busy for ``seconds`` (no collective)."""
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(seconds)


def environ(state: Any, names: list[str]) -> dict[str, str | None]:
    """The values of ``names`` in this rank's environment (None: unset)."""
    return {name: os.environ.get(name) for name in names}


class _LoadsAsAnError:
    """Pickles fine in the rank; unpickling it (in the leader) raises ValueError."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (int, ("not a number",))


class _PicklingRaises:
    def __reduce__(self) -> tuple[Any, ...]:
        raise RuntimeError("this result refuses to be pickled")


class Unprintable(Exception):
    """An error whose str() and repr() raise."""

    def __str__(self) -> str:
        raise RuntimeError("str() of this error raises")

    def __repr__(self) -> str:
        raise RuntimeError("repr() of this error raises")


def hostile_outcome(state: Any, kind: str) -> Any:
    """After an all_reduce on every rank: rank 0 returns a result the leader cannot unpickle
    (``loads``) or that cannot be pickled (``dumps``), or rank 1 raises an error whose str()
    raises (``unprintable``) or whose text is megabytes long (``huge``)."""
    import torch.distributed as dist

    dist.all_reduce(state["weight"].clone())
    rank = dist.get_rank()
    if kind == "loads" and rank == 0:
        return _LoadsAsAnError()
    if kind == "dumps" and rank == 0:
        return _PicklingRaises()
    if kind == "unprintable" and rank == 1:
        raise Unprintable()
    if kind == "huge" and rank == 1:
        raise ValueError("x" * 50_000_000)
    return None


def destroy_group(state: Any) -> None:
    """A call that ends by destroying the replica's process group."""
    import torch.distributed as dist

    dist.all_reduce(state["weight"].clone())
    dist.destroy_process_group()
