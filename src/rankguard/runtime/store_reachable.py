"""Under ``rankguard run``: making sure the store a rank's ``init_process_group`` names answers.

The launcher hosts the job's store and every rank is a client of it (torchrun's
``TORCHELASTIC_USE_AGENT_STORE``): no rank hosts a store of its own. ``init_method="env://"``
(the default) with the launcher's ``MASTER_ADDR``/``MASTER_PORT`` is served by that store. An
``init_method="tcp://HOST:PORT"`` naming another address, or an ``env://`` whose
``MASTER_ADDR``/``MASTER_PORT`` the script changed, meets a store only if the script hosts one
there itself. Otherwise torch's client retries for its timeout (30 minutes by default), and a
listener there that is not a store keeps it waiting for good; either way no rank reaches the
rendezvous, so the launcher sees no collective to blame anyone in.

:func:`check_store` bounds that wait: before torch tries, it connects to the address and lets a
torch store client shake hands there, within the run's ``--hang-timeout`` (the time rankguard
lets a rank go without progress; as long again for the handshake, once something accepted the
connection). If no store answers by then it raises a :class:`UsageError`
that names the rank, the address and how to fix the script.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from ..deadline import Deadline, check_seconds
from ..errors import UsageError, first_line

HANG_TIMEOUT_ENV = "RANKGUARD_HANG_TIMEOUT"
_STORE_RETRY_S = 0.05  # between connection attempts: a store coming up is found this soon
_STORE_CONNECT_S = 1.0  # the most one connection attempt may take
_MIN_S = 0.001  # the least timeout a socket or a store client takes (0 would mean none)


def address(init_method: str | None) -> tuple[str, int] | None:
    """The ``(host, port)`` of the store ``init_method`` names: for ``env://`` (or None),
    ``MASTER_ADDR``/``MASTER_PORT`` as they are now. None for other schemes (``file://``) and
    for addresses torch itself refuses at once (no port, a port out of range)."""
    if init_method is None or init_method == "env://":
        host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
        return (host, int(port)) if host and port.isdigit() else None
    url = urlsplit(str(init_method))
    if url.scheme != "tcp":
        return None
    try:
        port = url.port
    except ValueError:
        return None
    return (url.hostname, port) if url.hostname and port is not None else None


def wait_limit(init_timeout: timedelta | None) -> float | None:
    """Seconds a rank may wait for a store to answer: the run's ``--hang-timeout``, or the
    timeout given to ``init_process_group`` when that is shorter. None outside the launcher."""
    value = os.environ.get(HANG_TIMEOUT_ENV)
    if not value:
        return None
    limit = check_seconds(HANG_TIMEOUT_ENV, value)
    if init_timeout is not None:
        limit = min(limit, max(init_timeout.total_seconds(), _MIN_S))
    return limit


def check_store(init_method: str | None, host: str, port: int, rank: str, seconds: float,
                launcher: tuple[str, str]) -> None:
    """Return once a torch store answers at ``host:port``: within ``seconds`` for a
    connection, and ``seconds`` more for the store's handshake.

    Raises:
        UsageError: nothing accepted a connection there, or what did is not a torch store;
            names ``rank``, ``init_method`` and the launcher's store ``launcher`` as the fix.
    """
    problem = _connect(host, port, Deadline.after(seconds))
    if problem is None:  # something listens: a store answers its handshake at once
        problem = _shake_hands(host, port, Deadline.after(seconds))
    if problem is None:
        return
    waited = f"{problem} (waited {seconds:g} s, the run's --hang-timeout)"
    ours = f"{launcher[0]}:{launcher[1]}"
    if init_method not in (None, "env://"):
        raise UsageError("init_method", f"rank {rank} could not reach the store at {init_method} "
                         f"given as init_method: {waited}", "under rankguard run, leave "
                         "init_method unset (env://) or point it at MASTER_ADDR:MASTER_PORT "
                         f"({ours}, the launcher's store)")
    raise UsageError("init_method", f"rank {rank} could not reach the store at {host}:{port} "
                     f"that env:// names once the script changed MASTER_ADDR:MASTER_PORT (the "
                     f"launcher's store is {ours}): {waited}", "under rankguard run, leave "
                     "MASTER_ADDR and MASTER_PORT as the launcher sets them (os.environ."
                     "setdefault), or give rankguard run --master-port")


def _connect(host: str, port: int, limit: Deadline) -> str | None:
    """None once a TCP connection to ``host:port`` succeeds; else, at ``limit``, why not."""
    problem = "no answer"
    while not limit.passed():
        try:
            with socket.create_connection(
                    (host, port), timeout=limit.wait_time(_STORE_CONNECT_S, at_least=_MIN_S)):
                return None
        except OSError as exc:
            problem = (exc.strerror or str(exc) or type(exc).__name__).lower()
        time.sleep(limit.wait_time(_STORE_RETRY_S))
    return problem


def _shake_hands(host: str, port: int, limit: Deadline) -> str | None:
    """None if a torch store client connects to ``host:port`` by ``limit``, else why not.

    The client runs in a daemon thread: against a listener that is not a store, torch's client
    waits for its handshake for good, whatever its timeout, and only a thread can be left there.
    """
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def shake() -> None:
        try:
            from torch.distributed import TCPStore

            TCPStore(host, port, is_master=False, wait_for_workers=False,
                     timeout=timedelta(seconds=limit.wait_time(at_least=_MIN_S)))
        except Exception as exc:  # noqa: BLE001 (reported, whatever torch raised)
            outcome["error"] = first_line(exc)
        done.set()

    threading.Thread(target=shake, name="rankguard-store-check", daemon=True).start()
    if not done.wait(limit.wait_time()):
        return "something listens there, but it does not answer as a torch store"
    return outcome.get("error")
