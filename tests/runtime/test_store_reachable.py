"""A rank whose init_process_group names a store nobody hosts ends within the hang timeout,
explained, instead of waiting for torch's 30-minute store timeout."""

import contextlib
import socket
import time
from typing import Iterator

import pytest

from rankguard.errors import UsageError
from tests.conftest import script
from tests.leftover_threads import ends_its_threads

INIT = script("init_method.py")


@contextlib.contextmanager
def _dead_port() -> Iterator[int]:
    """A port bound but not listening: connecting to it is refused, and nobody can take it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@contextlib.contextmanager
def _deaf_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) but never answers: not a store."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


PORTS = {"dead": _dead_port, "deaf": _deaf_port}


@pytest.mark.parametrize("mode, port_kind, fragments", [
    ("tcp", "dead", ["could not reach the store at tcp://127.0.0.1:{port} given as init_method: "
                     "connection refused", "leave init_method unset (env://) or point it at "
                     "MASTER_ADDR:MASTER_PORT"]),
    pytest.param("tcp", "deaf", ["could not reach the store at tcp://127.0.0.1:{port} given as "
                                 "init_method: something listens there, but it does not answer "
                                 "as a torch store"], marks=pytest.mark.slow),
    pytest.param("env", "dead", ["could not reach the store at 127.0.0.1:{port} that env:// names "
                                 "once the script changed MASTER_ADDR:MASTER_PORT", "leave "
                                 "MASTER_ADDR and MASTER_PORT as the launcher sets them"],
                 marks=pytest.mark.slow),
])
def test_init_naming_a_store_nobody_hosts_ends_within_the_hang_timeout_explained(
        run_rankguard, mode, port_kind, fragments):
    with PORTS[port_kind]() as port:
        run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "2", INIT, mode,
                             str(port)], timeout=90)
    assert run.code == 1, run.stderr
    # the script's own mistake, which a restart would make again
    assert "usage_error" in run.outcomes().values(), run.outcomes()
    assert set(run.outcomes().values()) <= {"usage_error", "victim"}, run.outcomes()
    for fragment in fragments:
        assert fragment.format(port=port) in run.stderr


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_tcp_init_method_naming_the_launchers_store_still_works(run_rankguard):
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "2", INIT, "master"])
    assert run.code == 0, run.stderr
    assert "OK rank=1 sum=[2.0, 2.0]" in run.stdout


LAUNCHER = ("127.0.0.1", "29500")
SLACK_S = 20.0  # a loaded 2-core machine's scheduling delays, on top of a bound


def test_check_store_returns_at_once_for_a_real_store():
    from torch.distributed import TCPStore

    from rankguard.runtime.store_reachable import check_store

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    started = time.monotonic()
    check_store(f"tcp://127.0.0.1:{store.port}", "127.0.0.1", store.port, "0", 30, LAUNCHER)
    assert time.monotonic() - started < SLACK_S  # far below the 30 s it may wait


@pytest.mark.parametrize("port_kind, problem", [
    ("dead", "connection refused"),
    ("deaf", "something listens there, but it does not answer as a torch store"),
])
def test_check_store_gives_up_after_its_limit_naming_the_problem(port_kind, problem):
    """The store client left waiting on a deaf listener (see ``_shake_hands``) ends once the
    listener is gone, within the limit it was given: it outlives neither the rank nor this test."""
    from rankguard.runtime.store_reachable import check_store

    with ends_its_threads(SLACK_S), PORTS[port_kind]() as port:
        started = time.monotonic()
        with pytest.raises(UsageError) as info:
            check_store(f"tcp://127.0.0.1:{port}", "127.0.0.1", port, "3", 0.5, LAUNCHER)
        assert time.monotonic() - started < SLACK_S  # bounded by 2 x 0.5 s
    assert str(info.value).startswith(f"init_method: rank 3 could not reach the store at "
                                      f"tcp://127.0.0.1:{port} given as init_method: {problem}")
    assert "127.0.0.1:29500, the launcher's store" in str(info.value)
