"""Warm ranks for ``@pytest.mark.ranks(N)`` tests.

A set of warm ranks is one replica of ``rankguard.Pool``'s machinery (``serving.replica``): N
rank processes that imported torch and joined one group (gloo, or NCCL on CUDA devices), its store hosted in the test
process, so a suite of small distributed tests pays the start once. A test runs on every rank
(``rank_tasks.run_test``); :meth:`WarmRanks.run` gathers every rank's answer, the victims'
tracebacks included, not just the root cause a pool's call reports. After a failed test the
ranks form a fresh generation of their group (``rankguard.regroup``, about 10 ms); warm ranks
that lost a rank, or that a test left stuck, are closed and new ones start next time.

Every wait here has a deadline: start-up (``START_S``), each test (the test's own
:class:`~rankguard.deadline.Deadline`, less the margins below), regroup and close.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

from .. import margins
from ..deadline import Deadline
from ..errors import PoolUnavailable, UnavailableState, UsageError
from ..inputs.options import check_ranks_env
from ..serving.budgets import REGROUP_MARGIN_S, STACKS_S
from ..serving.placement import ReplicaPlacement
from ..serving.replica import Replica, StartState
from ..serving.verdict import Outcome
from . import processes
from .rank_tasks import run_test

START_S = 90.0
MISSING_GRACE_S = 1.0  # how long to wait for ranks that peers already named as missing
CLOSE_S = 5.0


class WarmRanks:
    """N warm rank processes with one process group: gloo on the CPU, or NCCL on the CUDA
    devices of ``placement`` (each rank's device is its current one, ``rankguard.device()``).

    Raises:
        PoolUnavailable: the ranks did not start (``failed``: a rank died, or was not ready
            within ``START_S``; the message has their output), or would not (a value in the
            environment that torch refuses as the ranks form their group: the message names
            it).
    """

    def __init__(self, placement: ReplicaPlacement, tag: str) -> None:
        try:
            check_ranks_env()
        except UsageError as error:
            raise PoolUnavailable(UnavailableState.FAILED, 0.0,
                                  f"the warm ranks cannot start: {error}") from None
        world = self.world = placement.world_size
        self.folder = tempfile.mkdtemp(prefix=f"rankguard-pool{world}-")
        start_by = Deadline.after(START_S)
        self._replica = Replica(0, world, None, self.folder, {processes.TAG: tag}, start_by,
                                placement=placement)
        state = self._replica.wait_started(start_by)
        if state != StartState.READY:
            failure = self._replica.failure
            logs = self.logs()
            self.close(graceful=False)
            raise PoolUnavailable(UnavailableState.FAILED, 0.0, f"the warm ranks did not start: "
                                  f"{failure.describe() if failure else state}\n{logs}")

    @property
    def pids(self) -> list[int]:
        return self._replica.pids

    def log_size(self, rank: int) -> int:
        return self._replica.log_size(rank)

    def log_since(self, rank: int, offset: int, limit: int = 4000) -> str:
        return self._replica.log_since(rank, offset, limit)

    def logs(self) -> str:
        return "\n".join(f"--- rank {r}:\n{self.log_since(r, 0)}" for r in range(self.world))

    def alive(self) -> bool:
        return self._replica.alive()

    def run(self, path: str, name: str, args: bytes, test: Deadline
            ) -> dict[int, dict[str, Any]]:
        """Run test function ``name`` of file ``path`` on every rank, within the test's
        deadline ``test``; answers by rank, ``{"outcome": "passed"}``, ``{"outcome":
        "failed", "error", "collective", "missing", "traceback", "at", ...}``, or
        ``{"outcome": "ended", "detail"}`` for a rank whose process ended during the test
        (``exited with code 0``, ``was killed by SIGKILL``); a rank that did not answer in
        time is absent. A rank that passed and no longer has its process group (the test
        destroyed it) answers ``{"outcome": "passed", "group": False}``.

        Every rank's answer is awaited, until ``margins.answers_by(test)``; once only
        ranks that a peer's collective error named as missing are left, they get at most
        ``MISSING_GRACE_S`` more.

        Raises:
            UsageError: the test cannot be pickled (no rank got it).
        """
        answers_by = margins.answers_by(test)
        collectives = margins.collectives_by(test)
        replica = self._replica
        outcome = replica.submit({"fn": run_test, "args": (path, name, args), "kwargs": {},
                                  "all": True}, collectives, answers_by)

        def all_accounted(o: Outcome) -> bool:
            return o.all_accounted(self.world)

        def only_named_left(o: Outcome) -> bool:
            named = {r for a in o.failures.values() for r in a.get("missing", [])}
            left = set(range(self.world)) - o.answered - set(o.dead)
            return bool(named) and left <= named

        seen = replica.wait(outcome, answers_by, lambda o: all_accounted(o) or only_named_left(o))
        if not all_accounted(seen):
            seen = replica.wait(outcome, answers_by.within(MISSING_GRACE_S), all_accounted)
        answers: dict[int, dict[str, Any]] = {
            r: {"outcome": "passed", **({} if kept is not False else {"group": False})}
            for r, kept in seen.results.items()}
        answers.update({r: {"outcome": "failed", **a} for r, a in seen.failures.items()})
        answers.update({r: {"outcome": "ended", "detail": replica.ending(r) or how.detail}
                        for r, how in seen.dead.items()})
        return answers

    def regroup(self) -> bool:
        """A fresh generation of the group after a failed test; False if it did not form."""
        return self._replica.regroup(Deadline.after(margins.REGROUP_S + REGROUP_MARGIN_S))

    def stacks(self, ranks: list[int]) -> dict[int, str]:
        """The stacks of ``ranks`` (all threads), as they answer SIGUSR1."""
        dumps = self._replica.capture_stacks(Deadline.after(STACKS_S), ranks)
        return {rank: dumps.get(rank) or f"(no answer: {self._replica.describe(rank)})"
                for rank in ranks}

    def close(self, graceful: bool = True) -> None:
        """Shut the ranks down: a bounded shutdown (``graceful``), or SIGKILL at once; then
        remove the folder (the ranks' logs, ledgers and stacks: read them before)."""
        if graceful and self.alive():
            self._replica.close(Deadline.after(CLOSE_S))
        else:
            self._replica.kill(wait=True)
        shutil.rmtree(self.folder, ignore_errors=True)
