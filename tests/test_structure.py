"""Structure checks that grep can make (issue 30): a fault's kind is a ``FaultKind``, never a
string literal written out in the launcher's code; likewise serving's kinds (a call's
``RequestCause``, ``UnavailableState``, ``PoolState``, a message's ``Op``, a ``CallOutcome``)."""

from __future__ import annotations

import re
from pathlib import Path

from rankguard.errors import RequestCause, UnavailableState
from rankguard.launcher.outcome import FaultKind
from rankguard.serving.messages import Op
from rankguard.serving.metrics import CallOutcome
from rankguard.serving.pool_options import HealingMode
from rankguard.serving.pool_state import PoolState

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


# Serving's kinds (issue 30, item 4): a call's cause, why no replica ran it, the pool's state, a
# message's op, how a call ended. Each is an enum; none is written out as a string literal
# where it is made or tested.
CAUSES = "|".join(cause.value for cause in RequestCause)
UNAVAILABLE = "|".join(state.value for state in UnavailableState)
POOL_STATES = "|".join(state.value for state in PoolState)
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
