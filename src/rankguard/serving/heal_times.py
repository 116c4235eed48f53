"""How long a pool's heals took, in memory that does not grow with them: what the
``rankguard_pool_heal_seconds`` histogram needs since the pool started (the count, the sum and
a count per bucket) and the latest durations (``Pool.heal_durations()``)."""

from __future__ import annotations

from collections import deque

# seconds: a heal takes a fraction of a second with a ready spare, seconds without one
HEAL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RECENT = 1000  # durations kept for Pool.heal_durations()


class HealTimes:
    """The heals' durations, added one at a time (not thread-safe: the pool's lock guards it).
    """

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self._within = [0] * len(HEAL_BUCKETS)  # per bucket: heals that took at most its bound
        self.recent: deque[float] = deque(maxlen=RECENT)

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total_s += seconds
        self.recent.append(seconds)
        for index, bound in enumerate(HEAL_BUCKETS):
            if seconds <= bound:
                self._within[index] += 1

    def buckets(self) -> list[tuple[str, int]]:
        """Prometheus' cumulative buckets: (upper bound, heals within it), ``+Inf`` last."""
        return [*((f"{bound:g}", n) for bound, n in zip(HEAL_BUCKETS, self._within)),
                ("+Inf", self.count)]
