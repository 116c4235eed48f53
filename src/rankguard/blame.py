"""Who failed first: the one rule every face of rankguard uses to name a root cause.

A rank's failure is either its **own** (it died, hung, or raised an error of its own) or a
**consequence** (it failed inside a collective, which is what a peer's fault does to its peers).
The root cause is the earliest own failure. A consequence is the root only when no own failure
is known, and only once it has stood ``window`` seconds: time for the fault of a peer that
caused it to show (a process's death is seen after the fact, a hang only at its deadline).

The faces differ only in what "when" means, each the best clock it has:
- the launcher: the monotonic time each rank's ledger says it failed (``launcher.outcome``);
- serving: the order in which the leader heard of each rank (``serving.verdict``): a rank's
  death and its answer come down different channels, so the leader's order is the one order it
  has for both;
- the pytest plugin: the time each rank says it failed (``testing.report``).

Pure: every function reads nothing but its arguments.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

Detail = TypeVar("Detail")


@dataclass(frozen=True)
class Failure(Generic[Detail]):
    """One rank's failure as blame sees it.

    Attributes:
        rank: the rank that failed.
        at: when it failed, on the face's own clock (only compared with each other).
        consequence: it failed inside a collective (a peer's fault may have caused it).
        detail: what the face knows of it (its fault, its answer), carried through.
    """

    rank: int
    at: float
    consequence: bool
    detail: Detail


def root(failures: Iterable[Failure[Detail]], now: float = math.inf,
         window: float = 0.0) -> Failure[Detail] | None:
    """The root cause among ``failures`` at ``now``, or None.

    The earliest own failure; else the earliest consequence that has stood ``window`` seconds
    at ``now``. Ties go to the lower rank. ``now`` left out: every consequence has stood.
    """
    counted = [f for f in failures if not f.consequence or now - f.at >= window]
    return min(counted, key=_order) if counted else None


def ordered(failures: Iterable[Failure[Detail]]) -> tuple[list[Failure[Detail]],
                                                          list[Failure[Detail]]]:
    """The own failures, earliest first (the first is the root cause), and the consequences,
    by rank."""
    failures = list(failures)
    return (sorted((f for f in failures if not f.consequence), key=_order),
            sorted((f for f in failures if f.consequence), key=lambda f: f.rank))


def _order(failure: Failure[Detail]) -> tuple[bool, float, int]:
    return failure.consequence, failure.at, failure.rank
