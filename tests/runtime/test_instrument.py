"""The handshake between our ``init_process_group`` and the group creator torch calls inside it
(``instrument._Forming``): only the thread forming the default group sees it, and only while it
does, however its block ends."""

from __future__ import annotations

import threading

import pytest

from rankguard.runtime.instrument import _Forming


def seen_from_another_thread(forming: _Forming) -> object:
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(forming.on_this_thread()))
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    return seen[0]


def test_the_thread_forming_the_default_group_sees_it_and_no_other_thread_does():
    forming = _Forming()
    assert forming.on_this_thread() is None
    with forming.default_group() as mine:
        assert forming.on_this_thread() is mine
        assert not mine.entered
        assert seen_from_another_thread(forming) is None  # its new_group forms a sub-group
    assert forming.on_this_thread() is None


def test_the_default_group_is_no_longer_being_formed_once_init_raised():
    forming = _Forming()
    with pytest.raises(RuntimeError):
        with forming.default_group():
            raise RuntimeError("torch's init_process_group failed")
    assert forming.on_this_thread() is None
