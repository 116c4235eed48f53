"""The exception hierarchy of rankguard.

Every error that rankguard raises on purpose derives from :class:`RankguardError`, so a caller
can catch them all in one place. Each class carries machine-readable fields beside a message a
person understands.

    RankguardError
    ├── UsageError          bad command-line flags, config, environment, fault spec or argument
    ├── LedgerError         a progress ledger file that is missing, foreign or corrupt
    ├── CollectiveError     a collective that did not complete; its process group is retired
    │   ├── CollectiveTimeout   its deadline passed before every rank arrived
    │   └── PeerFailed          a peer died, closed its connection, or was reported failed
    ├── GroupRetired        an operation on a process group retired by an earlier fault
    └── TeardownTimeout     a guarded teardown could not finish within its budget
"""

from __future__ import annotations

from typing import Sequence


class RankguardError(Exception):
    """Base class of every error rankguard raises on purpose."""


class UsageError(RankguardError):
    """Bad input from the user: a flag, a value, a path, a fault spec.

    Attributes:
        what: the flag or field that is wrong (e.g. ``--nproc-per-node``).
        hint: how to fix it, in one sentence.
    """

    def __init__(self, what: str, problem: str, hint: str = "") -> None:
        self.what = what
        self.problem = problem
        self.hint = hint
        text = f"{what}: {problem}"
        if hint:
            text += f" ({hint})"
        super().__init__(text)


class LedgerError(RankguardError):
    """A progress ledger that cannot be used (wrong size, wrong magic number, missing file)."""


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


class CollectiveError(RankguardError):
    """A collective that did not complete. Its process group is retired: every later operation
    on it raises :class:`GroupRetired`; ``rankguard.regroup()`` forms the next generation.

    Attributes:
        op: the collective's name (``all_reduce``).
        seq: its sequence number in its group (``all_reduce #57``: the 57th collective).
        group: the group's name (``world`` for the default group).
        rank: this rank, in that group's numbering of the world.
        missing: ranks (global) that had not arrived, or did not answer, when it failed.
        waited: seconds this rank waited in the collective.
        peers: what each rank answered when asked where it was, by rank (``"at all_reduce
            #56"``, ``"no answer"``); empty when the peers could not be asked.
    """

    def __init__(self, cause: str, *, op: str, seq: int, group: str, rank: int,
                 missing: Sequence[int], waited: float, peers: dict[int, str] | None = None
                 ) -> None:
        self.cause = cause
        self.op = op
        self.seq = seq
        self.group = group
        self.rank = rank
        self.missing = list(missing)
        self.waited = waited
        self.peers = dict(peers or {})
        where = f"{op} #{seq} on group {group!r}"
        text = f"rank {rank}: {where} {cause} after {waited:.2f} s"
        if self.missing:
            text += f"; ranks that had not arrived: {_ranks(self.missing)}"
        details = [f"rank {r} {state}" for r, state in sorted(self.peers.items())
                   if r in self.missing]
        if details:
            text += f" ({'; '.join(details)})"
        text += ". The process group is retired: call rankguard.regroup() or exit."
        super().__init__(text)


class CollectiveTimeout(CollectiveError):
    """The collective's deadline passed before every rank arrived."""


class PeerFailed(CollectiveError):
    """A peer died, closed its connection, or was reported failed by the supervisor."""


class GroupRetired(RankguardError):
    """An operation on a process group that an earlier fault (or a teardown) retired.

    Attributes:
        group: the group's name.
        reason: what retired it.
    """

    def __init__(self, group: str, reason: str) -> None:
        self.group = group
        self.reason = reason
        super().__init__(f"process group {group!r} is retired ({reason}); it cannot run "
                         "collectives any more: call rankguard.regroup() to form a new one")


class TeardownTimeout(RankguardError):
    """A guarded teardown (``rankguard.shutdown``) could not finish within its budget.

    Attributes:
        missing: ranks that never arrived at the shutdown barrier.
        waited: seconds waited.
    """

    def __init__(self, missing: Sequence[int], waited: float, detail: str = "") -> None:
        self.missing = list(missing)
        self.waited = waited
        text = (f"shutdown: ranks {_ranks(self.missing)} did not arrive within {waited:.2f} s; "
                "the process group was aborted, not destroyed")
        if detail:
            text += f" ({detail})"
        super().__init__(text)
