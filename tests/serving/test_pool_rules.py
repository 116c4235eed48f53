"""The pool's pure rules, as tables: the pause between start-ups that keep failing and when the
pool has failed (``serving.backoff``), the pool's state (``serving.pool_state``), and its
options checked once (``serving.pool_options``). No processes."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

from rankguard.errors import UsageError
from rankguard.serving.backoff import FAILED_AFTER, StartBackoff, gave_up, pause_after
from rankguard.serving.budgets import BACKOFF_FIRST_S
from rankguard.serving.pool import Pool
from rankguard.serving.pool_options import HealingMode, PoolOptions
from rankguard.serving.pool_state import PoolState, state_of
from rankguard.serving.replica import StartFailure

LATE = StartFailure(1, "was not ready within 5 s")
SETUP_RAISED = StartFailure(0, "failed its setup: ValueError: boom", "Traceback...")

# (failures in a row, max_backoff) -> pause in seconds
PAUSES = {
    "the first failure pauses the first backoff": ((1, 30.0), BACKOFF_FIRST_S),
    "each failure in a row doubles the pause": ((3, 30.0), BACKOFF_FIRST_S * 4),
    "the pause never exceeds max_backoff": ((20, 30.0), 30.0),
    "a max_backoff below the first pause caps it too": ((1, 0.1), 0.1),
}


@pytest.mark.parametrize("case", PAUSES.values(), ids=PAUSES.keys())
def test_pause_after(case: tuple[tuple[int, float], float]) -> None:
    (failures, most), pause = case
    assert pause_after(failures, most) == pytest.approx(pause)


# (failures in a row, the last failure) -> whether the pool has failed
GAVE_UP = {
    "no failure yet: not failed": ((0, None), False),
    "a late start-up is retried before the pool fails": ((FAILED_AFTER - 1, LATE), False),
    "enough late start-ups in a row make the pool failed": ((FAILED_AFTER, LATE), True),
    "a setup that raised makes the pool failed at once": ((1, SETUP_RAISED), True),
}


@pytest.mark.parametrize("case", GAVE_UP.values(), ids=GAVE_UP.keys())
def test_gave_up(case: tuple[tuple[int, StartFailure | None], bool]) -> None:
    (failures, last), expected = case
    assert gave_up(failures, last) is expected


def test_a_start_up_that_succeeds_forgets_the_failures_and_sets_the_estimate() -> None:
    backoff = StartBackoff(max_backoff=30.0)
    assert backoff.next_start.passed() and not backoff.gave_up()
    for _ in range(FAILED_AFTER):
        pause = backoff.failed(LATE)
    assert pause == pytest.approx(pause_after(FAILED_AFTER, 30.0))
    assert not backoff.next_start.passed() and backoff.gave_up()
    assert backoff.describe().startswith(f"{FAILED_AFTER} start-up(s) in a row failed; the "
                                         "last: rank 1 was not ready within 5 s; next try in")
    backoff.succeeded(0.25)
    assert (backoff.failures, backoff.last_failure, backoff.estimate_s) == (0, None, 0.25)
    assert not backoff.gave_up()


# (closed, healthy replicas, start-ups gave up, a replica was lost) -> the pool's state
STATES = {
    "a closed pool is closed, whatever else holds": ((True, 2, True, True), PoolState.CLOSED),
    "a healthy replica makes the pool ready, even while start-ups fail": (
        (False, 1, True, True), PoolState.READY),
    "no healthy replica and start-ups that gave up: failed": (
        (False, 0, True, False), PoolState.FAILED),
    "no healthy replica after a loss: healing": ((False, 0, False, True), PoolState.HEALING),
    "no healthy replica yet, none lost: starting": ((False, 0, False, False),
                                                    PoolState.STARTING),
}


@pytest.mark.parametrize("case", STATES.values(), ids=STATES.keys())
def test_state_of(case: tuple[tuple[bool, int, bool, bool], PoolState]) -> None:
    given, state = case
    assert state_of(*given) == state


def _options(**given: Any) -> PoolOptions:
    """``PoolOptions.checked`` as ``Pool(2, **given)`` calls it, with Pool's own defaults."""
    defaults = {name: p.default for name, p in inspect.signature(Pool).parameters.items()
                if p.kind is p.KEYWORD_ONLY and name != "wait"}
    return PoolOptions.checked(2, None, **{**defaults, **given})


def test_the_options_are_checked_once_with_their_derived_defaults() -> None:
    options = _options(replicas=2, timeout=3.0)
    assert (options.suspect_after, options.max_queue, options.min_call_s) == \
        (pytest.approx(0.6), 64, 0.3)
    assert options.on_healing == HealingMode.WAIT == "wait"
    with pytest.raises(UsageError, match=r"Pool\(on_healing\): 'later' is not one of wait, fail"):
        _options(on_healing="later")


@pytest.mark.parametrize("log_dir, problem", [
    ("/proc/nope", "cannot create '/proc/nope'"),
    ("/etc/passwd", "'/etc/passwd' is not a folder"),
    (5, "expected a folder's path, got 5"),
])
def test_a_log_dir_that_cannot_be_one_is_refused_by_name_before_anything_starts(
        log_dir: object, problem: str) -> None:
    with pytest.raises(UsageError, match=rf"Pool\(log_dir\): {re.escape(problem)}"):
        _options(log_dir=log_dir)
