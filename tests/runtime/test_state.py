"""The runtime's record of its groups (``runtime.state.GroupRegistry``): found by the group
object, gone with the group, hidden from the current groups (not from stale references) once
discarded, and nothing written on the group itself."""

from __future__ import annotations

import gc

from rankguard.runtime.state import GroupRecord, GroupRegistry, current


class Group:
    """Stands for a torch process group: any object that can be weakly referenced."""


def record(name: str, is_world: bool = False) -> GroupRecord:
    return GroupRecord(name=name, ranks=[0, 1], rank=0, is_world=is_world)


def test_a_record_is_found_by_its_group_and_nothing_is_set_on_the_group() -> None:
    registry, world, sub = GroupRegistry(), Group(), Group()
    registry.add(world, record("world", is_world=True))
    registry.add(sub, record("1"))
    assert registry.of(world).name == "world" and registry.of(sub).name == "1"
    assert registry.of(Group()) is None
    assert vars(world) == {} and vars(sub) == {}
    assert registry.world() is registry.of(world)
    assert [r.name for r in registry.live()] == ["1", "world"]  # newest first


def test_a_group_that_dies_takes_its_record_with_it() -> None:
    registry, group = GroupRegistry(), Group()
    registry.add(group, record("1"))
    del group
    gc.collect()
    assert registry.live() == [] and registry.by_name("1") is None


def test_discarded_groups_leave_the_current_ones_but_keep_their_record() -> None:
    registry, old = GroupRegistry(), Group()
    registry.add(old, record("world", is_world=True))
    registry.of(old).retired = "replaced by generation 1"
    registry.discard_all()
    new = Group()
    registry.add(new, record("world", is_world=True))
    assert registry.world() is registry.of(new)
    assert registry.by_name("world") is registry.of(new)
    assert registry.of(old).retired == "replaced by generation 1"  # a stale reference learns it
    assert registry.live() == [registry.of(new)]


def test_the_rank_has_one_state() -> None:
    assert current() is current()
    assert current().groups is current().groups
