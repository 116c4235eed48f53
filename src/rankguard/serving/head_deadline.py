"""A deadline on each request's head (its request line and headers) for ``rankguard serve``.

uvicorn bounds a body by nothing (``serving.http`` answers 408 past the service's timeout) and
a request's head by nothing either: a client that connects and sends nothing, or sends its
headers a byte a second (slowloris), held its connection, a file descriptor of the server's, as
long as it liked; enough of them starve the server (no descriptor left for the pool's ranks).
:func:`protocol` is uvicorn's h11 protocol with a timer armed when a connection opens and
after each response: if no new request's head has been read when it fires, the connection is
closed. A request being served is never cut by it (its head was read).
"""

from __future__ import annotations

import asyncio
from typing import Any


def protocol(h11_protocol: type, seconds: float) -> type:
    """A subclass of uvicorn's ``H11Protocol`` (``h11_protocol``) that closes a connection
    on which no request's head is complete ``seconds`` after it opened or after its last
    response."""

    class HeadDeadline(h11_protocol):  # type: ignore[misc,valid-type]
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm(self.cycle)

        def on_response_complete(self) -> None:
            served = self.cycle  # before a pipelined request's head starts a new cycle
            super().on_response_complete()
            self._arm(served)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _arm(self, cycle: Any) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(seconds, self._head_due, cycle)

        def _head_due(self, cycle: Any) -> None:
            self._head_timer = None
            if self.cycle is cycle and not self.transport.is_closing():
                self.transport.close()  # no new request's head since it was armed

    return HeadDeadline
