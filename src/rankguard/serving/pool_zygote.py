"""A pool's zygote (``supervisor.zygote``): started when the pool starts its first replica,
waited for (bounded by the pool's ``start_timeout``), replaced when it dies or is late, and
given up after ``ZYGOTE_TRIES`` failures, after which ranks start cold. A rank is forked from
it while it is ready; when a fork fails the zygote is dropped and that rank starts cold.

Every process forked from it carries ``ZYGOTE_TOKEN_VAR`` in its environ, and so does what such
a rank forks in turn without exec: :meth:`PoolZygote.close` finds those in /proc and kills them.

Only the pool's supervisor thread uses it (it starts the replicas, whose ranks it forks).
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..processes import proctree
from ..deadline import Deadline
from ..supervisor.zygote import Zygote, ZygoteUnavailable
from . import leader_env
from .replica import WORKER_MODULE, StartRank, cold_start

ZYGOTE_TOKEN_VAR = "RANKGUARD_ZYGOTE_TOKEN"  # in the zygote's environ, and so in /proc of its forks
ZYGOTE_TRIES = 3  # zygotes that may fail (die, stop answering) before ranks start cold only
FORK_S = 2.0  # how long a zygote may take to fork a rank (it answers in milliseconds)

Event = Callable[..., None]  # the pool's journal: event(name, **fields)


class PoolZygote:
    """A pool's zygote; see the module docstring.

    Args:
        enabled: False: ranks start cold, no zygote is ever started.
        env: the ranks' extra environment (the pool's ``env``).
        log_dir: the pool's log folder (the zygote's output goes to ``zygote.log`` there).
        start_timeout: how long a zygote may take to be ready.
        on_change: called when the zygote becomes ready or is lost (wakes the supervisor).
        event: writes a journal event.
    """

    def __init__(self, enabled: bool, env: Mapping[str, str], log_dir: str,
                 start_timeout: float, on_change: Callable[[], None], event: Event) -> None:
        self.enabled = enabled
        self.failures = 0  # zygotes that failed
        self._env = dict(env)
        self._log_dir = log_dir
        self._start_timeout = start_timeout
        self._on_change = on_change
        self._event = event
        self._zygote: Zygote | None = None
        self._ready_by = Deadline.never()  # when a starting zygote must be ready
        self._tries = 0 if enabled else ZYGOTE_TRIES
        self._token = secrets.token_hex(8)  # marks every process forked from it

    @property
    def ready(self) -> bool:
        """Whether ranks can be forked from it now."""
        return self._zygote is not None and self._zygote.ready

    def wait_time(self) -> float | None:
        """Start a zygote if there should be one; how long to wait for it before starting a
        replica (None: start it now, forked if :attr:`ready`, else cold)."""
        zygote = self._zygote
        if zygote is None:
            return self._start()
        if zygote.ready:
            return None
        if zygote.gone or self._ready_by.passed():
            self._failed(("it died" if zygote.imported else "it died while importing")
                         if zygote.gone else
                         f"it was not ready within {self._start_timeout:g} s")
            return 0.0
        return self._ready_by.wait_time()

    def _start(self) -> float | None:
        if self._tries >= ZYGOTE_TRIES:
            return None  # cold starts only
        self._tries += 1
        env = {**os.environ, **leader_env.leader_context(), **self._env,
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               ZYGOTE_TOKEN_VAR: self._token}
        try:
            os.makedirs(self._log_dir, exist_ok=True)
            self._zygote = Zygote(["torch", "torch.distributed", WORKER_MODULE], env,
                                  os.path.join(self._log_dir, "zygote.log"), self._on_change)
        except Exception as error:  # noqa: BLE001 (no descriptor, no memory...): ranks start
            # cold; the supervisor must not die of it
            self._tries = ZYGOTE_TRIES
            self.failures += 1
            self._event("zygote_failed", pid=None, detail=f"it could not start: {error}",
                        cold=True)
            return None
        self._ready_by = Deadline.after(self._start_timeout)
        self._event("zygote_start", pid=self._zygote.proc.pid)
        return self._ready_by.wait_time()

    def _failed(self, why: str) -> None:
        """Drop the zygote (killed, with the ranks it forked that still run); the next start-up
        makes a new one, or after ``ZYGOTE_TRIES`` starts ranks cold."""
        zygote, self._zygote = self._zygote, None
        if zygote is None:
            return
        zygote.proc.kill()
        self.failures += 1
        self._event("zygote_failed", pid=zygote.proc.pid, detail=why,
                    cold=self._tries >= ZYGOTE_TRIES)
        threading.Thread(target=zygote.close, args=(Deadline.after(0.0),), daemon=True,
                         name="rankguard-zygote-reap").start()

    def starter(self, fork: bool) -> StartRank | None:
        """How a replica starts its ranks: forked from the zygote (``fork``), else cold
        (None: the replica's default)."""
        return self._fork_rank if fork else None

    def _fork_rank(self, env: dict[str, str], log: str, channel_fd: int) -> Any:
        """A replica's rank, forked by the zygote (cold when the zygote fails: it is dropped)."""
        zygote = self._zygote
        if zygote is not None:
            try:
                return zygote.fork(WORKER_MODULE, {**env, leader_env.LEADER: str(zygote.proc.pid)},
                                   log, {leader_env.FD: channel_fd}, Deadline.after(FORK_S))
            except ZygoteUnavailable as error:
                if self._zygote is zygote:
                    self._failed(str(error))
        return cold_start(env, log, channel_fd)

    def close(self, until: Deadline) -> None:
        """Close the zygote (its ranks are killed by ``until``), and kill what its ranks forked
        without exec (they show the zygote's environ)."""
        if self._zygote is not None:
            self._zygote.close(until)
        if self.enabled:
            proctree.kill_all(proctree.with_env(ZYGOTE_TOKEN_VAR, self._token))
