"""Aborting this process's NCCL communicators, from any thread, within a bound.

``ProcessGroupNCCL.abort()`` (``ncclCommAbort``) ends a collective stuck on a peer: the main
thread blocked behind it in ``torch.cuda.synchronize()`` or ``work.wait()`` returns (without an
error), and the CUDA context stays usable. It is not instant: the operations queued behind the
stuck one each start and leave on the abort flag before it returns (0.5 s for an idle
communicator, 1.3 to 2.9 s with 50 queued, on one H100 over sockets; docs/nccl-probe-2.11.md),
and it has been reported to hang on some NCCL versions. So it runs on a thread of its own, and
the caller waits for it only as long as it can afford: past that, the caller goes on (a process
that exits releases its communicators with it).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from . import fr_progress


@dataclass(frozen=True)
class Aborted:
    """How an abort went: how many communicators it was asked to abort, whether every abort
    returned within the bound, how long the caller waited, and the first error one raised."""

    groups: int
    finished: bool
    took_s: float
    error: str = ""


def nccl_groups() -> list[tuple[Any, Any]]:
    """Every process group of this process with an NCCL backend: (group, its backend). Empty
    where torch.distributed is not imported or has no NCCL."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_nccl_available():
        return []
    import torch

    found = []
    for group in fr_progress.torch_groups():
        try:
            backend = group._get_backend(torch.device("cuda"))
        except RuntimeError:  # no CUDA backend in this group
            continue
        if isinstance(backend, dist.ProcessGroupNCCL):
            found.append((group, backend))
    return found


def not_aborted(groups: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Those of ``groups`` whose backend no :func:`abort` of this process has aborted, or
    begun to (one whose abort hangs is not aborted again)."""
    return [(group, backend) for group, backend in groups if backend_key(backend) not in _reasons]


# why :func:`abort` aborted each backend, from the start of its abort, by backend_key
_reasons: dict[tuple[str, int], str] = {}
_pinned: list[Any] = []  # backends keyed by id: kept alive, so that no other takes their id


def backend_key(backend: Any) -> tuple[str, int]:
    """What names an NCCL backend for as long as the process lives: torch's ``uid`` of it
    (``ProcessGroupNCCL.uid``, one per backend made in the process). Not ``id()``: torch keeps
    no Python object of a backend, each ``_get_backend()`` may make a new one (two calls gave
    two ids on torch 2.11), and a new group's may take a freed address. A backend without
    ``uid`` is named by its ``id()`` and kept alive for good (see :func:`abort`)."""
    uid = getattr(backend, "uid", None)
    return ("uid", uid) if isinstance(uid, int) else ("id", id(backend))


def why_aborted(backend: Any) -> str | None:
    """Why :func:`abort` aborted ``backend`` (or is aborting it); None: it did not."""
    return _reasons.get(backend_key(backend))


def finished_within(call: Callable[[], object], limit_s: float, name: str) -> bool:
    """Run ``call`` on a daemon thread called ``name`` and wait at most ``limit_s`` for it;
    whether it returned (one that did not is left running: the process's exit ends it)."""
    worker = threading.Thread(target=call, name=name, daemon=True)
    worker.start()
    worker.join(max(limit_s, 0.0))
    return not worker.is_alive()


def abort(groups: list[tuple[Any, Any]], limit_s: float,
          reason: str = "its NCCL communicator was aborted") -> Aborted:
    """Abort the backends of ``groups`` (as :func:`nccl_groups` gives them) on a daemon thread,
    and wait at most ``limit_s`` for it; ``reason``: why (:func:`why_aborted`). Never raises:
    an abort's error is reported."""
    if not groups:
        return Aborted(0, True, 0.0)
    errors: list[str] = []
    for _, backend in groups:
        key = backend_key(backend)
        if key[0] == "id":
            _pinned.append(backend)
        _reasons.setdefault(key, reason)

    def run() -> None:
        for _, backend in groups:
            try:
                backend.abort()
            except Exception as error:  # noqa: BLE001 (reported; the others are aborted still)
                errors.append(f"{type(error).__name__}: {error}")

    started = time.monotonic()
    finished = finished_within(run, limit_s, "rankguard-nccl-abort")
    return Aborted(len(groups), finished, time.monotonic() - started, errors[0] if errors else "")


def synchronize(limit_s: float) -> bool:
    """``torch.cuda.synchronize()`` on a daemon thread, waiting at most ``limit_s``; whether it
    returned (it may not: a kernel that never ends). Only where CUDA was initialised."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return True
    return finished_within(torch.cuda.synchronize, limit_s, "rankguard-cuda-sync")
