"""Messages between the pool's leader and one rank: pickled objects, length-prefixed, over a
Unix socket pair.

The leader's end never blocks without a deadline: ``send`` gives up when its deadline passes
(a rank that stopped reading cannot wedge the leader), and reading is driven by a selector, a
frame being assembled from whatever bytes have arrived. The rank's end simply blocks: a rank
may wait for its next request forever.
"""

from __future__ import annotations

import pickle
import socket
import struct
import time
from typing import Any, Callable

_HEADER = struct.Struct("!Q")


def dumps(message: Any) -> bytes:
    """``message`` pickled for a channel; raises what pickle raises."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


class ChannelClosed(Exception):
    """The other end closed the channel (its process exited or was killed)."""


class LeaderEnd:
    """The leader's end of a channel to one rank."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self._buffer = bytearray()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Any, deadline: float) -> None:
        """Send ``message``; raises TimeoutError at ``deadline``, ChannelClosed if the rank is
        gone."""
        self.send_pickled(dumps(message), deadline)

    def send_pickled(self, data: bytes, deadline: float) -> None:
        """Send a message pickled by :func:`dumps` (to pickle once for every rank)."""
        frame = memoryview(_HEADER.pack(len(data)) + data)
        self.sock.setblocking(True)
        try:
            while frame:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("the rank did not take the request before the deadline")
                self.sock.settimeout(remaining)
                try:
                    frame = frame[self.sock.send(frame):]
                except socket.timeout:
                    continue
                except OSError as error:
                    raise ChannelClosed(str(error)) from None
        finally:
            self.sock.setblocking(False)

    def receive(self) -> list[Any]:
        """The messages completed by the bytes available now (call when the socket is
        readable); raises ChannelClosed at end of stream."""
        try:
            chunk = self.sock.recv(1 << 20)
        except BlockingIOError:
            return []
        except OSError as error:
            raise ChannelClosed(str(error)) from None
        if not chunk:
            raise ChannelClosed("end of stream")
        self._buffer += chunk
        messages = []
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if len(self._buffer) < _HEADER.size + size:
                break
            messages.append(pickle.loads(self._buffer[_HEADER.size:_HEADER.size + size]))
            del self._buffer[:_HEADER.size + size]
        return messages

    def close(self) -> None:
        self.sock.close()


class RankEnd:
    """The rank's end: blocking reads and writes."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.sock.setblocking(True)

    def send(self, message: Any) -> None:
        data = dumps(message)
        self.sock.sendall(_HEADER.pack(len(data)) + data)

    def receive(self, loads: Callable[[bytes], Any] = pickle.loads) -> Any:
        """The next message, unpickled by ``loads``; raises ChannelClosed when the leader is
        gone (and what ``loads`` raises: the frame is consumed either way)."""
        (size,) = _HEADER.unpack(self._exactly(_HEADER.size))
        return loads(self._exactly(size))

    def _exactly(self, size: int) -> bytes:
        parts, left = [], size
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ChannelClosed("the leader closed the channel")
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)


def pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair: (the leader's socket, the rank's socket, inheritable)."""
    leader, rank = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    rank.set_inheritable(True)
    return leader, rank
