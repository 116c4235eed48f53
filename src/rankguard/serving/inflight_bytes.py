"""The bytes of request bodies ``rankguard serve`` holds at once, bounded.

Each request's body is bounded (``--max-body``), and so is the number of connections
(``--max-connections``), but not their product: a few hundred clients each sending a body of
the largest size, slowly, made the server hold hundreds of megabytes (gigabytes, with a
larger open-file limit) before any request ran. A request takes its body's bytes from one
:class:`InflightBytes` as they arrive and gives them back when it is answered: the raw body,
and its copy sent to the ranks, live that long (the ranks parse it: ``serving.request_body``). A request whose bytes do not fit is refused at once
(``serving.http``: 503), and so is one whose declared ``Content-Length`` does not fit in what
is left (:meth:`InflightBytes.fits`), before any of it is read. A declared length is not taken
ahead of its bytes: taken at once, 64 requests that sent their head and nothing more (5 KB in
all) held the default 64 MiB and locked every other client out for the service's timeout,
again and again; now a client must send the bytes it holds.

All of it runs on the server's event loop thread: no lock.
"""

from __future__ import annotations

# the default bound, in bodies of the largest size (64 MiB with the default --max-body): a few
# hundred slow uploads no longer hold gigabytes
INFLIGHT_BODIES = 64


class InflightBytes:
    """At most ``limit`` bytes taken at once.

    Raises:
        ValueError: ``limit`` is not a positive number of bytes.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the limit on bytes in flight must be positive, got {limit}")
        self.limit = limit
        self.held = 0

    def fits(self, count: int) -> bool:
        """Whether ``count`` more bytes would fit now (nothing is taken)."""
        return self.held + count <= self.limit

    def take(self, count: int) -> bool:
        """Take ``count`` more bytes; False, taking none, when they would pass the limit."""
        if not self.fits(count):
            return False
        self.held += count
        return True

    def give_back(self, count: int) -> None:
        self.held -= count


class BodyBytes:
    """What one request's body has taken from ``shared``; :meth:`close` gives it all back
    (once)."""

    def __init__(self, shared: InflightBytes) -> None:
        self._shared = shared
        self.taken = 0

    def cover(self, size: int) -> bool:
        """Make what this body took cover ``size`` bytes; False when the rest does not fit."""
        more = size - self.taken
        if more <= 0:
            return True
        if not self._shared.take(more):
            return False
        self.taken = size
        return True

    def close(self) -> None:
        self._shared.give_back(self.taken)
        self.taken = 0
