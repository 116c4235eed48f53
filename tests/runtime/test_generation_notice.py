"""``generations.names_a_member``: a launcher's notice naming a member of the generation being
formed ends the members' wait for it; the notice of the fault that began the regroup does not."""

from __future__ import annotations

import pytest

from rankguard.runtime.generations import names_a_member

MEMBERS = [0, None, 2]  # rank 1's place vacant: its replacement is awaited


@pytest.mark.parametrize("notice, rank, want", [
    (("died", 2), 0, True),    # rank 2 stopped by the launcher after the members were agreed
    (("hung", 2), 0, True),
    (("died", 1), 0, False),   # the fault that began the regroup: its place is vacant
    (("died", 0), 0, False),   # about this rank itself
    (None, 0, False),
])
def test_a_notice_naming_a_member_ends_the_wait(notice: tuple[str, int] | None, rank: int,
                                                want: bool) -> None:
    assert names_a_member(notice, MEMBERS, rank) is want
