"""A deadline on each request's head (its request line and headers) for ``rankguard serve``.

uvicorn bounds a body by nothing (``serving.http`` answers 408 past the service's timeout) and
a request's head by nothing either: a client that connects and sends nothing, or sends its
headers a byte a second (slowloris), held its connection, a file descriptor of the server's, as
long as it liked; enough of them starve the server (no descriptor left for the pool's ranks).
:func:`protocol` is uvicorn's h11 protocol with a timer armed when a connection opens and
after each response: if no new request's head has been read when it fires, the connection is
closed. A request being served is never cut by it (its head was read).

Within that deadline, a client that opens connections fast enough would still fill the
server's descriptors (each accept then failing with EMFILE, logged with a traceback thousands of
times a second, and no other client served): at most ``max_connections`` are open at once. One
more closes the oldest connection that waits for a request's head; when every connection has a
request, the new one is answered 503 at once and closed.
"""

from __future__ import annotations

import asyncio
import json
import resource
from typing import Any

_FULL_BODY = json.dumps({"error": {"type": "TooManyConnections", "detail": (
    "every connection the server keeps open (rankguard serve --max-connections) has a request "
    "in flight; retry later")}}).encode()
FULL = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nretry-after: 1\r\nconnection: close\r\n\r\n%s"
        % (len(_FULL_BODY), _FULL_BODY))


def default_max_connections() -> int:
    """A quarter of this process's descriptors (its soft RLIMIT_NOFILE): with the sockets
    accepted ahead of their connection's start (``accept_batch``), connections then hold at
    most half of them, and the pool keeps the rest."""
    return max(16, open_file_limit() // 4)


def most_connections() -> int:
    """The most connections that leave the pool half of this process's descriptors (its soft
    RLIMIT_NOFILE), counting the sockets accepted ahead of them (``accept_batch``, twice): with
    more, clients could take every descriptor (each accept then failing with EMFILE, logged
    thousands of times a second, and the pool's ranks no longer starting). The default
    (:func:`default_max_connections`) is within it."""
    budget = open_file_limit() // 2
    low, high = 0, budget  # the largest count within budget, by bisection
    while low < high:
        middle = (low + high + 1) // 2
        if middle + 2 * accept_batch(middle) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def open_file_limit() -> int:
    """This process's soft RLIMIT_NOFILE (65536 where it has none)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return soft if soft != resource.RLIM_INFINITY else 1 << 16


def accept_batch(max_connections: int) -> int:
    """How many sockets the event loop may accept at once (uvicorn's ``backlog``): asyncio
    accepts that many before any of their connections starts (and can be closed by the cap),
    and may do so twice meanwhile."""
    return min(2048, max(8, max_connections // 2))


class Turned:
    """What the cap on connections did, counted (``rankguard_http_connections_*`` metrics):
    ``refused``, connections answered 503 at once; ``dropped``, idle ones closed to make
    room."""

    def __init__(self) -> None:
        self.refused = 0
        self.dropped = 0


def protocol(h11_protocol: type, seconds: float, max_connections: int,
             turned: Turned | None = None) -> type:
    """A subclass of uvicorn's ``H11Protocol`` (``h11_protocol``) that closes a connection
    on which no request's head is complete ``seconds`` after it opened or after its last
    response, and keeps at most ``max_connections`` open (see the module), counting what the
    cap did in ``turned``."""
    waiting: dict[Any, Any] = {}  # connection -> the cycle it was armed with, oldest first
    counts = turned if turned is not None else Turned()

    class HeadDeadline(h11_protocol):  # type: ignore[misc,valid-type]
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.server_state.connections) > max_connections and not _drop_idle():
                counts.refused += 1
                transport.write(FULL)
                transport.close()
                return
            self._arm(self.cycle)

        def on_response_complete(self) -> None:
            served = self.cycle  # before a pipelined request's head starts a new cycle
            super().on_response_complete()
            self._arm(served)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            waiting.pop(self, None)
            super().connection_lost(exc)

        def _arm(self, cycle: Any) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(seconds, self._head_due, cycle)
            waiting.pop(self, None)
            waiting[self] = cycle  # the newest

        def _head_due(self, cycle: Any) -> None:
            self._head_timer = None
            if self.cycle is cycle and not self.transport.is_closing():
                self.transport.close()  # no new request's head since it was armed

    def _drop_idle() -> bool:
        """Close the oldest connection still waiting for a request's head; False if none."""
        for connection, cycle in list(waiting.items()):
            del waiting[connection]
            if connection.cycle is cycle and not connection.transport.is_closing():
                connection.transport.close()
                counts.dropped += 1
                return True
        return False

    return HeadDeadline
