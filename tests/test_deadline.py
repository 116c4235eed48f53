"""The one Deadline type and the one seconds validator (rankguard.deadline)."""

from __future__ import annotations

import fractions
import math
import pickle
import subprocess
import sys
import time

import pytest

from rankguard.deadline import MAX_SECONDS, Deadline, check_seconds
from rankguard.errors import UsageError


@pytest.mark.parametrize("value, options, expected", [
    (1, {}, 1.0),
    (0.25, {}, 0.25),
    ("2.5", {}, 2.5),
    (" 3 ", {}, 3.0),
    (0, {"zero": True}, 0.0),
    ("inf", {"infinite": True}, math.inf),
    (MAX_SECONDS, {}, MAX_SECONDS),
    (fractions.Fraction(1, 4), {"text": False}, 0.25),  # any real number: numpy's too
])
def test_check_seconds_accepts(value: object, options: dict, expected: float) -> None:
    assert check_seconds("t", value, **options) == expected


@pytest.mark.parametrize("value, options, says", [
    (0, {}, "positive"),
    (-1, {"zero": True}, "zero or more"),
    (float("nan"), {}, "positive"),
    (math.inf, {}, "finite"),
    (MAX_SECONDS * 2, {}, "above"),
    (True, {}, "expected a number"),
    (None, {}, "expected a number"),
    ("1_0", {}, "expected a number"),
    ("soon", {}, "expected a number"),
    ([1], {}, "expected a number"),
])
def test_check_seconds_refuses_naming_the_value(value: object, options: dict, says: str) -> None:
    with pytest.raises(UsageError) as caught:
        check_seconds("--budget", value, **options)
    assert "--budget" in str(caught.value) and says in str(caught.value)


@pytest.mark.parametrize("value, options, problem", [
    ("0", {"least": 0.001}, "'0' is below 0.001"),
    ("0.05", {"least": 0.1}, "'0.05' is below 0.1"),
    ("-1", {"zero": True}, "'-1' is below 0"),
    ("20", {"most": 10.0}, "'20' is above 10"),
    ("1e300", {}, "'1e300' is above 1000000000"),
    ("1e999", {}, "'1e999' is not a finite number of seconds"),
    ("5", {"text": False}, "expected a number of seconds, got '5'"),
    (10**400, {}, "1000000000000000000000000000000000000... is above 1000000000"),  # no float
])
def test_check_seconds_states_the_range_it_refuses(value: object, options: dict,
                                                   problem: str) -> None:
    with pytest.raises(UsageError) as caught:
        check_seconds("--budget", value, **options)
    assert caught.value.problem == problem


def test_check_seconds_hint_is_the_rule_unless_the_caller_gives_one() -> None:
    with pytest.raises(UsageError) as caught:
        check_seconds("--budget", "0", least=0.5)
    assert caught.value.hint == "give at least 0.5 seconds"
    with pytest.raises(UsageError) as caught:
        check_seconds("--budget", "0", least=0.5, hint="e.g. --budget 5")
    assert caught.value.hint == "e.g. --budget 5"
    assert check_seconds("--budget", "0.5", least=0.5) == 0.5
    assert check_seconds("--budget", 10, most=10.0) == 10.0


def test_later_moves_the_instant_and_keeps_the_budget() -> None:
    limit = Deadline.after(5)
    moved = limit.later(2)
    assert moved.at == limit.at + 2 and moved.seconds == limit.seconds
    assert Deadline.never().later(1).at == math.inf


def test_within_and_sooner_keep_the_earliest() -> None:
    outer = Deadline.after(10)
    assert outer.within(60) is outer
    inner = outer.within(1)
    assert inner.at < outer.at and inner.seconds == 1
    assert outer.sooner(inner) is inner and inner.sooner(outer) is inner
    assert outer.sooner(None) is outer
    assert outer.before(2).at == outer.at - 2


def test_wait_time_is_bounded_by_its_floor_and_cap() -> None:
    passed = Deadline(time.monotonic() - 1, 1)
    assert passed.passed() and passed.remaining() < 0
    assert passed.wait_time() == 0.0 and passed.wait_time(at_least=0.001) == 0.001
    soon = Deadline.after(5)
    assert 0 < soon.wait_time(0.2) <= 0.2
    assert not Deadline.never().passed() and Deadline.never().wait_time(1.0) == 1.0


def test_a_deadline_is_immutable_and_pickles_as_its_instant() -> None:
    limit = Deadline.after(3)
    with pytest.raises(AttributeError):
        limit.at = 0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(limit)) == limit


def test_the_instant_means_the_same_in_another_process() -> None:
    """CLOCK_MONOTONIC is one clock for the machine: a child reads the parent's instant."""
    limit = Deadline.after(30)
    code = ("import pickle,sys; d = pickle.loads(bytes.fromhex(sys.argv[1])); "
            "print(d.remaining())")
    out = subprocess.run([sys.executable, "-c", code, pickle.dumps(limit).hex()],
                         capture_output=True, text=True, timeout=60, check=True)
    assert 0 < float(out.stdout) <= 30


def test_wait_time_or_none_is_none_only_for_a_deadline_that_never_passes() -> None:
    assert Deadline.never().wait_time_or_none() is None
    assert 0 < Deadline.after(5).wait_time_or_none() <= 5
    assert Deadline(time.monotonic() - 1, 1).wait_time_or_none() == 0.0
