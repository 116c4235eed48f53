"""Whether the ranks of a suite every rank runs collected the same tests, and the words of how
they differ (pure: ``rankguard.testing.collected``)."""

from __future__ import annotations

import pytest

from rankguard.testing.collected import FIX, Collected, agree, difference

A, B, C, D = (f"tests/x.py::test_{name}" for name in "abcd")

AGREE_CASES = {
    "ranks with the same tests in the same order agree": (
        {0: Collected.of([A, B], 0), 1: Collected.of([A, B], 0)}, True),
    "ranks with the same tests in another order do not": (
        {0: Collected.of([A, B], 0), 1: Collected.of([B, A], 0)}, False),
    "a rank with one test less does not": (
        {0: Collected.of([A, B], 0), 1: Collected.of([A], 0)}, False),
    "a rank with a collection error that its peers lack does not": (
        {0: Collected.of([A], 0), 1: Collected.of([A], 1)}, False),
    "ranks that all had the same errors agree (every rank stops by pytest's rule)": (
        {0: Collected.of([A], 2), 1: Collected.of([A], 2)}, True),
    "ranks that collected nothing agree": (
        {0: Collected.of([], 0), 1: Collected.of([], 0)}, True),
    # ids keep a newline where pytest's escaping is turned off
    # (disable_test_id_escaping_and_forfeit_all_rights_to_community_support)
    "one test whose id holds two ids joined by a newline is not those two tests": (
        {0: Collected.of([f"{A}\n{B}"], 0), 1: Collected.of([A, B], 0)}, False),
}


@pytest.mark.parametrize(("brought", "agreed"), AGREE_CASES.values(), ids=AGREE_CASES.keys())
def test_agree(brought: dict[int, Collected], agreed: bool) -> None:
    assert agree(brought) is agreed


def test_a_fingerprint_travels_as_text() -> None:
    collected = Collected.of([A, B], 1)
    assert Collected.loads(collected.dumps()) == collected


@pytest.mark.parametrize("text", ["", "[1, 2]", "{}", '["abc", "x", 0]'])
def test_text_that_is_not_a_fingerprint_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="not a collection fingerprint"):
        Collected.loads(text)


DIFFERENCE_CASES = {
    "a rank that lacks one test is named with its count and the first test that differs": (
        {0: [A, B, C], 1: [A, C]}, {},
        f"rank 1 collected 2 tests, rank 0 3: first difference at index 1: rank 0 has {B}, "
        f"rank 1 {C}"),
    "tests in another order differ at the first place they do": (
        {0: [A, B, C], 1: [A, C, B]}, {},
        f"rank 1 collected 3 tests, rank 0 3: first difference at index 1: rank 0 has {B}, "
        f"rank 1 {C}"),
    "a rank whose list is a prefix of rank 0's ends where the other goes on": (
        {0: [A, B], 1: [A]}, {},
        f"rank 1 collected 1 test, rank 0 2: first difference at index 1: rank 0 has {B}, "
        f"rank 1 no test there (its list ends)"),
    "ranks that collected alike are named together": (
        {0: [A, B], 1: [A, D], 2: [A, B], 3: [A, D]}, {},
        f"ranks 1, 3 collected 2 tests, ranks 0, 2 2: first difference at index 1: ranks 0, 2 "
        f"have {B}, ranks 1, 3 {D}"),
    "each other kind of collection is compared with rank 0's": (
        {0: [A, B], 1: [A, D], 2: [C]}, {},
        f"rank 1 collected 2 tests, rank 0 2: first difference at index 1: rank 0 has {B}, "
        f"rank 1 {D}; rank 2 collected 1 test, rank 0 2: first difference at index 0: rank 0 "
        f"has {A}, rank 2 {C}"),
    "the same tests with other collection errors name the errors": (
        {0: [A], 1: [A]}, {1: 2},
        "rank 1 had 2 errors during collection, rank 0 no errors"),
    "a rank whose error cost it tests is named with both (the error is the cause)": (
        {0: [A, B], 1: [A]}, {1: 1},
        f"rank 1 collected 1 test, rank 0 2: first difference at index 1: rank 0 has {B}, "
        f"rank 1 no test there (its list ends); rank 1 had 1 error during collection, rank 0 "
        f"no errors"),
}


@pytest.mark.parametrize(("tests", "errors", "words"), DIFFERENCE_CASES.values(),
                         ids=DIFFERENCE_CASES.keys())
def test_difference(tests: dict[int, list[str]], errors: dict[int, int], words: str) -> None:
    assert difference(tests, errors) == f"{words}; {FIX}"
