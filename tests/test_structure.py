"""Structure checks that grep can make (issue 30): a fault's kind is a ``FaultKind``, never a
string literal written out in the launcher's code; no field of the rank runtime's state is typed
``Any``."""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest

from rankguard.launcher.outcome import FaultKind
from rankguard.runtime import state

SRC = Path(__file__).resolve().parent.parent / "src" / "rankguard"
KINDS = "|".join(kind.value for kind in FaultKind)
# Fault("hung", ...), RoundEnd(False, node, "store_lost", ...), fault.kind == "raised",
# kind in ("node_lost", ...)
LITERAL = re.compile(rf'(Fault\(\s*"({KINDS})"|RoundEnd\([^)]*"({KINDS})"'
                     rf'|\.kind\s*(==|!=|not in|in)\s*\(?"({KINDS})")')


def test_no_fault_kind_is_written_as_a_string_literal():
    found = [f"{path.relative_to(SRC)}:{number}: {line.strip()}"
             for path in sorted(SRC.rglob("*.py")) if path.name != "outcome.py"
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if LITERAL.search(line)]
    assert not found, "\n".join(found)


def test_the_check_finds_what_it_looks_for():
    assert LITERAL.search('return Fault("hung", now, None, text)')
    assert LITERAL.search('if fault.kind == "store_lost":')
    assert LITERAL.search('fault.kind not in ("launcher_signal", "standby_end")')
    assert not LITERAL.search("if fault.kind == FaultKind.STORE_LOST:")


def names_any(annotation: str, namespace: dict[str, object]) -> bool:
    """Whether a field's annotation (its source text) says ``Any`` anywhere: ``Any``,
    ``typing.Any``, ``dict[str, Any]``, or a name that ``namespace`` binds to ``typing.Any``."""
    for node in ast.walk(ast.parse(annotation, mode="eval")):
        if isinstance(node, ast.Attribute) and node.attr == "Any":
            return True
        if isinstance(node, ast.Name) and (node.id == "Any"
                                           or namespace.get(node.id) is typing.Any):
            return True
    return False


def test_no_field_of_the_rank_state_is_typed_any():
    typed_any = [f"RankState.{f.name}: {f.type}" for f in dataclasses.fields(state.RankState)
                 if names_any(str(f.type), vars(state))]
    assert not typed_any, "\n".join(typed_any)


@pytest.mark.parametrize("annotation, says_any", [
    ("Any", True),
    ("Any | None", True),
    ("typing.Any", True),
    ("collections.deque[Any]", True),
    ("dict[str, Any] | None", True),
    ("Anything", False),  # a name that merely starts with Any
    ("Injector | None", False),
    ("collections.deque[HandedOut]", False),
])
def test_the_any_check_finds_what_it_looks_for(annotation, says_any):
    assert names_any(annotation, {"Anything": int}) is says_any


def test_the_any_check_sees_through_an_alias_of_any():
    assert names_any("Alias | None", {"Alias": typing.Any})
