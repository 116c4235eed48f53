"""The process groups of this rank that rankguard instruments, and their retirement.

A group that saw a fault is **retired**, never reused (a gloo group whose collective timed out
has closed its connections; one whose peer died is half-open). Retiring marks it, so every
later operation raises :class:`rankguard.GroupRetired` at once, and keeps its gloo backend
alive for the rest of the process: destroying a gloo backend joins its worker threads, which
would block for the backend's timeout if one of them is still inside a collective with a frozen
peer. The process exits without running that destructor.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any

_live: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


def register(group: Any) -> None:
    """Track an instrumented group (weakly: a destroyed group drops out)."""
    with _lock:
        _live.add(group)


def live() -> list[Any]:
    with _lock:
        return list(_live)


def retire(group: Any, reason: str, notice: dict[str, Any] | None = None) -> None:
    """Mark ``group`` retired (first reason wins) and keep its backend out of destruction.

    ``notice``: a peer's report that the group failed (see ``runtime.probe``), kept so that a
    collective waiting on the group raises ``PeerFailed`` rather than ``GroupRetired``.
    """
    with _lock:
        if group._rankguard_retired is not None:
            return
        group._rankguard_retired = reason
        group._rankguard_notice = notice
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(group._rankguard_backend))


def retire_all(reason: str) -> None:
    for group in live():
        retire(group, reason)


def by_name(name: str) -> Any | None:
    for group in live():
        if group._rankguard_name == name:
            return group
    return None


def on_notice(name: str, notice: dict[str, Any]) -> None:
    """A peer reports that the group called ``name`` failed: retire it here too."""
    group = by_name(name)
    if group is not None:
        retire(group, notice_text(notice), notice)


def notice_text(notice: dict[str, Any]) -> str:
    """What a peer's notice says, in words."""
    if notice.get("reason"):
        return str(notice["reason"])
    return f"rank {notice.get('by')} reported that {notice.get('op')} #{notice.get('seq')} failed"


def describe(name: str) -> dict[str, Any] | None:
    """This rank's progress in the group called ``name``, as a peer's probe wants it."""
    group = by_name(name)
    if group is None:
        return None
    slot = group._rankguard_slot
    entered, done, op = slot.progress() if slot is not None else (0, 0, "none")
    return {"entered": entered, "done": done, "op": op, "world": group._rankguard_is_world,
            "retired": group._rankguard_retired}


def discard_all() -> None:
    """Deinitialise torch.distributed without destructing any backend: every process group,
    instrumented or not, is kept alive for the rest of the process, so no exit or later
    ``init_process_group`` blocks on a worker thread stuck in a collective."""
    from torch.distributed import distributed_c10d as c10d

    for group in list(c10d._world.pg_map):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))
    c10d.destroy_process_group()
    with _lock:  # kept alive, but no longer this rank's: names now refer to the new groups
        _live.clear()


def tell_peers(group: Any, notice: dict[str, Any], window: float | None = None
               ) -> dict[int, dict[str, Any] | None]:
    """Tell every peer of ``group`` that it failed (they retire it too) and collect their
    answers, each within ``window`` seconds (default: the probe's); empty without a probe."""
    from . import instrument
    from .probe import ANSWER_WINDOW_S

    asker = instrument.state.asker
    if asker is None:
        return {}
    peers = [r for r in group._rankguard_ranks if r != group._rankguard_rank]
    return asker.ask(group._rankguard_name, peers, notice,
                     window=ANSWER_WINDOW_S if window is None else window)


def abandon_world(reason: str) -> None:
    """This rank gives up on the current world group: retire it here and tell every peer, so
    that none keeps waiting for this rank in a collective (their wait raises PeerFailed)."""
    for group in live():
        if group._rankguard_retired is None and group._rankguard_is_world:
            retire(group, reason)
            tell_peers(group, {"by": group._rankguard_rank, "reason": reason}, window=0.05)
