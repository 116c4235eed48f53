"""An agent waiting for its rendezvous endpoint says why it cannot reach it, once per reason, and
ends at join_timeout (real sockets: a port nothing listens on, a name that does not resolve)."""

import socket

import pytest

from rankguard.deadline import Deadline
from rankguard.errors import UsageError
from rankguard.launcher import rendezvous
from rankguard.launcher.config import RendezvousConfig
from tests.runtime.ranks import free_port


@pytest.mark.parametrize("host, reason", [
    ("127.0.0.1", "connection refused, nothing listens there yet"),
    ("nosuchhost.invalid", "the name does not resolve"),
])
def test_an_endpoint_out_of_reach_is_told_once_with_its_reason_then_fails_at_the_deadline(
        monkeypatch, capsys, host, reason):
    monkeypatch.setattr(rendezvous, "_TELL_AFTER_S", 0.2)
    cfg = RendezvousConfig(2, 2, host, free_port(), join_timeout=1)
    with pytest.raises(UsageError) as raised:
        rendezvous._await_listener(cfg, Deadline.after(1.0))  # about 20 attempts
    assert f"nothing answered at {cfg.endpoint} within join_timeout 1 s (last: {reason}" \
        in str(raised.value)
    told = capsys.readouterr().err.splitlines()
    assert len(told) == 1, told
    assert told[0].startswith(f"rankguard: waiting for {cfg.endpoint} (--rdzv-endpoint) to "
                              f"accept connections: {reason}"), told
    assert told[0].endswith("retrying until join_timeout 1 s"), told


def test_an_endpoint_that_answers_before_the_telling_time_is_not_told(monkeypatch, capsys):
    with socket.create_server(("127.0.0.1", 0)) as server:
        cfg = RendezvousConfig(2, 2, "127.0.0.1", server.getsockname()[1], join_timeout=5)
        rendezvous._await_listener(cfg, Deadline.after(5.0))
    assert capsys.readouterr().err == ""


def _server(reply_first: bool):
    """A listener that sends an HTTP answer to every connection: at once (as an SSH server sends
    its banner), or after reading what the client sent (as an HTTP server answers junk)."""
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2.0)
                try:
                    if not reply_first:
                        conn.recv(16)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, stop, thread


def test_a_server_that_speaks_first_is_refused_at_once_as_not_a_store():
    server, stop, thread = _server(reply_first=True)
    try:
        cfg = RendezvousConfig(2, 2, "127.0.0.1", server.getsockname()[1], join_timeout=30)
        with pytest.raises(UsageError) as raised:
            rendezvous._refuse_a_server_that_speaks_first(cfg)
        assert f"what listens at {cfg.endpoint} is not a torch store: it spoke first " \
            "(b'HTTP/1.1 400" in str(raised.value)
    finally:
        stop.set()
        thread.join(5)
        server.close()


def test_a_silent_server_as_a_store_is_passed_on_to_torchs_client():
    with socket.create_server(("127.0.0.1", 0)) as server:
        cfg = RendezvousConfig(2, 2, "127.0.0.1", server.getsockname()[1], join_timeout=30)
        rendezvous._refuse_a_server_that_speaks_first(cfg)  # no error: nothing said
