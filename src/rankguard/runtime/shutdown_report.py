"""What ``rankguard.shutdown()`` did: a value of its own, so that the rank's state can keep the
report of the shutdown that aborted its groups (``state.RankState.aborted``) without importing
the shutdown itself."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ShutdownReport:
    """What ``rankguard.shutdown()`` did.

    Attributes:
        clean: every rank arrived and the process groups were destroyed.
        missing: the ranks that did not arrive within the timeout.
        waited: seconds spent in the barrier.
        detail: why it was not clean, in words ("" when clean).
    """

    clean: bool
    missing: list[int] = field(default_factory=list)
    waited: float = 0.0
    detail: str = ""
