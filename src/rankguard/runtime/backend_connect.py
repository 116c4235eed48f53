"""The connect of a new generation's backend, bounded by its deadline whatever the backend does.

``regroup()`` and a replacement's ``init_process_group`` give the backend what is left of their
deadline as its timeout (``generations.connect_bound``), but gloo does not keep to it. In its
full-mesh connect, of each pair of ranks the one with the lower port waits for the other to
dial in, and that wait has no timer of its own: it ends at the pair's, **five times** the
group's timeout. A member that published its address and died before it dialed held such a
peer 25 s under a 5 s bound (1 regroup in 6, a rank killed 10 ms into it). The wait is in C++:
nothing in Python can cut it short.

So :func:`within` runs the whole ``init_process_group`` on a helper thread and waits for it
until the deadline (plus ``OWN_ERROR_S``, so that gloo's own errors, which name what failed,
still arrive). A connect not done by then is **abandoned**: :class:`ConnectOverran` is raised
(the caller makes it ``PeerFailed``: the rank has no default group), and the thread is left to
gloo, which fails it within four more timeouts (a daemon: it never holds the process's exit).
Should that connect succeed after all (every member was alive, one only slow), the group it
made is given up at once (``groups.abandon_world``: retired, its peers told), never used: the
rank already raised that it has none; a rank that exits meanwhile waits for that notice
(``exit_waits``). NCCL's ``init_process_group`` connects nothing (its
communicator forms at the first collective): it runs on the caller's thread, as it did.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Generic, TypeVar

from .. import exit_waits
from ..deadline import Deadline
from . import groups

OWN_ERROR_S = 0.5
"""How long past its deadline a connect is still waited for: gloo's own waits (a peer's address
in the store, a refused dial's retries) end at the timeout it was given, counted from a few ms
later than the deadline, and a loaded machine adds some; their errors say what failed."""

LATE_NOTICE_S = 1.0
"""How long the process's exit waits for a connect that ended late to give its group up and
tell its peers (a notice bounded by 0.15 s): many times that, for a loaded machine."""

T = TypeVar("T")

_abandoned: list[threading.Thread] = []  # connects given up on, maybe still inside gloo


class ConnectOverran(RuntimeError):
    """The backend had not connected the group's members by the deadline (a member died or
    froze after it published its address). A RuntimeError, as torch's connect errors are."""


class _Attempt(Generic[T]):
    """One connect on its helper thread: its outcome, once it has one, and whether the caller
    gave up on it; both under one lock, so that exactly one side acts on a late success."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ended = False
        self.abandoned = False
        self.value: T | None = None
        self.error: BaseException | None = None


def connects_at_init(backend: str) -> bool:
    """Whether ``init_process_group`` with ``backend`` (torch's name, or ours) connects the
    members: gloo's full mesh does, in it. NCCL's communicator forms at the first collective,
    on the caller's thread and device, under that collective's own deadline: not bounded here."""
    return "gloo" in backend.lower()


def within(limit: Deadline, what: str, backend: str, connect: Callable[[], T]) -> T:
    """``connect()``'s result, or the exception it raised, if it ends by ``limit`` (plus
    ``OWN_ERROR_S``). A ``backend`` that does not connect at init is called as it is.

    Args:
        limit: when the members must have connected.
        what: the connect in words, for the errors ("generation 3's connect").
        backend: the new group's (see :func:`connects_at_init`).
        connect: torch's ``init_process_group`` (the whole of it: the group creator finds the
            default group it forms by thread, see ``instrument._Forming``).

    Raises:
        ConnectOverran: ``connect`` had not ended by then; it goes on on its own thread, and a
            group it makes later is given up.
    """
    if not connects_at_init(backend):
        return connect()
    attempt: _Attempt[T] = _Attempt()
    began = time.monotonic()

    def run() -> None:
        value: T | None = None
        error: BaseException | None = None
        try:
            value = connect()
        except BaseException as raised:  # noqa: BLE001 (handed to the caller as it is)
            error = raised
        with attempt.lock:
            attempt.ended, attempt.value, attempt.error = True, value, error
            late = attempt.abandoned
        if late and error is None:
            exit_waits.finish_before_exit(threading.current_thread(),
                                          Deadline.after(LATE_NOTICE_S))
            groups.abandon_world(f"{what} connected {time.monotonic() - began:.3g} s after it "
                                 "began, past its deadline: this rank had given up on it")

    thread = threading.Thread(target=run, name="rankguard-connect", daemon=True)
    thread.start()
    thread.join(limit.later(OWN_ERROR_S).wait_time())
    with attempt.lock:
        if not attempt.ended:
            attempt.abandoned = True
            _abandoned.append(thread)
            raise ConnectOverran("gloo was still connecting: a member that published its "
                                 "address never dialed in (it died or froze)")
    if attempt.error is not None:
        raise attempt.error
    return attempt.value  # type: ignore[return-value]


def still_connecting() -> bool:
    """Whether a connect this process abandoned still runs in gloo: should it succeed, torch
    would install its group as the default one, over any made meanwhile."""
    _abandoned[:] = [thread for thread in _abandoned if thread.is_alive()]
    return bool(_abandoned)
