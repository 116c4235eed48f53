"""The pool's channel between leader and rank, over a real socket pair: a message that arrives
whole but cannot be unpickled in the leader stands as :class:`Unreadable`, and the messages
after it are read as usual."""

from __future__ import annotations

import socket
import struct
from typing import Any

from rankguard.deadline import Deadline
from rankguard.serving import messages
from rankguard.serving.channel import LeaderEnd, RankEnd, Unreadable, dumps


class _LoadsAsAnError:
    def __reduce__(self) -> tuple[Any, ...]:
        return (int, ("not a number",))


def test_a_message_that_cannot_be_unpickled_is_unreadable_and_the_next_one_arrives() -> None:
    leader_sock, rank_sock = socket.socketpair()
    leader, rank = LeaderEnd(leader_sock), RankEnd(rank_sock.detach())
    try:
        rank.send({"result": _LoadsAsAnError()})
        rank.send({"op": "answer", "ok": True})
        got: list[Any] = []
        until = Deadline.after(10)
        while len(got) < 2 and not until.passed():
            got += leader.receive()
        assert isinstance(got[0], Unreadable) and isinstance(got[0].error, ValueError)
        assert got[1] == {"op": "answer", "ok": True}
    finally:
        leader.close()
        rank.sock.close()


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_a_failed_answer_never_raises_and_its_texts_are_bounded() -> None:
    answer = messages.failure(_Unprintable(), traceback="t" * (messages.TEXT_LIMIT + 5))
    assert answer["message"] == "<its str() raised RuntimeError>"
    assert answer["traceback"].endswith("... (5 more characters)")
    assert len(messages.failure(ValueError("m" * 10**6))["message"]) < messages.TEXT_LIMIT + 50


def test_a_message_partly_received_is_arriving_with_its_bytes_and_size() -> None:
    leader_sock, rank_sock = socket.socketpair()
    leader = LeaderEnd(leader_sock)
    try:
        assert leader.arriving() is None
        frame = dumps(b"x" * 100_000)
        rank_sock.sendall(struct.pack("!Q", len(frame)) + frame[:1000])
        until = Deadline.after(10)
        while leader.arriving() is None and not until.passed():
            assert leader.receive() == []
        assert leader.arriving() == (1000, len(frame))
        rank_sock.sendall(frame[1000:])
        got: list[Any] = []
        while not got and not until.passed():
            got += leader.receive()
        assert got == [b"x" * 100_000] and leader.arriving() is None
    finally:
        leader.close()
        rank_sock.close()
