"""Messages between the pool's leader and one rank: pickled objects, length-prefixed, over a
Unix socket pair.

The leader's end never blocks without a deadline: its socket stays non-blocking, ``send``
waits for room until its deadline passes (a rank that stopped reading cannot wedge the leader),
and reading is driven by a selector, a frame being assembled from whatever bytes have arrived;
one thread may send while another reads. The rank's end simply blocks: a rank may wait for its
next request forever.
"""

from __future__ import annotations

import dataclasses
import math
import pickle
import select
import socket
import struct
from typing import Any, Callable

from ..deadline import Deadline

_HEADER = struct.Struct("!Q")
SEND_BUFFER = 1 << 22  # bytes (net.core.wmem_max caps it: 4 MiB here, 208 KiB by default)
READ_PER_CALL = 1 << 23  # one receive's share: a large answer does not hold up the others'


def dumps(message: Any) -> bytes:
    """``message`` pickled for a channel; raises what pickle raises."""
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


class ChannelClosed(Exception):
    """The other end closed the channel (its process exited or was killed)."""


@dataclasses.dataclass(frozen=True)
class Unreadable:
    """What :meth:`LeaderEnd.receive` returns in place of a message that arrived whole but
    could not be unpickled here (a rank's result whose class the leader cannot import, or whose
    ``__reduce__`` names a call that raises): ``error`` is what unpickling raised. The frame is
    consumed, and the messages after it are read as usual."""

    error: Exception


class LeaderEnd:
    """The leader's end of a channel to one rank."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self._head = bytearray()  # the next message's length prefix, as far as received
        self._body: bytearray | None = None  # its body, made whole once the prefix is in
        self._filled = 0  # bytes of the body received

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: Any, until: Deadline) -> None:
        """Send ``message``; raises TimeoutError at ``until``, ChannelClosed if the rank is
        gone."""
        self.send_pickled(dumps(message), until)

    def send_pickled(self, data: bytes, until: Deadline) -> None:
        """Send a message pickled by :func:`dumps` (to pickle once for every rank)."""
        frame = memoryview(_HEADER.pack(len(data)) + data)
        room: Any = None  # a poll object, made only when the socket's buffer is full
        while frame:
            try:
                frame = frame[self.sock.send(frame):]
                continue
            except BlockingIOError:
                pass
            except OSError as error:
                raise ChannelClosed(str(error)) from None
            if until.passed():
                raise TimeoutError("the rank did not take the request before the deadline")
            if room is None:
                room = select.poll()
                room.register(self.sock.fileno(), select.POLLOUT)
            room.poll(max(1, math.ceil(until.wait_time() * 1000)))

    def receive(self) -> list[Any]:
        """The messages completed by the bytes available now (call when the socket is
        readable; it reads until none is waiting, or ``READ_PER_CALL`` bytes), an
        :class:`Unreadable` in place of each that cannot be unpickled; raises ChannelClosed at
        end of stream (once the messages completed before it were returned). A body is read
        straight into a buffer of its size: no copy per chunk, whatever its size."""
        messages: list[Any] = []
        read = 0
        try:
            while read < READ_PER_CALL:
                if self._body is None:
                    got = self.sock.recv(_HEADER.size - len(self._head))
                    if not got:
                        break
                    self._head += got
                    if len(self._head) < _HEADER.size:
                        continue
                    (size,) = _HEADER.unpack(self._head)
                    self._body, self._filled = bytearray(size), 0
                elif self._filled < len(self._body):
                    got_n = self.sock.recv_into(memoryview(self._body)[self._filled:])
                    if not got_n:
                        break
                    self._filled += got_n
                    read += got_n
                if self._filled == len(self._body):
                    messages.append(_loads(self._body))
                    self._head.clear()
                    self._body = None
            else:
                return messages
        except BlockingIOError:
            return messages
        except OSError as error:
            if messages:
                return messages  # the next call raises
            raise ChannelClosed(str(error)) from None
        if messages:
            return messages
        raise ChannelClosed("end of stream")

    def arriving(self) -> tuple[int, int] | None:
        """A message partly received: (its body's bytes received so far, its size); None when
        none is. A snapshot, safe from any thread."""
        body = self._body
        return None if body is None else (self._filled, len(body))

    def drain(self) -> list[Any]:
        """Every message already sent, read until nothing more is waiting (the rank's last words
        before it ended); none is lost at the end of the stream."""
        messages: list[Any] = []
        try:
            while got := self.receive():
                messages.extend(got)
        except ChannelClosed:
            pass
        return messages

    def close(self) -> None:
        self.sock.close()


def _loads(frame: bytearray) -> Any:
    try:
        return pickle.loads(frame)
    except Exception as error:  # noqa: BLE001 (whatever the sender's objects raise as they load)
        return Unreadable(error)


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
    for end in (leader, rank):  # what a write may queue: a large answer in fewer wake-ups
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)  # the kernel caps it
    rank.set_inheritable(True)
    return leader, rank
