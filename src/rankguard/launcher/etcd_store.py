"""The job's store in an etcd server (``--rdzv-backend etcd-v2``).

torch's etcd-v2 rendezvous keeps its state in etcd through ``EtcdRendezvousBackend``, and
offers ``EtcdStore``, a c10d store over etcd's v2 API (the ``python-etcd`` client). rankguard
takes both from torch (``create_backend``: the same endpoint, protocol and certificate settings
as torchrun's ``--rdzv-conf``) and adds what the agents need of their job-wide store:

- **errors a caller can catch**: every failure of etcd (refused, timed out, an HTTP error, a
  wait that ran out) is raised as torch's ``DistStoreError``, a RuntimeError, as a TCPStore
  raises it; torch's class raises etcd's, urllib3's and LookupError;
- ``compare_set``, which torch's class lacks: etcd's own atomic create and compare-and-swap.

Importing this module imports ``etcd`` (the ``python-etcd`` package): ``rendezvous.connect``
imports it only for ``etcd-v2``, and turns its absence into a usage error.

Only the job-wide keys live here (the agents' count, the rounds' numbers, the job's end) and
torch's rendezvous state; each round's fast traffic (beats, the round's end, the ranks' keys)
goes to a TCPStore hosted by that round's node 0 (``round_store``), so that the loss of any node
ends a round, never the job.
"""

from __future__ import annotations

import datetime
from typing import Any, Callable, TypeVar

import etcd
from torch.distributed import DistStoreError
from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousParameters
from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import create_backend
from torch.distributed.elastic.rendezvous.etcd_store import EtcdStore

from ..errors import UsageError, first_line
from .config import RendezvousConfig

T = TypeVar("T")


def open_etcd(cfg: RendezvousConfig, run_id: str) -> tuple[Any, "EtcdJobStore"]:
    """torch's etcd-v2 rendezvous backend and the job's store, both on the etcd server at
    ``cfg.endpoint``. The client asks the server for its cluster's members (one request,
    bounded by ``read_timeout``).

    Raises:
        UsageError: torch refused a setting of ``--rdzv-conf``, or etcd did not answer.
    """
    params = RendezvousParameters("etcd-v2", cfg.endpoint, run_id, cfg.min_nodes, cfg.max_nodes,
                                  read_timeout=str(cfg.read_timeout), **dict(cfg.extra))
    try:
        backend, torch_store = create_backend(params)
    except RendezvousConnectionError as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise UsageError("--rdzv-endpoint", f"the etcd server at {cfg.endpoint} did not answer "
                         f"({first_line(cause)})", "is etcd running there, with its v2 API "
                         "enabled (etcd --enable-v2)?") from None
    except (ValueError, RuntimeError) as exc:
        raise UsageError("--rdzv-conf", f"torch's etcd-v2 backend refused the settings: "
                         f"{first_line(exc)}", "see torch's etcd-v2 rendezvous settings") from None
    store = EtcdJobStore(torch_store.client, torch_store.prefix, cfg.endpoint,
                         datetime.timedelta(seconds=cfg.read_timeout))
    return backend, store


class EtcdJobStore(EtcdStore):
    """A c10d store of the job's keys in etcd at ``endpoint`` (see the module's docstring)."""

    def __init__(self, client: Any, prefix: str, endpoint: str,
                 timeout: datetime.timedelta) -> None:
        super().__init__(client, prefix, timeout)
        self._endpoint = endpoint

    def _call(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except DistStoreError:
            raise
        except LookupError:  # torch's class: a wait that ran out
            raise DistStoreError(f"etcd at {self._endpoint}: {what}: timed out") from None
        except Exception as exc:  # noqa: BLE001 (etcd's, urllib3's, socket errors alike)
            raise DistStoreError(f"etcd at {self._endpoint}: {what}: "
                                 f"{type(exc).__name__}: {first_line(exc)}") from None

    def set(self, key: Any, value: Any) -> None:
        self._call("set", lambda: super(EtcdJobStore, self).set(key, value))

    def get(self, key: Any) -> bytes:
        return self._call("get", lambda: super(EtcdJobStore, self).get(key))

    def add(self, key: Any, num: int) -> int:
        return self._call("add", lambda: super(EtcdJobStore, self).add(key, num))

    def wait(self, keys: Any, override_timeout: datetime.timedelta | None = None) -> None:
        self._call("wait", lambda: super(EtcdJobStore, self).wait(keys, override_timeout))

    def check(self, keys: Any) -> bool:
        return self._call("check", lambda: super(EtcdJobStore, self).check(keys))

    def compare_set(self, key: Any, expected: Any, desired: Any) -> bytes:
        """As a TCPStore's: ``desired`` is written if the key holds ``expected`` (or is absent
        and ``expected`` is empty); returns the value the key holds after."""
        return self._call("compare_set", lambda: self._compare_set(key, expected, desired))

    def _compare_set(self, key: Any, expected: Any, desired: Any) -> bytes:
        path = self.prefix + self._encode(key)
        try:
            if not expected:
                self.client.write(key=path, value=self._encode(desired), prevExist=False)
            else:
                self.client.test_and_set(key=path, value=self._encode(desired),
                                         prev_value=self._encode(expected))
        except (etcd.EtcdAlreadyExist, etcd.EtcdCompareFailed, etcd.EtcdKeyNotFound):
            try:
                return self._decode(self.client.get(key=path).value)
            except etcd.EtcdKeyNotFound:
                return b""  # a value was expected, and there is none
        return desired.encode() if isinstance(desired, str) else bytes(desired)
