"""Structure checks that grep can make (issue 30): a fault's kind is a ``FaultKind``, never a
string literal written out in the launcher's code; the job store's keys are spelled in one
module (``launcher/store_keys.py``)."""

from __future__ import annotations

import re
from pathlib import Path

from rankguard.launcher.outcome import FaultKind

SRC = Path(__file__).resolve().parent.parent / "src" / "rankguard"
KINDS = "|".join(kind.value for kind in FaultKind)
# Fault("hung", ...), RoundEnd(False, node, "store_lost", ...), fault.kind == "raised",
# kind in ("node_lost", ...)
LITERAL = re.compile(rf'(Fault\(\s*"({KINDS})"|RoundEnd\([^)]*"({KINDS})"'
                     rf'|\.kind\s*(==|!=|not in|in)\s*\(?"({KINDS})")')


def _lines_matching(pattern: re.Pattern[str], except_in: str) -> list[str]:
    """Every source line that ``pattern`` finds, outside the module named ``except_in``."""
    return [f"{path.relative_to(SRC)}:{number}: {line.strip()}"
            for path in sorted(SRC.rglob("*.py")) if path.name != except_in
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
