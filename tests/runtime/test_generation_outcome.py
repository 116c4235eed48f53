"""``generation_keys.others_missing``: a member (or a replacement) whose generation failed names
the places that did not arrive, never its own, and says when the others gave up on it."""

from __future__ import annotations

import pytest

from rankguard.runtime.generation_keys import others_missing


@pytest.mark.parametrize("missing, own, want", [
    ([2], 0, ([2], False)),         # a peer did not arrive
    ([0, 2], 0, ([2], True)),       # this member too, by the decision: it came after it
    ([1], 1, ([], True)),           # a replacement the members gave up on before it arrived
    ([], 0, ([], False)),
    ([1, 3], 2, ([1, 3], False)),
])
def test_the_error_names_the_others_and_whether_this_one_came_late(
        missing: list[int], own: int, want: tuple[list[int], bool]) -> None:
    assert others_missing(missing, own) == want
