"""The rank runtime's small API for the rest of rankguard (the pytest plugin, a pool's ranks).

``rankguard.regroup``, ``shutdown`` and ``deadline`` are the public faces, which take seconds
from the user. The parts of rankguard that run inside a rank already hold a :class:`Deadline`
(a test's, a request's, perhaps made in another process) and need a few things the public API
does not offer; they use these functions, never the runtime's modules or torch's group objects.
Every function here is safe to call in a process without torch.distributed, or whose default
group rankguard did not instrument (it then does nothing, or says so).
"""

from __future__ import annotations

import sys
from typing import Iterable

from ..records import ledger as _ledger
from ..deadline import Deadline
from . import barrier, generations, groups, job_store, nccl_abort
from . import shutdown as _shutdown
from .deadline_scope import until
from .barrier import Meeting
from .generations import Generation
from .shutdown import ShutdownReport
from .state import GroupRecord, current

__all__ = ["Generation", "Meeting", "ShutdownReport", "abandon_world", "arrive", "blame",
           "exits_on_usage_error", "meet", "meet_in_job_store", "next_generation", "regroup",
           "retire_all", "shutdown", "until", "world", "world_retired"]


def world() -> GroupRecord | None:
    """The record of this rank's default process group, or None (no default group, or one
    rankguard does not instrument)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return current().groups.of(dist.distributed_c10d._get_default_group())


def world_retired() -> str | None:
    """Why this rank's default group was retired (for one rankguard does not wrap, NCCL's:
    why its communicator was aborted), or None while it is usable (or absent)."""
    record = world()
    if record is not None:
        return record.retired
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    default = dist.distributed_c10d._get_default_group()
    backend = next((b for group, b in nccl_abort.nccl_groups() if group is default), None)
    return nccl_abort.why_aborted(backend) if backend is not None else None


def retire_all(reason: str) -> None:
    """Retire every process group of this rank: every later or waiting collective on them
    raises (within one wait slice)."""
    groups.retire_all(reason)


def abandon_world(reason: str) -> None:
    """This rank gives up on its default group (it failed by itself): retire the group and
    tell every peer, so that none waits for this rank in a collective. Bounded by
    ``groups.ABANDON_WINDOW_S`` per peer answer; does nothing without a usable group."""
    groups.abandon_world(reason)


def exits_on_usage_error(why: str) -> None:
    """This process is about to end on a mistake of the user's that every attempt would make
    again: its non-zero exit is recorded as a usage error (``why``), which the launcher neither
    restarts nor replaces."""
    current().usage_exit = why


def blame(missing: Iterable[int]) -> None:
    """This rank fails because ranks ``missing`` did not take part: under ``rankguard run``,
    the launcher then blames them, not this rank. Does nothing without a ledger."""
    ledger, missing = current().ledger, list(missing)
    if ledger is not None and missing:
        ledger.record_blame(missing)
        ledger.record_fault(_ledger.FAULT_RAISED, True)


def next_generation() -> int:
    """The number the next :func:`regroup` gives its generation (unique to it in the store)."""
    return generations.next_number()


def regroup(limit: Deadline, exclude: Iterable[int] | None = None,
            keep_size: bool = False) -> Generation:
    """``rankguard.regroup()`` bounded by ``limit``; see ``generations.regroup``."""
    return generations.form_next(limit, exclude, keep_size)


def state_loaded() -> None:
    """A replacement rank holds its state (it loaded it itself, not from a peer): it may make
    process groups of its own."""
    current().awaiting_state = False


def shutdown(limit: Deadline, *, strict: bool = False) -> ShutdownReport:
    """``rankguard.shutdown()`` with its barrier bounded by ``limit``."""
    return _shutdown.shut_down(limit, strict=strict)


def meet(name: str, limit: Deadline, payload: str = "arrived") -> Meeting:
    """Every rank of the default group meets at the store barrier ``name`` (unique to this
    meeting), bringing ``payload``; see ``runtime.barrier``. The default group must exist; it
    may be retired (the barrier lives in the store, not in the group).

    Returns by ``limit`` plus half a second, whatever state the store is in.

    Raises:
        RuntimeError: torch's, when the store fails; ``StoreStalled`` (a RuntimeError) when
            it does not answer in time.
    """
    import torch.distributed as dist

    rank, size = dist.get_rank(), dist.get_world_size()
    return generations.with_store_client(
        limit, f"the barrier {name}",
        lambda client: barrier.meet(client, name, rank, size, limit, payload))


def arrive(name: str, limit: Deadline, payload: str) -> None:
    """Arrive at the store barrier ``name`` of the default group with ``payload`` without
    waiting for the others (they may never hold it: the store keeps the arrival); see
    ``barrier.arrive``. Returns by ``limit`` plus half a second.

    Raises:
        RuntimeError: torch's, when the store fails; ``StoreStalled`` when it does not answer.
    """
    import torch.distributed as dist

    rank, size = dist.get_rank(), dist.get_world_size()
    generations.with_store_client(
        limit, f"the barrier {name}",
        lambda client: barrier.arrive(client, name, rank, size, limit, payload))


def meet_in_job_store(name: str, limit: Deadline, payload: str) -> Meeting | None:
    """Every rank of the job meets at the store barrier ``name`` before any process group
    exists, in the store its launcher hosts (``torchrun``, ``rankguard run``), bringing
    ``payload``; None where no launcher hosts one. See ``runtime.job_store``. Returns by
    ``limit`` plus half a second.

    Raises:
        RuntimeError: torch's, when the store cannot be reached or fails; ``StoreStalled``
            when it does not answer in time.
    """
    return job_store.meet(name, limit, payload)
