"""How a pool's replica start-ups are going: how many failed in a row, why the last one did,
when the next may begin, and whether the pool has failed. The pause after failures is a pure
rule (:func:`pause_after`); the pool's supervisor records each start-up's end here, under the
pool's lock.

A start-up that fails is retried after ``BACKOFF_FIRST_S``, doubling with each failure in a
row up to the pool's ``max_backoff``. Calls fail fast (the pool is ``failed``) once the setup
raised (a bug in it will not go away by itself), or after ``FAILED_AFTER`` failures in a row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..deadline import Deadline
from .budgets import BACKOFF_FIRST_S
from .replica import StartFailure

FAILED_AFTER = 3  # start-ups failing in a row (a rank died, or was late) before calls fail fast
FIRST_ESTIMATE_S = 3.0  # how long a start-up takes, before one has succeeded


def pause_after(failures: int, max_backoff: float) -> float:
    """Seconds to wait before the next start-up after ``failures`` (>= 1) failed in a row."""
    return min(max_backoff, BACKOFF_FIRST_S * 2 ** (failures - 1))


def gave_up(failures: int, last: StartFailure | None) -> bool:
    """Whether the start-ups are failing for good: the setup raised, or ``FAILED_AFTER``
    start-ups failed in a row."""
    return last is not None and (bool(last.remote_traceback) or failures >= FAILED_AFTER)


@dataclass
class StartBackoff:
    """The start-ups of one pool's replicas; see the module docstring. Not thread-safe: the
    pool's lock guards it.

    Args:
        max_backoff: the longest pause, in seconds, between start-ups that keep failing.
    """

    max_backoff: float
    failures: int = 0  # in a row
    last_failure: StartFailure | None = None
    estimate_s: float = FIRST_ESTIMATE_S  # how long the last start-up that succeeded took
    next_start: Deadline = field(default_factory=lambda: Deadline.after(0.0))

    def succeeded(self, took: float) -> None:
        """A replica started, in ``took`` seconds: the failures are forgotten."""
        self.estimate_s = took
        self.failures = 0
        self.last_failure = None

    def failed(self, failure: StartFailure) -> float:
        """A replica did not start: the next start-up waits; returns how long."""
        self.failures += 1
        self.last_failure = failure
        pause = pause_after(self.failures, self.max_backoff)
        self.next_start = Deadline.after(pause)
        return pause

    def gave_up(self) -> bool:
        """The pool has failed (see :func:`gave_up`); start-ups go on, with backoff."""
        return gave_up(self.failures, self.last_failure)

    def describe(self) -> str:
        """Why the pool has failed, in words."""
        failure = self.last_failure
        return (f"{self.failures} start-up(s) in a row failed; the last: "
                f"{failure.describe() if failure else '?'}; next try in "
                f"{self.next_start.wait_time():.1f} s")
