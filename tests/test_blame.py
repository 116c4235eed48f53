"""The one rule that names a root cause (``rankguard.blame``), as a table: each failure is
(rank, at, consequence); the answer is the rank blamed at ``now``, or None."""

from __future__ import annotations

import math

import pytest

from rankguard import blame

WINDOW = 1.0
ROOT_CASES = {
    "no failure blames no one": ([], math.inf, None),
    "the earliest own failure is the root": ([(1, 5.0, False), (0, 6.0, False)], 10.0, 1),
    "an own failure beats an earlier consequence": ([(0, 1.0, True), (2, 3.0, False)], 10.0, 2),
    "a fresh consequence alone blames no one yet": ([(0, 9.5, True)], 10.0, None),
    "a consequence that stood the window is the root when no rank failed on its own":
        ([(0, 8.0, True), (1, 9.5, True)], 10.0, 0),
    "an own failure that came after a consequence stood still wins":
        ([(0, 1.0, True), (1, 9.9, False)], 10.0, 1),
    "without a time every consequence has stood": ([(3, 2.0, True), (1, 4.0, True)], math.inf, 3),
    "a tie goes to the lower rank": ([(2, 5.0, False), (1, 5.0, False)], 10.0, 1),
}


@pytest.mark.parametrize(("failures", "now", "blamed"), ROOT_CASES.values(), ids=ROOT_CASES.keys())
def test_root(failures: list[tuple[int, float, bool]], now: float, blamed: int | None) -> None:
    found = blame.root([blame.Failure(r, at, c, f"detail of {r}") for r, at, c in failures],
                       now, WINDOW)
    assert (found.rank if found else None) == blamed
    if found is not None:
        assert found.detail == f"detail of {blamed}"  # the face's own data comes back


def test_ordered_puts_own_failures_earliest_first_and_consequences_by_rank() -> None:
    failures = [blame.Failure(r, at, c, None)
                for r, at, c in [(4, 3.0, True), (2, 7.0, False), (0, 9.0, True), (3, 1.0, False)]]
    own, consequences = blame.ordered(failures)
    assert [f.rank for f in own] == [3, 2]
    assert [f.rank for f in consequences] == [0, 4]
