"""The verdict on a request that did not succeed: which rank failed first, why, and which ranks
failed only as a consequence. A pure function of what the leader knows at one moment (the
ranks' answers and deaths, their ledgers, which processes are stopped), so that it can be
proven over plain snapshots, without processes.

The rules, in order:

1. the first rank, in the order its news arrived, that died (``exited`` / ``signalled``) or
   raised an error of its own (``raised``; a collective error is a consequence, not a cause):
   ``blame``'s rule, on the one order the leader has for deaths and answers alike;
2. at the deadline (``final``), among the ranks that never answered: the stopped ones
   (``frozen``); else, when a rank returned its result without entering the furthest collective
   a peer entered, the ranks took different paths through the call (code that branches on its
   rank, or a service's ``validate`` that answered differently on different ranks): ``rank``
   None, ``raised``, naming the rank that returned and the collective its peers waited in;
   else those behind that collective (``ledger.behind``), else, when some peer did answer, all
   of the silent ones (``deadline``);
3. every rank silent and none behind: the call's own deadline was too short, no rank is to
   blame (``rank`` None, cause ``deadline``); a silent rank whose answer was still arriving
   (part of it received) is not to blame either: it had finished, and its answer was too large
   to arrive in time;
4. every rank answered with a collective error and none is to blame: ``rank`` None, ``raised``;
   ``deadline`` when the first of them was a rank giving up as the call's deadline passed
   (``CollectiveTimeout``: a peer reached the collective late, every rank answered, none died).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .. import blame
from ..records import ledger as _ledger
from ..processes import proctree
from ..errors import CollectiveTimeout, RequestCause, RequestFailed


@dataclass(frozen=True)
class Ending:
    """How a rank's process ended, or stopped being reachable: in words, and as a cause."""

    detail: str  # "was killed by SIGKILL", "exited with code 3", "closed its channel"
    cause: RequestCause = RequestCause.EXITED  # EXITED or SIGNALLED

    @classmethod
    def of(cls, returncode: int | None, terminated: bool = False) -> Ending:
        """The ending of a process whose Popen return code is ``returncode`` (negative: a
        signal); ``terminated``: its ledger says it got SIGTERM and tore itself down, so that an
        exit it then made by itself (code 0 included) was the signal's doing (``signalled``)."""
        if returncode is None:
            return cls("")
        if terminated and returncode >= 0:
            return cls(proctree.teardown_detail(returncode), RequestCause.SIGNALLED)
        return cls(proctree.exit_detail(returncode),
                   RequestCause.SIGNALLED if returncode < 0 else RequestCause.EXITED)


CHANNEL_CLOSED = Ending("closed its channel")  # counts as an exit

# the error a rank's collective raises when the call's deadline runs out in it, by name
_TIMED_OUT = CollectiveTimeout.__name__


@dataclass
class Outcome:
    """What the ranks answered to one request, so far."""

    results: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its answer
    dead: dict[int, Ending] = field(default_factory=dict)  # rank -> how it ended
    order: list[int] = field(default_factory=list)  # ranks in the order their news arrived

    @property
    def answered(self) -> set[int]:
        return set(self.results) | set(self.failures)

    def all_accounted(self, world: int) -> bool:
        """Every rank answered or died."""
        return len(self.answered | set(self.dead)) == world


class Position(Protocol):
    """Where a rank is in the world group (a ``ledger.GroupProgress``, or a test's fake)."""

    entered: int
    kind: str


def verdict(world: int, outcome: Outcome, took: float, *, final: bool,
            positions: Mapping[int, Position] | None = None,
            stopped: Collection[int] = (),
            arriving: Mapping[int, tuple[int, int]] | None = None,
            out_of_time: bool = False) -> RequestFailed | None:
    """The error for a request that failed, once its root cause is known, or (``final``) at
    its deadline; None while it may still succeed.

    Args:
        world: how many ranks run the request.
        outcome: their answers and deaths so far.
        took: seconds since the call started (for the error).
        final: the deadline has passed (or every rank answered): judge the silent ranks too.
        positions: each rank's world group in its ledger (ranks without one entered nothing).
            Read only when ``final``.
        stopped: the silent ranks whose process is stopped. Read only when ``final``.
        arriving: the silent ranks whose answer was partly received: (bytes received, its
            size). Read only when ``final``.
        out_of_time: the call's own deadline for its collectives has passed, so that a
            ``CollectiveTimeout`` is the call's (not one of a deadline the function set).
    """
    own, consequences = blame.ordered(_failures(outcome))
    victims = [f.rank for f in consequences]
    if own:
        rank, ending = own[0].rank, outcome.dead.get(own[0].rank)
        if ending is not None:
            return RequestFailed(rank, ending.cause, f"{ending.detail} during the request",
                                 victims=victims, took=took)
        answer = outcome.failures[rank]
        return RequestFailed(rank, RequestCause.RAISED, f"raised {answer['error']}: "
                             f"{answer['message']}", error_type=answer["error"],
                             remote_traceback=answer["traceback"], victims=victims, took=took)
    if not final:
        return None
    silent = sorted(set(range(world)) - outcome.answered - set(outcome.dead))
    victims = sorted(outcome.failures)
    absent, where = behind(world, positions or {})
    frozen = [r for r in silent if r in stopped]
    sending = {r: sizes for r, sizes in (arriving or {}).items() if r in silent}
    # silent ranks are to blame when stopped, behind the others, or slower than peers that
    # answered (an answer on its way is not slow); when every rank is silent and none is
    # behind, the deadline was the call's
    returned = [r for r in absent if r in outcome.results]
    if returned and not frozen:  # its peers wait (or waited) for it in a collective for nothing
        waited = sorted(set(range(world)) - set(absent))
        return RequestFailed(None, RequestCause.RAISED, f"failed: rank {returned[0]} returned "
                             f"from the call without entering {where}, which rank"
                             f"{'s' if len(waited) > 1 else ''} {_ranks(waited)} entered and "
                             "waited in: the ranks took different paths through the call (code "
                             "that branches on the rank, or a service's validate that answered "
                             "differently on different ranks: it must give every rank the same "
                             "answer)", victims=sorted(set(range(world)) - set(outcome.results)),
                             took=took)
    culprits = frozen or [r for r in silent if r in absent] or (
        [r for r in silent if r not in sending] if outcome.answered else [])
    if not culprits and sending:
        return RequestFailed(None, RequestCause.DEADLINE, "did not finish before the call's "
                             f"deadline: {_arriving(sending)} (no rank is at fault: the "
                             "deadline was too short for an answer this large; give the call "
                             "more time, or return less)", took=took)
    if not culprits and silent:
        return RequestFailed(None, RequestCause.DEADLINE, "did not finish before the call's "
                             "deadline: every rank was still running it and none was behind "
                             "the others (the deadline was too short for the call, no rank is "
                             "at fault)", took=took)
    if not culprits:  # every rank answered with a collective error and none is to blame
        root = blame.root(consequences)
        assert root is not None  # not culprits and not silent: every rank answered
        first = root.rank
        answer = outcome.failures[first]
        if out_of_time and answer["error"] == _TIMED_OUT:  # the call's ran out in a collective
            waited_for = _ranks(answer.get("missing") or ()) or "its peers"
            return RequestFailed(
                None, RequestCause.DEADLINE, f"did not finish before the call's deadline: "
                f"rank {first} gave up waiting for rank {waited_for} in a collective "
                f"({answer['error']}: {answer['message']}); every rank answered and none "
                "died, so no rank is at fault (the deadline was too short for the call)",
                error_type=answer["error"], victims=victims, took=took)
        return RequestFailed(None, RequestCause.RAISED, f"failed: rank {first} raised "
                             f"{answer['error']}: {answer['message']}", error_type=answer["error"],
                             victims=victims, took=took)
    rank = culprits[0]
    context = f"; it never reached {where}" if rank in absent and where else ""
    if len(culprits) > 1:
        context += f" (ranks {_ranks(culprits)} did not answer)"
    victims = sorted(set(victims) | (set(range(world)) - set(absent) - set(culprits)))
    if rank in frozen:
        return RequestFailed(rank, RequestCause.FROZEN, f"was frozen (its process is stopped) "
                             f"at the request's deadline{context}", victims=victims, took=took)
    return RequestFailed(rank, RequestCause.DEADLINE, f"was still running when the request's "
                         f"deadline passed{context}", victims=victims, took=took)


def _ranks(ranks: Collection[int]) -> str:
    return ", ".join(map(str, ranks))


def _arriving(sending: Mapping[int, tuple[int, int]]) -> str:
    """``rank 0's answer was still arriving (120.0 of 300.0 MB received)``, for each rank."""
    return "; ".join(f"rank {rank}'s answer was still arriving ({received / 1e6:.1f} of "
                     f"{size / 1e6:.1f} MB received)"
                     for rank, (received, size) in sorted(sending.items()))


def _failures(outcome: Outcome) -> list[blame.Failure[None]]:
    """Each rank that died or answered with an error, timed by when the leader first heard of
    it (its place in ``outcome.order``): a death and an error of its own are its own failure,
    a collective error a consequence."""
    heard: dict[int, int] = {}
    for place, rank in enumerate(outcome.order):
        heard.setdefault(rank, place)
    return [blame.Failure(rank, place, rank not in outcome.dead
                          and outcome.failures[rank]["collective"], None)
            for rank, place in heard.items() if rank in outcome.dead or rank in outcome.failures]


def behind(world: int, positions: Mapping[int, Position]) -> tuple[list[int], str]:
    """The ranks behind the furthest collective any rank entered, and that collective
    (``all_reduce #3``); ([], "") when no rank is behind or no rank has a position. The rule is
    the ledger's (``ledger.behind``), shared with the launcher's hang monitor."""
    if not positions:
        return [], ""
    absent, target = _ledger.behind(range(world), positions)  # type: ignore[arg-type]
    if not absent:
        return [], ""
    kind = next(p.kind for p in positions.values() if p.entered == target)
    return absent, _ledger.op_label(kind, _ledger.seq_of(target, True))
