"""``rankguard.margins``: the margins between steps of one bounded operation agree by
construction, and shrink with the time left so that a short deadline keeps room for its steps."""

from __future__ import annotations

import ast
import re
import time
from pathlib import Path
from typing import Iterator

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


@pytest.mark.parametrize(("left", "window"), [(0.5, 0.5), (3.0, 2.0), (10.0, 5.0),
                                              (8.0, 4.0), (60.0, 5.0)])
def test_regroups_second_ask_takes_half_the_time_left_within_its_floor_and_cap(
        left: float, window: float) -> None:
    limit = Deadline(time.monotonic() + left, left)
    assert margins.second_ask_window(limit) == pytest.approx(window, abs=0.05)


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


# -- one place for each figure ---------------------------------------------------------------------

SRC = Path(margins.__file__).resolve().parent
FIGURE = re.compile(r"^_?[A-Z][A-Z0-9_]*_S$")  # a time figure, in seconds, by its name


def _figures(tree: ast.Module) -> Iterator[tuple[str, ast.expr]]:
    """Each module-level ``NAME_S = value`` of ``tree``: the name and the value."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and FIGURE.match(target.id):
                yield target.id, value


def _places(sources: dict[str, str]) -> tuple[dict[str, list[str]], list[str]]:
    """Where each figure's name is defined (module names by figure), and the figures defined
    as nothing but another figure's name (``STALL_S = ASYNC_STALL_S``)."""
    defined: dict[str, list[str]] = {}
    aliases = []
    for module, text in sources.items():
        for name, value in _figures(ast.parse(text)):
            defined.setdefault(name, []).append(module)
            if isinstance(value, ast.Name) and FIGURE.match(value.id):
                aliases.append(f"{module}: {name} = {value.id}")
    return {name: where for name, where in defined.items() if len(where) > 1}, aliases


def _sources() -> dict[str, str]:
    return {str(path.relative_to(SRC)): path.read_text() for path in sorted(SRC.rglob("*.py"))}


def test_each_figure_is_defined_in_one_place_under_one_name() -> None:
    """A time figure's name is defined by one module of the package: a figure that two steps
    must agree on lives in ``margins.py`` (or serving's in ``serving/budgets.py``) and is
    imported from there; two figures that mean different things have different names; and no
    module gives a shared figure a second name of its own."""
    twice, aliases = _places(_sources())
    assert not twice, f"defined in more than one module: {twice}"
    assert not aliases, f"a second name for one figure: {aliases}"


def test_the_one_place_check_finds_what_it_looks_for() -> None:
    twice, aliases = _places({
        "a.py": "EXIT_S = 0.2\nSTALL_S = ASYNC_STALL_S\n_OWN_S: float = 1.0\nLIMIT = 3\n",
        "b.py": "EXIT_S = 5.0\n_OWN_S = 1.0\nLIMIT = 3\ndef f():\n    EXIT_S = 1\n",
        "c.py": "WAIT_S = EXIT_S + 1.0\n"})
    assert twice == {"EXIT_S": ["a.py", "b.py"], "_OWN_S": ["a.py", "b.py"]}
    assert aliases == ["a.py: STALL_S = ASYNC_STALL_S"]
