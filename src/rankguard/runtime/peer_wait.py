"""The wait of a point-to-point operation (``send``, ``recv``) on gloo, made interruptible.

gloo's send and recv works have no future and complete only inside their own ``wait``, and a
``wait(timeout)`` that times out closes the connection to the peer ("Application timeout caused
pair closure"): waiting in short slices, as ``runtime.bounded`` does for collectives, would
break every transfer that takes longer than one slice (a large state sent to a replacement).

So one thread waits for the whole deadline, once, and the caller waits on it in slices, free to
give up when the group retires (a peer's or the supervisor's notice). A thread given up on ends
when gloo's wait does: at the deadline, the group's timeout, or when the peer's connection
closes.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

PEER_TO_PEER = frozenset({"send", "recv", "recv_anysource"})


class PeerWait:
    """``inner.wait`` running on its own thread, started at once.

    Args:
        inner: gloo's work.
        seconds: the longest the wait may take; None: gloo's own (the group's timeout).
    """

    def __init__(self, inner: Any, seconds: float | None) -> None:
        self._done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        timeout = None if seconds is None else timedelta(seconds=seconds)
        threading.Thread(target=self._wait, args=(inner, timeout), daemon=True,
                         name="rankguard-peer-wait").start()

    def _wait(self, inner: Any, timeout: timedelta | None) -> None:
        try:
            self.result = inner.wait() if timeout is None else inner.wait(timeout)
        except BaseException as error:  # noqa: BLE001 (passed to the caller's thread)
            self.error = error
        finally:
            self._done.set()

    def over(self, seconds: float) -> bool:
        """Wait up to ``seconds``; whether gloo's wait has ended (then ``result`` or
        ``error`` holds how)."""
        return self._done.wait(seconds)
