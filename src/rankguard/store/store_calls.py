"""Store calls bounded by the caller's deadline, whatever state the store's server is in.

A torch store client call blocks until its server answers. Against a server that died it fails
at once, but against one that is stopped (its host process got SIGSTOP, its machine froze) or
wedged, it blocks for the client's timeout (30 minutes by default), and some never end: a
timed-out ``wait`` is followed by a cancel whose answer is awaited without any timeout, and a
``clone()`` reconnects under the original client's timeout. Under ``mp.spawn`` or plain
``torchrun`` the store's server lives in rank 0, so a rank 0 that crashes or freezes would
otherwise take every other rank's ``shutdown()``, ``regroup()`` and failure explanation with it.

Every store call the runtime makes for a caller that holds a deadline goes through
:func:`within`: the call runs on a helper thread and is joined until the deadline. A call still
blocked then is **abandoned**: :class:`StoreStalled` is raised, the thread is left blocked on
the server (a daemon, never joined), and the client connection it used must not be used again
(its protocol state is unknown). At most ``MAX_ABANDONED`` threads are left so; past that, a
call is refused at once rather than leaving another. A call in flight when the interpreter
exits is waited for until its deadline (``exit_waits``): one that came back during the
interpreter's finalization would abort the process.
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

from .. import exit_waits
from ..deadline import Deadline

T = TypeVar("T")

MAX_ABANDONED = 8
STOP_IF_EVERY_S = 0.05  # how often a wait given ``stop_if`` asks it
_abandoned: list[threading.Thread] = []
_lock = threading.Lock()


class StoreStalled(RuntimeError):
    """A store call did not return by its deadline (its server is stopped, frozen or wedged),
    or too many earlier calls are still blocked on such a server.

    A RuntimeError, as torch's own store errors are, so that code written for a failing store
    handles a stalled one the same way.
    """


def within(limit: Deadline, what: str, call: Callable[[], T],
           stop_if: Callable[[], None] | None = None) -> T:
    """``call()``'s result, or the exception it raised, if it returns by ``limit``.

    Args:
        limit: when to stop waiting for it (``Deadline.never()`` waits as long as it takes).
        what: the call in words, for the error ("the shutdown barrier").
        call: the store calls to make; it must use a client that nothing else uses while it
            runs, and that nobody uses again if it stalls.
        stop_if: called every :data:`STOP_IF_EVERY_S` while the call runs; what it raises ends
            the wait at once (the call is abandoned, as at ``limit``) and reaches the caller
            (the launcher's signals before its agent took them over).

    Raises:
        StoreStalled: ``call`` had not returned by ``limit``, or ``MAX_ABANDONED`` earlier
            calls are still blocked.
    """
    with _lock:
        _abandoned[:] = [thread for thread in _abandoned if thread.is_alive()]
        if len(_abandoned) >= MAX_ABANDONED:
            raise StoreStalled(f"{what}: not tried, {len(_abandoned)} earlier store calls are "
                               "still blocked on a server that does not answer")
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 (handed to the caller as it is)
            outcome["error"] = error

    thread = threading.Thread(target=run, name="rankguard-store-call", daemon=True)
    thread.start()
    exit_waits.finish_before_exit(thread, limit)
    try:
        _join(thread, limit, stop_if)
    except BaseException:
        _abandon(thread)
        raise
    if thread.is_alive():
        _abandon(thread)
        raise StoreStalled(f"{what}: the store did not answer by the deadline (its server, "
                           "often rank 0's process, is stopped, frozen or overloaded)")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


def _join(thread: threading.Thread, limit: Deadline,
          stop_if: Callable[[], None] | None) -> None:
    if stop_if is None:
        thread.join(limit.wait_time_or_none())
        return
    while thread.is_alive() and not limit.passed():
        stop_if()
        thread.join(limit.wait_time(STOP_IF_EVERY_S))
    stop_if()


def _abandon(thread: threading.Thread) -> None:
    with _lock:
        _abandoned.append(thread)


def abandoned() -> int:
    """How many abandoned calls are still blocked (for tests and diagnostics)."""
    with _lock:
        return sum(thread.is_alive() for thread in _abandoned)
