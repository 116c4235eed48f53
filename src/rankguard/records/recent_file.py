"""A rank's recent operations kept after its attempt: ``LOG_DIR/attemptN/recent_rankR.json``.

The ledgers live in memory and go with the run; when an attempt ends, the launcher copies each
rank's ring (``ledger.LedgerReader.recent``) into this file, with wall-clock times, for
``rankguard report`` and ``rankguard flight-recorder`` to read later. One JSON object:

``{"format": 1, "rank": R, "attempt": N, "pid": P, "earlier": E, "ops": [OP, ...]}`` (``E``:
whether older operations were not kept) with each OP, in the order the rank entered them,
``{"n": number in the rank's order, "op": "all_reduce", "seq": 57, "world": true,
"group": "3a9f...", "members": [0, 1], "t_enter": wall seconds, "t_done": wall seconds or
null}`` (``group``: the group's key in hex, the same on every rank; ``t_done``: when the rank
was seen to have completed it, null if it never was). An operation of an asynchronous group
(NCCL's, read from torch's Flight Recorder) has three more: ``"state"`` (``enqueued``,
``started`` or ``completed``: how far its device got), ``"t_started"`` (wall seconds its device
was seen starting it, or null: not seen, or not known) and ``"bytes"`` (its inputs' size, or
null: not known); its ``t_enter`` is when the CPU enqueued it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from . import ledger as _ledger
from . import private_files
from .ledger_ring import AsyncState
from ..errors import LedgerError

FORMAT = 1


@dataclass(frozen=True)
class Op:
    """One recent operation of one rank, times on the wall clock."""

    number: int
    op: str
    seq: int
    world: bool
    group: str  # the group's key, hex
    members: tuple[int, ...]
    t_enter: float
    t_done: float | None
    state: str | None = None  # an asynchronous group's: enqueued, started or completed
    t_started: float | None = None
    bytes: int | None = None

    @property
    def asynchronous(self) -> bool:
        """An operation of an asynchronous group (the CPU enqueued it; see the module doc)."""
        return self.state is not None

    @property
    def group_label(self) -> str:
        """``world``, ``world/gloo``, or ``ranks 0,2`` for a sub-group."""
        return _ledger.group_label(int(self.group, 16), self.world, self.members)

    @property
    def label(self) -> str:
        """``all_reduce #57``, ``init_process_group``, ``barrier #3 on group ranks 0,2``."""
        return _ledger.op_label(self.op, self.seq, self.group_label)


@dataclass(frozen=True)
class RankRecent:
    """One rank's file."""

    rank: int
    attempt: int
    pid: int
    ops: tuple[Op, ...]
    earlier: bool = False  # older operations were not kept (the rings wrapped)


def path(attempt_dir: str, rank: int) -> str:
    return os.path.join(attempt_dir, f"recent_rank{rank}.json")


def write(attempt_dir: str, rank: int, attempt: int, pid: int,
          ops: list[_ledger.RecentOp], wall_offset: float) -> None:
    """Write rank ``rank``'s recent operations (monotonic times + ``wall_offset`` = wall).

    Raises:
        OSError: the file cannot be written.
    """
    def wall(t: float | None) -> float | None:
        return None if t is None else round(t + wall_offset, 6)

    oldest: dict[int, int] = {}
    for op in ops:
        oldest.setdefault(op.group_key, op.seq - (0 if op.is_world else 1))
    def entry(op: _ledger.RecentOp) -> dict[str, Any]:
        found = {"n": op.number, "op": op.op, "seq": op.seq, "world": op.is_world,
                 "group": f"{op.group_key:016x}",
                 "members": [r for r in range(64) if op.members >> r & 1],
                 "t_enter": wall(op.t_enter), "t_done": wall(op.t_done)}
        if op.state is not None:
            found.update(state=op.state.name.lower(), t_started=wall(op.t_started),
                         bytes=op.nbytes)
        return found

    record = {"format": FORMAT, "rank": rank, "attempt": attempt, "pid": pid,
              "earlier": any(oldest.values()), "ops": [entry(op) for op in ops]}
    target = path(attempt_dir, rank)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(record, out, separators=(",", ":"))


LIMIT = 16 << 20  # bytes: a file of 64 groups' rings is well under 1 MB


def read(file: str) -> RankRecent:
    """One rank's file: a regular file only (a FIFO is not waited on, a symbolic link planted at
    its name is not read through), at most ``LIMIT`` bytes.

    Raises:
        LedgerError: it cannot be read, or is not a recent-operations file of this format.
    """
    try:
        record = json.loads(private_files.read_regular(file, LIMIT, follow=False))
    except (OSError, ValueError, RecursionError) as exc:  # NotRegular is a ValueError
        raise LedgerError(f"cannot read {file}: {type(exc).__name__}: {exc}") from None
    try:
        if record.get("format") != FORMAT:
            raise LedgerError(f"{file} is not a recent-operations file of format {FORMAT}")
        return RankRecent(int(record["rank"]), int(record["attempt"]), int(record["pid"]),
                          tuple(_op(entry) for entry in record["ops"]),
                          bool(record.get("earlier", False)))
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise LedgerError(f"{file} is damaged ({type(exc).__name__}: {exc})") from exc


STATES = tuple(state.name.lower() for state in AsyncState)


def _op(entry: dict[str, Any]) -> Op:
    done, started, size = entry["t_done"], entry.get("t_started"), entry.get("bytes")
    state = entry.get("state")
    if state is not None and state not in STATES:
        raise ValueError(f"{state!r} is not a state ({', '.join(STATES)})")
    return Op(int(entry["n"]), str(entry["op"]), int(entry["seq"]), bool(entry["world"]),
              str(entry["group"]), tuple(int(r) for r in entry["members"]),
              _finite(entry["t_enter"]), None if done is None else _finite(done),
              None if state is None else str(state),
              None if started is None else _finite(started),
              None if size is None else int(size))


def _finite(value: Any) -> float:
    number = float(value)
    if not math.isfinite(number) or isinstance(value, bool):
        raise ValueError(f"{value!r} is not a time")
    return number


def read_attempt(attempt_dir: str) -> dict[int, RankRecent]:
    """Every rank's file of one attempt's folder, by rank (files that cannot be read, or that
    name another rank than their name does, are skipped: a rank whose ledger could not be read
    at the end has none)."""
    found = {}
    try:
        names = sorted(os.listdir(attempt_dir))
    except OSError:
        return {}
    for name in names:
        if name.startswith("recent_rank") and name.endswith(".json"):
            try:
                recent = read(os.path.join(attempt_dir, name))
            except LedgerError:
                continue
            if name == f"recent_rank{recent.rank}.json":  # a file naming another rank is not
                found[recent.rank] = recent
    return found
