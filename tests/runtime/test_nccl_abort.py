"""The bound on aborting communicators: the caller waits at most its limit, whatever the
abort does. (NCCL's own abort runs in the GPU set: tests/gpu/test_nccl_bounded.py and
test_nccl_teardown.py; here backends whose abort blocks, raises or returns stand in for it.)"""

from __future__ import annotations

import threading
import time

from rankguard.runtime import nccl_abort


class Backend:
    def __init__(self, blocks: threading.Event | None = None, raises: bool = False) -> None:
        self.blocks, self.raises, self.aborted = blocks, raises, False

    def abort(self) -> None:
        if self.blocks is not None:
            self.blocks.wait(30)
        if self.raises:
            raise RuntimeError("ncclCommAbort failed")
        self.aborted = True


def test_an_abort_that_returns_is_waited_for():
    backends = [Backend(), Backend()]
    result = nccl_abort.abort([(None, b) for b in backends], 5.0)
    assert (result.groups, result.finished, result.error) == (2, True, "")
    assert all(b.aborted for b in backends)


def test_an_abort_that_hangs_is_cut_at_the_limit():
    held = threading.Event()
    try:
        started = time.monotonic()
        result = nccl_abort.abort([(None, Backend(blocks=held))], 0.3)
        took = time.monotonic() - started
        assert not result.finished and 0.3 <= took < 2.0, (result, took)
    finally:
        held.set()


def test_an_abort_that_fails_is_reported_and_the_others_are_still_aborted():
    other = Backend()
    result = nccl_abort.abort([(None, Backend(raises=True)), (None, other)], 5.0)
    assert result.finished and result.error == "RuntimeError: ncclCommAbort failed"
    assert other.aborted


def test_nothing_to_abort_without_nccl():
    assert nccl_abort.nccl_groups() == []  # this process has no NCCL group (CPU torch)
    assert nccl_abort.abort([], 1.0) == nccl_abort.Aborted(0, True, 0.0)


class Wrapper(Backend):
    """A Python object of an NCCL backend: torch makes a new one at each ``_get_backend()``,
    all with the backend's ``uid``."""

    def __init__(self, uid: int) -> None:
        super().__init__()
        self.uid = uid


def test_an_abort_is_known_by_every_python_object_of_its_backend_and_by_no_other_backend():
    first = Wrapper(uid=9001)
    nccl_abort.abort([(None, first)], 5.0, reason="the supervisor reported that rank 1 died")
    again = Wrapper(uid=9001)  # the same backend, got again: another Python object
    assert nccl_abort.why_aborted(again) == "the supervisor reported that rank 1 died"
    assert nccl_abort.not_aborted([(None, again)]) == []
    del first
    other = Wrapper(uid=9002)  # a new group's backend, wherever its object lives
    assert nccl_abort.why_aborted(other) is None
    assert nccl_abort.not_aborted([(None, other)]) == [(None, other)]


def test_a_backend_without_uid_is_known_by_its_object_which_is_kept_alive():
    backend = Backend()
    nccl_abort.abort([(None, backend)], 5.0, reason="a deadline")
    assert nccl_abort.why_aborted(backend) == "a deadline"
    assert nccl_abort.backend_key(backend) == ("id", id(backend))
    assert backend in nccl_abort._pinned  # its id is never another's
