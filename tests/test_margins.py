"""``rankguard.margins``: the margins between steps of one bounded operation agree by
construction, and shrink with the time left so that a short deadline keeps room for its steps."""

from __future__ import annotations

import time

import pytest

from rankguard import margins
from rankguard.deadline import Deadline


def test_a_rank_teardown_ends_before_the_launcher_kill() -> None:
    for grace in (0.0, 0.05, 1.0, 5.0, 300.0):
        assert margins.rank_grace(grace) <= max(grace, 0.05)
        assert margins.rank_grace(grace) >= 0.05
    assert margins.POOL_RANK_GRACE_S < margins.RELEASE_GRACE_S


def test_collectives_give_up_early_enough_for_the_probe_and_the_report() -> None:
    assert margins.EXPLAIN_MARGIN_S - margins.REPORT_MARGIN_S >= margins.ANSWER_WINDOW_S


@pytest.mark.parametrize("seconds", [0.2, 1.0, 4.0, 60.0, 600.0])
def test_the_steps_of_a_ranks_test_come_in_order_before_its_deadline(seconds: float) -> None:
    deadline = Deadline(time.monotonic() + seconds, seconds)
    collectives, answers = margins.collectives_by(deadline), margins.answers_by(deadline)
    reformed = margins.reformed_by(deadline)
    assert collectives.at <= answers.at <= deadline.at and reformed.at <= deadline.at
    # a margin never takes more than its share of the time left
    assert deadline.at - collectives.at <= seconds / 2 + 1e-6
    assert deadline.at - answers.at <= seconds / 4 + 1e-6
    assert deadline.at - collectives.at <= margins.EXPLAIN_MARGIN_S + 1e-9
    assert deadline.at - answers.at <= margins.REPORT_MARGIN_S + 1e-9


def test_a_deadline_that_passed_gets_no_negative_margin() -> None:
    passed = Deadline(time.monotonic() - 1, 1)
    assert margins.answers_by(passed).at == passed.at
    assert margins.collectives_by(passed).at == passed.at
