"""A peer's notice retires groups here (``runtime.groups.on_notice``): the group it names, and,
when the peer gave up on every group it is in, each current group that peer is a member of."""

from __future__ import annotations

import pytest

from rankguard.runtime import groups
from rankguard.runtime.state import GroupRecord, GroupRegistry, current


class Group:
    """Stands for a torch process group: any object that can be weakly referenced."""


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> GroupRegistry:
    """This rank's groups as rank 0 of 3 sees them: the world, a pair with rank 1, a pair with
    rank 2 (the objects are kept by the registry's test)."""
    fresh = GroupRegistry()
    monkeypatch.setattr(current(), "groups", fresh)
    monkeypatch.setattr(groups, "on_notice_taken", [])
    return fresh


def add(registry: GroupRegistry, keep: list[Group], name: str, ranks: list[int]) -> GroupRecord:
    keep.append(Group())
    registry.add(keep[-1], GroupRecord(name=name, ranks=ranks, rank=0, is_world=name == "world"))
    return registry.by_name(name)


NOTICE_CASES = {
    "a rank that gave up on every group retires each group it is in, not the others": (
        {"by": 1, "reason": "rank 1 failed t.py::x", groups.EVERY_GROUP: True},
        {"world", "with1"}),
    "a notice about the world alone retires the world alone": (
        {"by": 1, "reason": "rank 1 reported that all_reduce #3 failed"}, {"world"}),
}


@pytest.mark.parametrize(("notice", "retired"), NOTICE_CASES.values(), ids=NOTICE_CASES.keys())
def test_on_notice(registry: GroupRegistry, notice: dict, retired: set[str]) -> None:
    keep: list[Group] = []
    records = [add(registry, keep, "world", [0, 1, 2]), add(registry, keep, "with1", [0, 1]),
               add(registry, keep, "with2", [0, 2])]
    groups.on_notice("world", notice)
    assert {r.name for r in records if r.retired is not None} == retired
    for record in records:  # a waiting collective raises PeerFailed with the peer's reason
        if record.retired is not None:
            assert record.retired == notice["reason"] and record.notice == notice
