"""Guarded teardown: ``rankguard.shutdown(timeout)`` at the end of a script or a test session.

``destroy_process_group()`` after a failure can hang (a peer never arrives at the last
collective), and ``barrier(timeout=)`` exists only from torch 2.13 and names nobody. This is a
barrier in the store instead (``runtime.barrier``: woken by the store, every arrival sealed with
the run's secret), which names the ranks that never arrived, on every rank that got there.

- All arrived: the process groups are destroyed as usual.
- Not all arrived (or the store is gone): the groups are **aborted** instead: retired (see
  ``runtime.groups``: their gloo backends are never destructed, so no exit blocks on a stuck
  thread), NCCL communicators aborted, and torch.distributed deinitialised so the process can
  exit or start over. A line names the missing ranks; ``strict=True`` raises instead of
  returning.
- The outcome is one for every rank: the first view written in the store (``first_authentic``).
  A rank that comes after another one's timeout passed completes the barrier, but that one
  aborted its groups already: the late rank aborts too, and says that the others stopped
  waiting for it.

Bound: the deadline, plus half a second for the barrier's last reads of who arrived
(``generations.with_store_client``), plus ``_DESTROY_ALLOWANCE_S`` for the destroy or abort
itself. The barrier's store calls run through ``store_calls``, so a store whose server
is stopped or frozen (rank 0's, under ``mp.spawn``) is abandoned at that bound instead of
blocking for its own timeout.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from datetime import timedelta
from typing import Any

from ..records import ledger as _ledger
from ..deadline import Deadline, check_seconds
from ..errors import TeardownTimeout, first_line
from ..margins import NCCL_ABORT_S
from . import barrier, generation_keys, generations, groups, nccl_abort
from .shutdown_report import ShutdownReport
from .state import current

DEFAULT_TIMEOUT_S = 10.0
_DESTROY_ALLOWANCE_S = 0.5
_calls = itertools.count()


def shutdown(timeout: float = DEFAULT_TIMEOUT_S, *, strict: bool = False) -> ShutdownReport:
    """Meet every rank at a bounded barrier, then destroy the process groups, or abort them.

    Returns within ``timeout`` + 1 s. Without a process group there is nothing to do and the
    report is clean, unless an earlier call aborted the groups (and none was created since):
    that call's unclean report is returned again (or raised, with ``strict``).

    Args:
        timeout: seconds to wait for the other ranks at the barrier.
        strict: raise :class:`TeardownTimeout` instead of returning an unclean report.

    Raises:
        UsageError: ``timeout`` is not a positive number.
        TeardownTimeout: with ``strict=True``, when a rank did not arrive.
    """
    limit = Deadline.after(check_seconds("rankguard.shutdown(timeout)", timeout, text=False))
    return shut_down(limit, strict=strict)


def shut_down(limit: Deadline, *, strict: bool = False) -> ShutdownReport:
    """:func:`shutdown`, the barrier bounded by ``limit``."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        aborted = current().aborted
        if aborted is None:
            return ShutdownReport(True)
        if strict:
            raise TeardownTimeout(aborted.missing, aborted.waited, aborted.detail)
        return aborted  # an earlier call aborted the groups: that is still the outcome
    current().aborted = None
    rank, size = dist.get_rank(), dist.get_world_size()
    left_out = current().left_out
    if left_out is not None:  # its peers meet in their generation, without it
        return _unclean(rank, [], 0.0, left_out, strict)

    started = time.monotonic()
    ledger = current().ledger
    world = ledger.world() if ledger is not None else None
    if world is not None:
        world.enter(_ledger.OP_CODES["shutdown"])  # the barrier is a wait the supervisor sees
    missing, detail = _barrier(rank, size, limit)
    if world is not None and not missing and not detail:
        world.done()
    waited = time.monotonic() - started
    if not missing and not detail:
        dist.destroy_process_group()
        return ShutdownReport(True, waited=waited)
    return _unclean(rank, missing, waited, detail, strict)


def _unclean(rank: int, missing: list[int], waited: float, detail: str, strict: bool
             ) -> ShutdownReport:
    """Abort this rank's groups; the unclean report (kept for a later call), or raised."""
    _abort()
    report = ShutdownReport(False, missing, waited, detail or
                            f"ranks {', '.join(map(str, missing))} did not arrive")
    current().aborted = report
    error = TeardownTimeout(missing, waited, detail)
    if strict:
        raise error
    os.write(2, f"rankguard: rank {rank}: {error}\n".encode())
    return report


def _barrier(rank: int, size: int, limit: Deadline) -> tuple[list[int], str]:
    """Missing ranks (the other ones), and a reason when the barrier failed: the store is gone
    or stalled, or the others stopped waiting before this rank came. Returns by ``limit`` + half
    a second, whatever state the store is in."""
    name = f"rankguard/shutdown/g{current().generation}/{next(_calls)}"
    outcome = f"{name}/outcome"

    def meet(client: Any) -> tuple[list[int] | None, dict[int, str]]:
        client.set_timeout(timedelta(seconds=limit.wait_time(at_least=barrier.STORE_OP_MIN_S)))
        if client.check([outcome]):  # decided already: the others gave up; no wait of its own
            barrier.arrive(client, name, rank, size, limit)
            meeting = barrier.Meeting(size, barrier.arrivals(client, name, size))
        else:
            meeting = barrier.meet(client, name, rank, size, limit)
        view = None if meeting.complete else meeting.missing
        decided = generation_keys.first_authentic(client, outcome, json.dumps(view),
                                                  limit.later(generations.STORE_ALLOWANCE_S))
        return (view if decided is None else json.loads(decided)), meeting.arrived

    try:
        missing, arrived = generations.with_store_client(limit, "the shutdown barrier", meet)
    except Exception as error:  # noqa: BLE001 (the store's server died or froze)
        return [], f"the store is unreachable: {first_line(error)}"
    if missing is None:
        return [], ""
    if rank not in missing:
        return missing, ""
    # late: the others gave up on it; of the ranks they gave up on, name only those that this
    # rank did not see arrive either
    return ([r for r in missing if r != rank and r not in arrived],
            "the other ranks stopped waiting at the barrier (their timeout passed) before this "
            "rank arrived")


def _abort() -> None:
    groups.retire_all("aborted by rankguard.shutdown()")
    nccl = nccl_abort.nccl_groups()
    if nccl and nccl_abort.abort(nccl, NCCL_ABORT_S).finished:
        from torch.distributed import distributed_c10d as c10d

        try:  # aborted: destroying is quick, and lets the script make a new default group
            c10d.destroy_process_group()
        except Exception:  # noqa: BLE001 (exiting releases the groups anyway)
            pass
    groups.discard_all()
