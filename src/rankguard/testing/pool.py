"""Warm pools of rank processes for ``@pytest.mark.ranks(N)`` tests.

A pool is one group of ``rankguard.Pool``'s machinery (``serving.group.WorkerGroup``): N rank
processes that imported torch and joined one gloo group, its store hosted in the test process,
so a suite of small distributed tests pays the start once. A test runs on every rank of the pool
(``rank_tasks.run_test``); the pool answers with every rank's result, the victims' tracebacks
included. After a failed test the ranks form a fresh generation of their group
(``rankguard.regroup``, about 10 ms); a pool that lost a rank, or that a test left stuck, is
closed and a new one starts next time.

Every wait here has a deadline: start-up (``START_S``), each test (its own deadline), regroup
and close.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any

from .. import proctree
from ..serving.group import WorkerGroup
from . import processes
from .rank_tasks import run_test

START_S = 90.0
MISSING_GRACE_S = 1.0  # how long to wait for ranks that peers already named as missing
REGROUP_S = 10.0
CLOSE_S = 5.0
_POLL_S = 0.02


class PoolError(Exception):
    """The pool could not start."""


class RankPool:
    """N warm rank processes with one gloo group."""

    def __init__(self, world: int, tag: str) -> None:
        self.world = world
        self.folder = tempfile.mkdtemp(prefix=f"rankguard-pool{world}-")
        self._group = WorkerGroup(0, world, None, self.folder, {processes.TAG: tag})
        while (state := self._group.poll_start(START_S)) == "starting":
            time.sleep(_POLL_S)
        if state != "ready":
            failure = self._group.failure
            logs = self.logs()
            self.close(graceful=False)
            raise PoolError(f"the pool's ranks did not start: "
                            f"{failure.describe() if failure else state}\n{logs}")

    @property
    def pids(self) -> list[int]:
        return self._group.pids

    def log_size(self, rank: int) -> int:
        return self._group.log_size(rank)

    def log_since(self, rank: int, offset: int, limit: int = 4000) -> str:
        return self._group.log_since(rank, offset, limit)

    def logs(self) -> str:
        return "\n".join(f"--- rank {r}:\n{self.log_since(r, 0)}" for r in range(self.world))

    def alive(self) -> bool:
        return self._group.alive()

    def run(self, path: str, name: str, args: bytes, deadline: float,
            collective_timeout: float) -> dict[int, dict[str, Any]]:
        """Run test function ``name`` of file ``path`` on every rank; answers by rank,
        ``{"outcome": "passed"}``, ``{"outcome": "failed", "error", "collective", "missing",
        "traceback", "at", ...}``, or ``{"outcome": "ended", "detail"}`` for a rank whose
        process ended during the test (``exited with code 0``, ``was killed by SIGKILL``); a
        rank that did not answer by ``deadline`` is absent."""
        outcome = self._group.gather({"fn": run_test, "args": (path, name, args),
                                      "kwargs": {}, "all": False},
                                     collective_timeout, deadline, MISSING_GRACE_S)
        answers: dict[int, dict[str, Any]] = {r: {"outcome": "passed"} for r in outcome.results}
        answers.update({r: {"outcome": "failed", **a} for r, a in outcome.failures.items()})
        answers.update({r: {"outcome": "ended", "detail": self._ending(r, how)}
                        for r, how in outcome.dead.items()})
        return answers

    def _ending(self, rank: int, seen: str) -> str:
        """How the process of ``rank`` ended: ``seen`` by the group when its channel closed,
        or its exit status if that came later."""
        code = self._group.procs[rank].poll()
        return proctree.exit_detail(code) if code is not None else seen

    def regroup(self) -> bool:
        """A fresh generation of the group after a failed test; False if it did not form."""
        return self._group.regroup(REGROUP_S)

    def stacks(self, ranks: list[int]) -> dict[int, str]:
        """The stacks of ``ranks`` (all threads), as they answer SIGUSR1."""
        dumps = self._group.capture_stacks(ranks)
        return {rank: dumps.get(rank) or f"(no answer: {self._group.describe(rank)})"
                for rank in ranks}

    def close(self, graceful: bool = True) -> None:
        """Shut the ranks down: a bounded shutdown (``graceful``), or SIGKILL at once; then
        remove the pool's folder (the ranks' logs, ledgers and stacks: read them before)."""
        if graceful and self.alive():
            self._group.close(CLOSE_S)
        else:
            self._group.kill(wait=True)
        shutil.rmtree(self.folder, ignore_errors=True)
