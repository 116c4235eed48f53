"""Structure checks that grep can make (issue 30): a fault's kind is a ``FaultKind``, never a
string literal written out in the launcher's code; the job store's keys are spelled in one
module (``launcher/store_keys.py``); the launcher is composed (it holds a node link), never
extended by a subclass; its signal handlers raise nothing; no field of the rank runtime's state
is typed ``Any``; serving's kinds (a call's ``RequestCause``, ``UnavailableState``,
``PoolState``, a message's ``Op``, a ``CallOutcome``) are enums, never string literals."""

from __future__ import annotations

import ast
import dataclasses
import re
import typing
from pathlib import Path

import pytest

from rankguard.errors import RequestCause, UnavailableState
from rankguard.launcher.outcome import FaultKind
from rankguard.serving.messages import Op
from rankguard.serving.metrics import CallOutcome
from rankguard.serving.pool_options import HealingMode
from rankguard.runtime import state
from rankguard.serving.pool_state import PoolState

SRC = Path(__file__).resolve().parent.parent / "src" / "rankguard"
KINDS = "|".join(kind.value for kind in FaultKind)
# Fault("hung", ...), RoundEnd(False, node, "store_lost", ...), fault.kind == "raised",
# kind in ("node_lost", ...)
LITERAL = re.compile(rf'(Fault\(\s*"({KINDS})"|RoundEnd\([^)]*"({KINDS})"'
                     rf'|\.kind\s*(==|!=|not in|in)\s*\(?"({KINDS})")')


def _lines_matching(pattern: re.Pattern[str], except_in: str = "", under: Path = SRC
                    ) -> list[str]:
    """Every source line below ``under`` that ``pattern`` finds, outside the module named
    ``except_in``."""
    return [f"{path.relative_to(SRC)}:{number}: {line.strip()}"
            for path in sorted(under.rglob("*.py")) if path.name != except_in
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if pattern.search(line)]


def test_no_fault_kind_is_written_as_a_string_literal():
    found = _lines_matching(LITERAL, "outcome.py")
    assert not found, "\n".join(found)


def test_the_check_finds_what_it_looks_for():
    assert LITERAL.search('return Fault("hung", now, None, text)')
    assert LITERAL.search('if fault.kind == "store_lost":')
    assert LITERAL.search('fault.kind not in ("launcher_signal", "standby_end")')
    assert not LITERAL.search("if fault.kind == FaultKind.STORE_LOST:")


# a key or prefix of the job's store, spelled out: "/rankguard/{run_id}/..."
STORE_KEY = re.compile(r'f?"/rankguard/')


def test_the_job_stores_keys_are_spelled_only_in_store_keys():
    found = _lines_matching(STORE_KEY, "store_keys.py")
    assert not found, "\n".join(found)


# class X(Agent):, class X(agent.Agent, Other):
SUBCLASS = re.compile(r"^\s*class\s+\w+\s*\([^)]*\bAgent\b")


def test_no_class_derives_from_the_launchers_agent():
    """What several nodes add goes through the agent's node link (``node_link``)."""
    found = _lines_matching(SUBCLASS)
    assert not found, "\n".join(found)


def test_no_signal_handler_of_the_launcher_raises():
    """A signal handler sets a flag and wakes waits; the loops act (a raise from a handler
    lands wherever the main thread happens to be). The one raise a handler may reach is
    ``Interruptible.cut``'s, inside the one call its ``run`` makes and catches (see
    ``test_only_the_interruptible_call_is_cut_short``)."""
    launcher = SRC / "launcher"
    handlers = [(path, node) for path in sorted(launcher.glob("*.py"))
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.FunctionDef)
                and node.name in ("_on_signal", "on_signal", "interrupt")]
    assert handlers, "the launcher's signal handlers were not found"
    found = [f"{path.relative_to(SRC)}:{node.lineno}: {node.name}" for path, node in handlers
             if any(isinstance(inner, ast.Raise) for inner in ast.walk(node))]
    assert not found, "\n".join(found)


def test_only_the_interruptible_call_is_cut_short():
    """``interruptible`` raises in ``cut`` and in its repeats, and catches what they raise in
    ``run``."""
    tree = ast.parse((SRC / "launcher" / "interruptible.py").read_text())
    raising = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
               and any(isinstance(inner, ast.Raise) and inner.exc is not None
                       and "CutShort" in ast.unparse(inner.exc) for inner in ast.walk(node))}
    catching = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                and any(isinstance(inner, ast.ExceptHandler) and isinstance(inner.type, ast.Name)
                        and inner.type.id == "CutShort" for inner in ast.walk(node))}
    assert (raising, catching) == ({"cut", "_repeat"}, {"run"})


def test_the_subclass_check_finds_what_it_looks_for():
    assert SUBCLASS.search("class NodeAgent(Agent):")
    assert SUBCLASS.search("class NodeAgent(agent.Agent):")
    assert not SUBCLASS.search("class MultiNode:")
    assert not SUBCLASS.search("class AgentError(Exception):")


def test_the_attempt_loops_decision_reads_no_clock_and_does_no_io():
    """``watch_rules`` decides from what the loop observed (its time included); the loop acts."""
    tree = ast.parse((SRC / "launcher" / "watch_rules.py").read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert not imported & {"time", "os", "socket", "subprocess", "threading", "selectors"}


def test_no_infinite_time_stands_for_a_decision():
    """'Decide now, they have all exited' is a method of its own (``cause_once_ended``), not a
    time of ``math.inf`` that a callee tests for."""
    found = _lines_matching(re.compile(r"isinf\("), under=SRC / "launcher")
    assert not found, "\n".join(found)


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


# Serving's kinds (issue 30, item 4): a call's cause, why no replica ran it, the pool's state, a
# message's op, how a call ended. Each is an enum; none is written out as a string literal
# where it is made or tested.
CAUSES = "|".join(cause.value for cause in RequestCause)
UNAVAILABLE = "|".join(value.value for value in UnavailableState)
POOL_STATES = "|".join(value.value for value in PoolState)
OPS = "|".join(op.value for op in Op)
OUTCOMES = "|".join(outcome.value for outcome in CallOutcome)
HEALING = "|".join(mode.value for mode in HealingMode)
SERVING_LITERAL = re.compile(
    rf'RequestFailed\([^,]*,\s*"({CAUSES})"'  # RequestFailed(rank, "raised", ...)
    rf'|PoolUnavailable\(\s*"({UNAVAILABLE})"'  # PoolUnavailable("busy", ...)
    rf'|\.cause\s*(==|!=|not in|in)\s*\(?"({CAUSES})"'  # fault.cause == "raised"
    rf'|(\b|_)state(\(\))?\s*(==|!=|not in|in)\s*\(?"({POOL_STATES}|{UNAVAILABLE})"'
    rf'|"op":\s*"({OPS})"|\bop\s*(==|!=)\s*"({OPS})"'  # {"op": "run"}, op == "ready"
    rf'|outcome\s*(=|==|!=)\s*"({OUTCOMES})"'  # outcome = "failed"
    rf'|on_healing\s*(==|!=)\s*"({HEALING})"'
    rf'|\.startswith\("was killed')  # a cause read back out of the words that describe it
DOC_LITERAL = re.compile(r"``.*?``")  # how a docstring shows a value: not code
SERVING_ENUMS = {"errors.py", "serving/messages.py", "serving/pool_state.py",
                 "serving/metrics.py", "serving/pool_options.py"}


def test_no_serving_kind_is_written_as_a_string_literal():
    found = [f"{path.relative_to(SRC)}:{number}: {line.strip()}"
             for folder in ("serving", "testing") for path in sorted((SRC / folder).rglob("*.py"))
             if str(path.relative_to(SRC)) not in SERVING_ENUMS
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if SERVING_LITERAL.search(DOC_LITERAL.sub("", line))]
    assert not found, "\n".join(found)


def test_the_serving_check_finds_what_it_looks_for():
    for line in ('return RequestFailed(rank, "frozen", f"was frozen")',
                 'raise PoolUnavailable("busy", 1.0, "full")',
                 'idle = fault.cause == "raised" and replica.alive()',
                 'if state == "failed" or (state == "healing")',
                 'if status.state == "ready":', 'state = self._state(); x.state() != "starting"',
                 'end.send({"op": "ready", "pid": 1})', 'if op == "regroup":',
                 'outcome = "abandoned"', 'lambda: self.start_state() != "starting"',
                 'state == "healing" and self.on_healing == "fail"',
                 'cause = "signalled" if detail.startswith("was killed") else "exited"'):
        assert SERVING_LITERAL.search(line), line
    for line in ('return RequestFailed(rank, RequestCause.FROZEN, f"was frozen")',
                 'if status.state == PoolState.READY:', 'end.send({"op": Op.READY})',
                 'outcome = CallOutcome.ABANDONED'):
        assert not SERVING_LITERAL.search(line), line
