"""``launcher.signal_order``: real signals that arrive while the main thread is inside C have
their handlers run in the order of their numbers; the wakeup fd says which came first, also
when the launcher's event loop read the first one's byte before the handlers ran."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time

import pytest

from rankguard.launcher.signal_order import Arrivals


@pytest.mark.parametrize("loop_read_between", [False, True], ids=["pipe", "loop_read_first"])
def test_the_first_signal_to_arrive_is_named_though_its_handler_runs_second(
        loop_read_between: bool) -> None:
    r, w = os.pipe()
    for end in (r, w):
        os.set_blocking(end, False)
    handled = (signal.SIGUSR1, signal.SIGUSR2)
    arrivals = Arrivals(r, handled)
    runs: list[tuple[int, int]] = []  # (the handler's signal, the first to arrive)

    def handler(signum: int, _frame: object) -> None:
        runs.append((signum, arrivals.first(signum) if not runs else 0))

    before = [signal.signal(sig, handler) for sig in handled]
    old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    try:
        def send() -> None:  # USR2 first, then USR1, while the main thread is inside C
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.05)
            if loop_read_between:  # the event loop woke on SIGUSR2's byte and consumed it
                arrivals.read()
            os.kill(os.getpid(), signal.SIGUSR1)
            sent.append(time.monotonic())

        sent: list[float] = []
        sender = threading.Thread(target=send)
        sender.start()
        # one call in C (it lets the sender run) that outlasts both sends: no handler runs in it
        hashlib.pbkdf2_hmac("sha256", b"x", b"y", 1_000_000)
        returned = time.monotonic()
        sender.join(10)
        deadline = time.monotonic() + 5
        while len(runs) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        signal.set_wakeup_fd(old_fd)
        for sig, previous in zip(handled, before):
            signal.signal(sig, previous)
        os.close(r)
        os.close(w)
    assert sent and sent[0] < returned, (sent, returned)  # both signals came inside the call
    # Python ran SIGUSR1's handler first (the lower number); SIGUSR2 came first
    assert runs == [(signal.SIGUSR1, signal.SIGUSR2), (signal.SIGUSR2, 0)], runs


def test_with_nothing_in_the_pipe_the_handlers_own_signal_is_the_first() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    try:
        arrivals = Arrivals(r, (signal.SIGTERM,))
        assert arrivals.first(signal.SIGINT) == signal.SIGINT
        os.write(w, b"\0")  # a wake of the loop's, no signal
        arrivals.read()
        assert arrivals.first(signal.SIGINT) == signal.SIGINT
    finally:
        os.close(r)
        os.close(w)
