"""How a rank of a suite every rank runs tells its peers that it left a test (pure words)."""

from __future__ import annotations

import pytest

from rankguard.testing.session import left_test

LEFT_CASES = {
    "a test that failed in its call failed it": ("call", "failed", False, "failed t.py::x"),
    "a fixture that failed at setup failed the setup": (
        "setup", "failed", False, "failed the setup of t.py::x"),
    "a fixture that failed at teardown failed the teardown": (
        "teardown", "failed", False, "failed the teardown of t.py::x"),
    "pytest.skip in the test skipped it": ("call", "skipped", False, "skipped t.py::x"),
    "a fixture's pytest.skip skipped the setup": (
        "setup", "skipped", False, "skipped the setup of t.py::x"),
    "pytest.xfail in the test xfailed it, not skipped it": (
        "call", "skipped", True, "xfailed t.py::x"),
}


@pytest.mark.parametrize(("when", "outcome", "xfail", "words"), LEFT_CASES.values(),
                         ids=LEFT_CASES.keys())
def test_left_test(when: str, outcome: str, xfail: bool, words: str) -> None:
    assert left_test("t.py::x", when, outcome, xfail) == words
