"""The bound on a generation's backend connect (``runtime.backend_connect``), on its own: a
connect that ends in time hands back its result or its error; one that does not is abandoned at
the deadline (plus gloo's error allowance), whatever it is blocked in. The real gloo case (a
member that published its address and died) is ``test_runtime_faults``'s."""

from __future__ import annotations

import threading
import time

import pytest

from rankguard.deadline import Deadline
from rankguard.runtime import backend_connect


def test_a_connect_that_ends_in_time_returns_its_result() -> None:
    assert backend_connect.within(Deadline.after(5), "a connect", "gloo", lambda: 42) == 42


def test_a_connect_that_fails_in_time_raises_its_own_error() -> None:
    def refused() -> None:
        raise RuntimeError("Connection refused")

    with pytest.raises(RuntimeError, match="Connection refused"):
        backend_connect.within(Deadline.after(5), "a connect", "gloo", refused)


def test_a_connect_still_blocked_at_the_deadline_is_abandoned_then() -> None:
    release = threading.Event()  # stands for gloo's wait, which nothing in Python can end
    started = time.monotonic()
    try:
        with pytest.raises(backend_connect.ConnectOverran, match="never dialed in"):
            backend_connect.within(Deadline.after(0.2), "a connect", "rankguard_gloo",
                                   lambda: release.wait(30))
        took = time.monotonic() - started
    finally:
        release.set()  # the abandoned thread ends too
    assert 0.2 + backend_connect.OWN_ERROR_S <= took < 0.2 + backend_connect.OWN_ERROR_S + 1.0


@pytest.mark.parametrize("backend, connects", [("gloo", True), ("rankguard_gloo", True),
                                               ("cpu:gloo,cuda:nccl", True), ("nccl", False),
                                               ("NCCL", False)])
def test_only_a_backend_that_connects_at_init_is_bounded_on_a_thread(backend: str,
                                                                      connects: bool) -> None:
    assert backend_connect.connects_at_init(backend) is connects
    # one that does not connect at init runs on the caller's thread (NCCL: its device)
    thread = backend_connect.within(Deadline.after(5), "a connect", backend,
                                    threading.current_thread)
    assert (thread is threading.current_thread()) is not connects
