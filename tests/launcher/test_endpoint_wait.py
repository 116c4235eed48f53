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
