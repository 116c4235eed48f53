"""Fake ledger snapshots for the table tests of the launcher's decisions: plain
``GroupProgress`` / ``RankProgress`` values, as ``LedgerReader.read`` returns them.

Times are on a made-up monotonic clock that starts at 0.
"""

from __future__ import annotations

import dataclasses

from rankguard.records import ledger as L

WORLD = L.group_key("world")


def group(entered: int, done: int | None = None, kind: str = "all_reduce",
          t_enter: float = 0.0, members: int = 0b11, name: str = "world") -> L.GroupProgress:
    """One group slot: ``entered`` operations, ``done`` of them completed (all by default),
    the last (``kind``) entered at ``t_enter`` and, when done, completed then too. The world
    group unless ``name`` says otherwise (a sub-group of ``members``, a bitmask of ranks)."""
    done = entered if done is None else done
    return L.GroupProgress(L.group_key(name), members, name == "world", bin(members).count("1"),
                           entered, done, kind, t_enter, t_enter if done == entered else 0.0)


def world(entered: int, done: int | None = None, kind: str = "all_reduce",
          t_enter: float = 0.0, members: int = 0b11) -> L.GroupProgress:
    """The world group's slot (see ``group``)."""
    return group(entered, done, kind, t_enter, members)


def sub(entered: int, done: int | None = None, kind: str = "barrier", t_enter: float = 0.0,
        members: int = 0b110) -> L.GroupProgress:
    """A sub-group's slot, ranks 1,2 by default (see ``group``)."""
    return group(entered, done, kind, t_enter, members, name=f"sub{members}")


def nccl(enqueued: int, started: int, completed: int, t_enter: float = 0.0,
         t_done: float = 0.0, kind: str = "all_reduce", members: int = 0b11,
         name: str = "world") -> L.GroupProgress:
    """An asynchronous (NCCL) group of one rank: the last operation its CPU ``enqueued``, its
    GPU ``started`` (-1: not known) and ``completed``; ``t_enter`` when it last enqueued,
    ``t_done`` when its completions last moved; ``kind`` the operation it waits in."""
    return L.GroupProgress(L.group_key(name), members, name == "world", bin(members).count("1"),
                           enqueued, completed, kind, t_enter, t_done, started, True)


def ledger(*groups: L.GroupProgress, fault: int = L.FAULT_NONE, in_collective: bool = False,
           t_fault: float = 0.0, exit_code: int = 0, blamed: tuple[int, ...] = (),
           t_start: float = 0.0) -> L.RankProgress:
    """A rank's whole ledger: its group slots and its own fault, if any; ``t_start``: when its
    process took its rank."""
    return L.RankProgress(1, 0, fault, in_collective, t_fault, t_start, groups, blamed,
                          exit_code)


def raised_in(entered: int, t_fault: float) -> L.RankProgress:
    """A rank whose collective failed (gloo marks it done) and whose exception reached the top."""
    return ledger(world(entered, t_enter=t_fault - 0.1), fault=L.FAULT_RAISED,
                  in_collective=True, t_fault=t_fault)


def leaving(entered: int, t_fault: float, code: int) -> L.RankProgress:
    """A rank whose script ended at ``t_fault`` and that is leaving with exit code ``code``."""
    return ledger(world(entered), fault=L.FAULT_EXITING, t_fault=t_fault, exit_code=code)


def usage_error(entered: int, t_fault: float, text: str,
                in_collective: bool = False) -> L.RankProgress:
    """A rank whose ``rankguard.UsageError`` (saying ``text``) reached the top at ``t_fault``."""
    return dataclasses.replace(ledger(world(entered), fault=L.FAULT_RAISED,
                                      in_collective=in_collective, t_fault=t_fault),
                               error=L.ErrorKind.USAGE, error_text=text)
