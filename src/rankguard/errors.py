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
    ├── TeardownTimeout     a guarded teardown could not finish within its budget
    ├── RendezvousError     the nodes of a run did not meet (a round not formed in time, the
    │                       job's store lost)
    └── PoolError           a call on a ``rankguard.Pool`` that did not run to completion
        ├── RequestFailed       a rank failed it: raised, exited, was killed, froze, overran
        ├── PoolUnavailable     no healthy group to run it: healing, start-up failing, busy
        │                       (and the pytest plugin's warm ranks that did not start)
        └── PoolClosed          the pool was closed
"""

from __future__ import annotations

import enum
from typing import Callable, Sequence


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
    """A progress ledger, or the copy of its recent operations kept in a run's logs
    (``recent_file``), that cannot be used (wrong size or format, missing file)."""


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


class RendezvousError(RankguardError):
    """The agents of a multi-node run could not form a rendezvous round.

    Attributes:
        endpoint: ``HOST:PORT`` of the job's store.
        timeout: the bound that passed, in seconds (``join_timeout``), or None.
    """

    def __init__(self, endpoint: str, problem: str, timeout: float | None = None) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        super().__init__(problem)


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
        who = (f"ranks {_ranks(self.missing)} did not arrive" if self.missing
               else "the ranks could not meet")
        text = (f"shutdown: {who} within {waited:.2f} s; the process group was aborted, "
                "not destroyed")
        if detail:
            text += f" ({detail})"
        super().__init__(text)


class PoolError(RankguardError):
    """A call on a :class:`rankguard.Pool` that did not run to completion. The pool itself
    stays usable (it heals in the background) unless the error is :class:`PoolClosed`."""


class RequestCause(enum.StrEnum):
    """Why a call of a pool failed (:attr:`RequestFailed.cause`). A ``str``: it compares equal
    to, prints as and goes into JSON as its value."""

    RAISED = "raised"  # an exception in the function
    EXITED = "exited"  # the process exited (or closed its channel)
    SIGNALLED = "signalled"  # killed by a signal
    FROZEN = "frozen"  # stopped (SIGSTOP) at the deadline
    DEADLINE = "deadline"  # still running when the request's deadline passed


class UnavailableState(enum.StrEnum):
    """Why no replica could run a call (:attr:`PoolUnavailable.state`). A ``str``, like
    :class:`RequestCause`."""

    HEALING = "healing"  # faults retired every replica; a new one is starting
    FAILED = "failed"  # start-ups keep failing, or the setup raised
    STARTING = "starting"  # the first replica is not ready yet
    BUSY = "busy"  # the replicas ran other calls until the deadline, or the queue is full
    ABANDONED = "abandoned"  # the caller gave the call up while it waited


class RequestFailed(PoolError):
    """A rank failed the request in flight; only that request is affected.

    Attributes:
        rank: the rank that failed first (the root cause), or None if none could be singled out.
        cause: a :class:`RequestCause` (a ``str``): ``raised`` (an exception in the function),
            ``exited`` (the process exited), ``signalled`` (killed by a signal), ``frozen``
            (stopped, e.g. SIGSTOP), or ``deadline`` (still running when the request's
            deadline passed).
        detail: the cause in words (the exception, the exit code, the signal).
        error_type: the exception's class name, for ``raised``; else None.
        remote_traceback: the rank's traceback, for ``raised``; else "".
        victims: ranks that failed only because of the root cause (a collective error).
        took: seconds from the start of the call to this error.
    """

    def __init__(self, rank: int | None, cause: RequestCause | str, detail: str, *,
                 error_type: str | None = None, remote_traceback: str = "",
                 victims: Sequence[int] = (), took: float = 0.0) -> None:
        self.rank = rank
        self.cause = RequestCause(cause)
        self.detail = detail
        self.error_type = error_type
        self.remote_traceback = remote_traceback
        self.victims = list(victims)
        self.took = took
        who = f"rank {rank}" if rank is not None else "the pool"
        text = f"request failed after {took:.2f} s: {who} {detail}"
        if self.victims:
            text += (f" ({'ranks' if len(self.victims) > 1 else 'rank'} {_ranks(self.victims)} "
                     "failed as a consequence)")
        super().__init__(text)


class PoolUnavailable(PoolError):
    """No healthy group could run the call before its deadline (or at once, when the pool is
    configured to fail fast while healing). The pytest plugin raises it (``failed``) when the
    warm ranks of a ``@pytest.mark.ranks`` test do not start.

    Attributes:
        state: an :class:`UnavailableState` (a ``str``): ``healing`` (a fault retired the
            group; a new one is coming), ``failed`` (groups keep failing at start-up; see
            ``detail``), ``starting``, ``busy`` (the group was running other calls until the
            deadline, or too many calls wait), or ``abandoned`` (the caller gave the call up
            while it waited).
        retry_after: seconds after which a retry may succeed (an estimate).
        detail: what is going on, in words.
    """

    def __init__(self, state: UnavailableState | str, retry_after: float, detail: str) -> None:
        self.state = UnavailableState(state)
        self.retry_after = retry_after
        self.detail = detail
        super().__init__(f"pool unavailable ({state}): {detail}")


class PoolClosed(PoolError):
    """The pool was closed; it runs no more calls."""


CHAIN_DEPTH = 16  # how deep an exception's causes are searched


def in_chain(error: BaseException | None, wanted: Callable[[BaseException], bool],
             context: bool = True) -> BaseException | None:
    """The first exception in ``error``'s chain of causes (``__cause__``, else, with
    ``context``, ``__context__``: an error raised while another was handled; at most
    ``CHAIN_DEPTH`` deep) for which ``wanted`` is true, or None."""
    for _ in range(CHAIN_DEPTH):
        if error is None:
            return None
        if wanted(error):
            return error
        error = error.__cause__ or (error.__context__ if context else None)
    return None


def first_line(error: BaseException) -> str:
    """The first line of another library's error, for one of ours (its type's name if empty)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def shown(value: object) -> str:
    """``value`` as an error message shows it: its repr, cut to at most 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
