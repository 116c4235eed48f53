"""Warm spares: rank processes started ahead of a restart, with torch already imported.

Starting Python and importing torch costs about 2.5 s per process here, more when several start
on few cores. A restart that takes its ranks from spares skips that: each spare has run the
bootstrap up to ``import torch`` and waits on stdin for the environment of the rank it becomes
(``runtime.bootstrap --spare``). The agent starts them once the running attempt has taken its
first step (so spares never slow down a start), and only while restarts remain.

Spares carry the run's marker, so the guardian kills them if the launcher dies; the sweep after
each attempt leaves them alone (``pids``).
"""

from __future__ import annotations

import subprocess

from .config import RunConfig
from .ranks import base_env, discard, start_bootstrap


class Spares:
    """Up to ``count`` warm spares (default: one per rank, for the next attempt; one, for
    ``--recovery in-place``, which replaces a rank at a time)."""

    def __init__(self, config: RunConfig, token: str, master_port: int,
                 count: int | None = None) -> None:
        self._config = config
        self._token = token
        self._port = master_port
        self._count = config.nproc if count is None else count
        self._spares: list[subprocess.Popen[bytes]] = []

    def fill(self) -> int:
        """Start spares until there are ``count``; returns how many were started."""
        missing = self._count - len(self._spares)
        env = base_env(self._config, self._token, self._port)
        for _ in range(missing):
            self._spares.append(start_bootstrap(self._config, env, spare=True))
        return missing

    def take(self) -> subprocess.Popen[bytes] | None:
        """A spare for the next rank, or None when there is none left."""
        return self._spares.pop(0) if self._spares else None

    def pids(self) -> list[int]:
        return [spare.pid for spare in self._spares]

    def close(self) -> None:
        """SIGKILL every unused spare (they hold no state) and reap it."""
        spares, self._spares = self._spares, []
        for spare in spares:
            discard(spare)
