"""Sealed store values: a rank acts only on what a rank of its own run wrote in the store.

Anyone who reaches a TCPStore can read, write, list and consume every key in it (a process of
another user can reach a store on loopback). The keys that make a rank act (a peer's notice that
the group failed, a probe and its answer, a regroup's membership, an arrival at a barrier) are
therefore **sealed** with a secret that only the ranks of one run hold:

- **The secret.** A host that starts ranks (``rankguard run``, each group of a
  ``rankguard.Pool``, hence the pytest plugin's rank pools) draws 32 random bytes per run or
  group (:func:`host_env`) and hands them to its ranks in ``RANKGUARD_SECRET`` (hex). A
  process's environment is readable only by its own user (``/proc/PID/environ`` is 0400).
  Without a host (stock ``torchrun`` or ``mp.spawn`` with ``rankguard.init()``), rank 0 draws
  the secret when the default group forms and broadcasts it over that group's own gloo
  connections (:func:`agree`), which a store client cannot read. So too with ``rankguard run``
  on several nodes (each agent would draw its own); there, under ``--recovery in-place``, the
  ranks also keep the agreed secret in a file of the run's private folder that the agent names
  (``RANKGUARD_SECRET_FILE``, 0600), where a replacement started later on that node reads it
  (:func:`adopt_kept`): it cannot take part in a broadcast of a group it has not joined.
- **The key** is ``HMAC-SHA256(secret, "rankguard-store-key/1" NUL namespace)``; the namespace
  is the launcher attempt's store prefix (``RANKGUARD_NAMESPACE``, empty elsewhere), so a value
  of one attempt is not valid in the next.
- **A sealed value** is ``<mac>.<payload>`` with ``mac = hex HMAC-SHA256(key, name NUL
  payload)``, where ``name`` is the store key or queue the value is written to (names carry the
  generation, the request id, the barrier call): a value cannot be moved to another key,
  generation, request or attempt.
- **Opening** checks the mac in constant time. A value without one or with a wrong one is
  treated as absent: it is dropped and counted (:func:`dropped`); the first one a process drops
  is reported on its stderr.

Without any secret (a process that no rankguard host started and whose default group rankguard
did not instrument: ``rankguard.init()`` was not called before it, or it is an NCCL group; such
a process has no probes, but may call ``rankguard.shutdown()`` or ``regroup()``) values are
written as ``-.<payload>`` and nothing is authenticated: that is the one case where a store
client can forge a barrier arrival or a membership.

What a store client can still do, secret or not: delete, overwrite or consume keys, which can
make a rank look absent or silent (a denial of service, bounded by the deadlines of the waits
involved), and interfere with torch's own rendezvous keys. Keep stores on loopback.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import string
import threading
from typing import Any

from ..records import private_files
from ..errors import UsageError

ENV = "RANKGUARD_SECRET"
KEPT_ENV = "RANKGUARD_SECRET_FILE"
NAMESPACE_ENV = "RANKGUARD_NAMESPACE"
SECRET_BYTES = 32
_UNSEALED = "-"


class _Key:
    value: bytes | None = None
    from_env: tuple[str, str] | None = None  # the (secret, namespace) ``value`` came from
    dropped = 0
    reported = False
    lock = threading.Lock()


_key = _Key()


MIN_SECRET_DIGITS = 32  # 128 bits


def check_env() -> None:
    """Refuse a ``RANKGUARD_SECRET`` that is set but is not a secret worth the name: fewer than
    32 hex digits (128 bits), or anything but hex digits (a stray space or newline would make
    one node's key differ from the others'). Unset or empty: none, which is fine.

    Raises:
        UsageError: naming the variable and how to make a good one.
    """
    value = os.environ.get(ENV, "")
    if not value:
        return
    odd = value.strip(string.hexdigits)
    if len(value) < MIN_SECRET_DIGITS or odd:
        what = f"{len(value)} characters" + (", not all hex digits" if odd else "")
        raise UsageError(ENV, f"expected at least {MIN_SECRET_DIGITS} hex digits and nothing "
                         f"else, got {what}", "export RANKGUARD_SECRET=$(openssl rand -hex "
                         "32), alike on every node")


def new_secret() -> str:
    """A fresh random secret, as hex."""
    return secrets.token_hex(SECRET_BYTES)


def host_env() -> dict[str, str]:
    """The environment a host adds for the ranks it starts: a fresh secret of their own."""
    return {ENV: new_secret()}


def _derive(secret: bytes, namespace: str) -> bytes:
    return hmac.new(secret, b"rankguard-store-key/1\0" + namespace.encode(),
                    hashlib.sha256).digest()


def adopt(secret: bytes, namespace: str = "") -> None:
    """Use ``secret`` (shared by every rank of the run) from now on."""
    _key.value, _key.from_env = _derive(secret, namespace), None


def from_host() -> bool:
    """Whether a host gave this process a secret (then no agreement is needed)."""
    return bool(os.environ.get(ENV))


def key() -> bytes | None:
    """The key in use: the host's (followed if the environment changes, as in a warm spare that
    becomes a rank), else the one agreed by the ranks, else None."""
    secret = os.environ.get(ENV)
    if secret:
        source = (secret, os.environ.get(NAMESPACE_ENV, ""))
        if source != _key.from_env:
            _key.value, _key.from_env = _derive(source[0].encode(), source[1]), source
    return _key.value


def _mac(key_: bytes, name: str, payload: str) -> str:
    return hmac.new(key_, name.encode() + b"\0" + payload.encode(), hashlib.sha256).hexdigest()


def seal(name: str, payload: str) -> str:
    """``payload`` as a value for store key (or queue) ``name``."""
    key_ = key()
    return f"{_mac(key_, name, payload) if key_ is not None else _UNSEALED}.{payload}"


def unseal(name: str, value: str | bytes, report: bool = True) -> str | None:
    """The payload of a value read from ``name``, or None (dropped and counted; the first one
    said on stderr, unless ``report`` is False) when it was not sealed for ``name`` with this
    run's key."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    mac, dot, payload = text.partition(".")
    key_ = key()
    expected = _mac(key_, name, payload) if key_ is not None else _UNSEALED
    if dot and hmac.compare_digest(mac.encode(), expected.encode()):  # any text, no TypeError
        return payload
    _drop(name, report)
    return None


def _drop(name: str, report: bool) -> None:
    with _key.lock:
        _key.dropped += 1
        first = report and not _key.reported
        _key.reported = _key.reported or report
    if first:
        who = f"rank {os.environ['RANK']}" if "RANK" in os.environ else f"pid {os.getpid()}"
        os.write(2, f"rankguard: {who}: ignored a value of {name!r} in the store without this "
                    f"run's seal (another process writes to the job's store)\n".encode())


def dropped() -> int:
    """How many values this process dropped because their seal was missing or wrong."""
    return _key.dropped


def agree(backend: Any, rank: int, size: int, timeout_s: float) -> None:
    """Rank 0 draws a secret and broadcasts it to the group's ranks over ``backend`` (a gloo
    backend whose ranks are all connected); every rank adopts it. For groups started without a
    host. Bounded by ``timeout_s``.

    Raises:
        RuntimeError: gloo's, when a peer does not take part within ``timeout_s``.
    """
    import torch
    from datetime import timedelta
    from torch.distributed import BroadcastOptions

    if size == 1:
        adopt(secrets.token_bytes(SECRET_BYTES))
        return
    data = bytearray(secrets.token_bytes(SECRET_BYTES) if rank == 0 else SECRET_BYTES)
    tensor = torch.frombuffer(data, dtype=torch.uint8)
    options = BroadcastOptions()
    options.rootRank, options.rootTensor = 0, 0
    options.timeout = timedelta(seconds=timeout_s)
    backend.broadcast([tensor], options).wait()
    secret = bytes(tensor.tolist())
    adopt(secret)
    _keep(secret)


def _keep(secret: bytes) -> None:
    """Write the agreed ``secret`` to ``$RANKGUARD_SECRET_FILE`` (0600, by a rename: a reader
    never sees half of it), if the launcher set it and it is not there yet; best effort (a
    replacement without it is refused with an explanation)."""
    target = os.environ.get(KEPT_ENV)
    if not target or os.path.exists(target):
        return
    try:
        private_files.replace_with(target, secret.hex())
    except OSError:
        pass


def adopt_kept() -> bool:
    """Adopt the secret the run's ranks agreed on and kept (:func:`_keep`), if this process has
    no key yet; returns whether it has one now."""
    if key() is not None:
        return True
    target = os.environ.get(KEPT_ENV)
    if not target:
        return False
    try:
        secret = bytes.fromhex(private_files.read_regular(target, 2 * SECRET_BYTES).decode())
    except (OSError, ValueError):
        return False
    if len(secret) != SECRET_BYTES:
        return False
    adopt(secret)
    return True
