"""A pool's heal durations (``serving.heal_times``): the histogram counts every heal since the
pool started, the latest are kept, and neither grows with the heals."""

from __future__ import annotations

from rankguard.serving.heal_times import HEAL_BUCKETS, RECENT, HealTimes


def test_the_buckets_are_cumulative_and_count_every_heal() -> None:
    times = HealTimes()
    for seconds in (0.04, 0.3, 0.3, 7.0, 120.0):
        times.add(seconds)
    buckets = dict(times.buckets())
    assert list(buckets) == [f"{bound:g}" for bound in HEAL_BUCKETS] + ["+Inf"]
    assert (buckets["0.05"], buckets["0.25"], buckets["0.5"], buckets["5"], buckets["10"],
            buckets["60"], buckets["+Inf"]) == (1, 1, 3, 3, 4, 4, 5)
    assert (times.count, round(times.total_s, 6)) == (5, 127.64)


def test_many_heals_keep_only_the_latest_durations_but_count_them_all() -> None:
    times = HealTimes()
    for heal in range(3 * RECENT):
        times.add(float(heal))
    assert list(times.recent) == [float(h) for h in range(2 * RECENT, 3 * RECENT)]
    assert times.count == 3 * RECENT and dict(times.buckets())["+Inf"] == 3 * RECENT
