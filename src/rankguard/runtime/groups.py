"""The process groups of this rank that rankguard instruments, and their retirement.

A group that saw a fault is **retired**, never reused (a gloo group whose collective timed out
has closed its connections; one whose peer died is half-open). Retiring marks its record (see
``runtime.state``), so every later operation raises :class:`rankguard.GroupRetired` at once,
and keeps its gloo backend alive for the rest of the process: destroying a gloo backend joins
its worker threads, which would block for the backend's timeout if one of them is still inside
a collective with a frozen peer. The process exits without running that destructor.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

from ..records import ledger as _ledger
from . import async_groups
from .probe import ANSWER_WINDOW_S
from .state import WORLD, GroupRecord, current

ABANDON_WINDOW_S = 0.05  # how long a rank that gives up waits for its peers to take the notice


def retire(record: GroupRecord, reason: str, notice: dict[str, Any] | None = None) -> None:
    """Mark the group retired (first reason wins) and keep its backend out of destruction.

    ``notice``: a peer's report that the group failed (see ``runtime.probe``), kept so that a
    collective waiting on the group raises ``PeerFailed`` rather than ``GroupRetired``.
    """
    with current().groups.lock:
        if record.retired is not None:
            return
        record.retired = reason
        record.notice = notice
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(record.backend))


def retire_all(reason: str) -> None:
    """Retire every current group of this rank."""
    for record in current().groups.live():
        retire(record, reason)


on_notice_taken: list[Callable[[], None]] = []  # called after a peer's notice retired a group
# called with a peer's notice about a group rankguard does not wrap (NCCL's): set by the rank's
# instrumentation once it watches such groups (``async_deadline.take_peer_notice``)
on_unwrapped_notice: list[Callable[[str, dict[str, Any]], None]] = []


EVERY_GROUP = "every_group"  # a notice's key: its sender gave up on every group it is in


def on_notice(name: str, notice: dict[str, Any]) -> None:
    """A peer reports that the group called ``name`` failed (with ``EVERY_GROUP``: that it
    gave up on every group it is in): retire it here too (and each of those), and release at
    once what waits on it outside Python (``bounded``'s releasable futures; for a group
    rankguard does not wrap, its communicator's abort)."""
    record = current().groups.by_name(name)
    if record is not None:
        retire(record, notice_text(notice), notice)
        if notice.get(EVERY_GROUP):
            for other in current().groups.live():
                if notice.get("by") in other.ranks:
                    retire(other, notice_text(notice), notice)
        for release in on_notice_taken:
            release()
        return
    for take in on_unwrapped_notice:
        take(name, notice)


def notice_text(notice: dict[str, Any]) -> str:
    """What a peer's notice says, in words."""
    if notice.get("reason"):
        return str(notice["reason"])
    return f"rank {notice.get('by')} reported that {notice.get('op')} #{notice.get('seq')} failed"


def describe(name: str) -> dict[str, Any]:
    """This rank's progress in the group called ``name``, as a peer's probe wants it. A rank
    without such a group (it left it, or its connect failed) answers all the same, with
    ``absent`` set: it is alive, which is what a regroup asks (taken for silent, such a rank
    was left out of the next generation by every peer, and each formed one alone)."""
    record = current().groups.by_name(name)
    if record is None:
        sampler = async_groups.sampler()  # a group rankguard does not wrap (NCCL's)?
        found = sampler.describe(name) if sampler is not None else None
        return found if found is not None else {"entered": 0, "done": 0, "op": "none",
                                                "world": name == WORLD, "retired": "",
                                                "absent": True}
    slot = record.slot
    entered, done, op = slot.progress() if slot is not None else (0, 0, "none")
    return {"entered": entered, "done": done, "op": op, "world": record.is_world,
            "retired": record.retired}


def discard_all() -> None:
    """Deinitialise torch.distributed without destructing any backend: every process group,
    instrumented or not, is kept alive for the rest of the process, so no exit or later
    ``init_process_group`` blocks on a worker thread stuck in a collective. Without a default
    group (its connect failed), only torch's count of the groups it named is reset."""
    from torch.distributed import distributed_c10d as c10d

    if c10d.is_initialized():
        for group in list(c10d._world.pg_map):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))
        c10d.destroy_process_group()
    else:  # a connect that failed left no group, but torch counted the name it gave it
        c10d._world.group_count = 0  # the next default group is "0", as its new members' is
    current().groups.discard_all()  # kept alive, but names now refer to the new groups


def tell_peers(record: GroupRecord, notice: dict[str, Any], window: float = ANSWER_WINDOW_S
               ) -> dict[int, dict[str, Any] | None]:
    """Tell every peer of the group that it failed (they retire it too) and collect their
    answers, each within ``window`` seconds; empty without a probe."""
    asker = current().asker
    if asker is None:
        return {}
    return asker.ask(record.name, record.peers, notice, window=window, gone=_reported_dead)


def supervisor_notice() -> tuple[str, int] | None:
    """The supervisor's notice in this rank's ledger (``died`` or ``hung``, and the rank it
    names), None without one or without a ledger."""
    ledger = current().ledger
    return ledger.notice() if ledger is not None else None


def _reported_dead(peer: int) -> bool:
    """Whether the supervisor's notice in this rank's ledger says ``peer`` died (a rank's
    pool, or ``rankguard run``): such a peer will not answer, and is not waited for."""
    notice = supervisor_notice()
    return notice is not None and notice == (_ledger.NOTICE_NAMES[_ledger.NOTICE_DIED], peer)


_abandoned_unwrapped: set[int] = set()  # generations whose unwrapped world this rank gave up


def abandon_world(reason: str) -> None:
    """This rank gives up on the current world group, and so on every group it is in: retire
    them here and tell every peer (one notice, on the world group), so that none keeps waiting
    for this rank in a collective, of the world or of a sub-group (their wait raises
    PeerFailed; on NCCL, their world communicator is aborted). Once per world group."""
    state = current()
    record = state.groups.world()
    if record is not None:
        if record.retired is None:
            retire_all(reason)
            tell_peers(record, {"by": record.rank, "reason": reason, EVERY_GROUP: True},
                       window=ABANDON_WINDOW_S)
        return
    sampler = async_groups.sampler()  # a default group rankguard does not wrap (NCCL's)?
    if (state.asker is None or sampler is None or sampler.describe(WORLD) is None
            or state.generation in _abandoned_unwrapped):
        return
    import torch.distributed as dist

    _abandoned_unwrapped.add(state.generation)
    rank = dist.get_rank()
    peers = [peer for peer in range(dist.get_world_size()) if peer != rank]
    notice = {"by": rank, "reason": reason}
    state.asker.ask(WORLD, peers, notice, window=ABANDON_WINDOW_S, gone=_reported_dead)
    for take in on_unwrapped_notice:  # its own communicator too: no later collective waits
        take(WORLD, notice)
