"""Whether a fault can be repaired in place (``--recovery in-place``): a pure decision over what
the agent knows of its ranks at that moment, so that each refusal reason is a table row
(``tests/launcher/test_replace_rules.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .outcome import FaultKind

REPLACEABLE = frozenset({FaultKind.RAISED, FaultKind.SIGNALLED, FaultKind.EXITED,
                         FaultKind.HUNG})


@dataclass(frozen=True)
class Member:
    """One rank of this node, as the agent sees it when a fault arrives.

    Attributes:
        alive: its process has not exited (as far as the agent has reaped).
        joining: it is a replacement that does not hold the state yet (it cannot give it).
        ended_well: it left, or is leaving, with exit code 0 (its script ended), or it was
            stopped by the launcher after that: it is gone with no fault of its own.
        step_loop: its ledger says it runs inside ``rankguard.StepLoop.run``.
        loop_ended: its ledger says a ``StepLoop.run`` of it has ended (its loop is over: it
            cannot take a replacement in, though it ran one).
        bounded: its ledger says it runs in bounded mode.
    """

    alive: bool
    joining: bool = False
    ended_well: bool = False
    step_loop: bool = True
    loop_ended: bool = False
    bounded: bool = True


def culprits(named: frozenset[int], members: Mapping[int, Member]) -> frozenset[int]:
    """The ranks a fault naming ``named`` replaces: those, and each rank of this node that has
    exited with a fault of its own by now (not with code 0, and not a replacement still
    joining: that one's own fault repairs it). Ranks that die in the same operation are reaped
    together, but a fault names one: the others are replaced with it, in one generation,
    instead of being found gone (a refusal, then a restart)."""
    if not named:
        return named
    gone = {rank for rank, member in members.items()
            if not member.alive and not member.ended_well and not member.joining}
    return named | gone


def refusal(kind: FaultKind, culprits: frozenset[int], members: Mapping[int, Member],
            restarts_left: int, world: int) -> str | None:
    """Why a fault of ``kind`` naming ``culprits`` cannot be repaired in place (None: it can).

    ``members``: this node's ranks; ``world``: the ranks of the job on every node (another
    node's ranks can give a replacement the state). A replacement still joining holds no state:
    when every rank but the culprits is one, no rank is left to give it, and the fault ends the
    attempt at once (a restart) instead of waiting for a generation that cannot form."""
    if kind == FaultKind.REPLACE_FAILED:
        return "a replacement that does not join in time is not replaced again"
    if kind == FaultKind.USAGE_ERROR:
        return "a usage error is the script's own: a replacement would make it again"
    if kind not in REPLACEABLE or not culprits:
        return "the fault names no rank to replace"
    if not culprits <= members.keys():
        return (f"rank {min(culprits - members.keys())} runs on another node (whose agent "
                "replaces it, or ends the round)")
    if kind == FaultKind.EXITED and any(members[r].ended_well for r in culprits):
        return "the rank ended its script (exit code 0)"
    joining = sorted(r for r, m in members.items() if m.joining and r not in culprits)
    if len(culprits) + len(joining) >= world:
        if joining:
            return ("no other rank holds the state to give a replacement (rank "
                    f"{', '.join(map(str, joining))} is itself a replacement still joining)")
        return "no other rank holds the state to give a replacement"
    if restarts_left < len(culprits):
        if restarts_left <= 0:
            return "no restarts left (each replacement counts as one)"
        return (f"{len(culprits)} ranks to replace but {restarts_left} restart"
                f"{'s' if restarts_left > 1 else ''} left (each replacement counts as one)")
    for rank, member in sorted(members.items()):
        if rank in culprits or member.joining:
            continue  # a replacement on its way runs StepLoop once it has joined
        if not member.alive:
            return f"rank {rank} has already exited"
        if not member.step_loop and member.loop_ended:
            return f"rank {rank} has left its rankguard.StepLoop (its run() ended)"
        if not member.step_loop:
            return f"rank {rank} does not run its loop in rankguard.StepLoop"
        if not member.bounded:
            return f"rank {rank} is not in bounded mode"
    return None
