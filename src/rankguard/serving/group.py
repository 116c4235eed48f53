"""One group of a pool: N rank processes (``serving.worker``) that form one gloo process group,
on a TCPStore of its own hosted in the leader (on loopback only: ``rankguard.store_server``).

A group is started, becomes ready once every rank has run the user's setup, runs requests one
at a time, and is retired after a fault: regrouped in place when every rank is alive and
answered, killed (SIGKILL of each rank's process tree) otherwise.

Nothing here blocks without a deadline. The verdict on a request that did not succeed
(:func:`WorkerGroup.run`) names the rank that failed first and why, apart from the ranks that
failed only as a consequence (their collective error names the culprit as missing).
"""

from __future__ import annotations

import os
import secrets
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import ledger as _ledger
from .. import private_files, proctree, sealed, stack_requests, store_server
from ..ledger import LedgerReader
from ..runtime import stacks
from ..errors import RequestFailed, UsageError
from . import leader_env
from .channel import ChannelClosed, LeaderEnd, dumps, pair

SEND_S = 2.0  # how long a rank may take to accept a message before it counts as frozen
EXIT_STATUS_S = 0.2  # how long to wait for the exit status of a rank whose channel closed
COLLECTIVE_MARGIN_S = 0.1  # collectives in the ranks give up this long before the deadline
TICK_S = 0.05
STACKS_S = 1.0  # how long ranks get to dump their stacks after a hang verdict
REAP_S = 5.0  # how long killed ranks get to be reaped
STORE_S = 30.0  # the bound on the group store's own waits
GROUP_MARKER = "RANKGUARD_GROUP_TOKEN"  # in the environment of a group's ranks and their children


@dataclass
class StartFailure:
    """Why a group did not become ready."""

    rank: int | None
    detail: str
    remote_traceback: str = ""  # the setup's, when it raised

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "the group"
        return f"{who} {self.detail}"


@dataclass
class Outcome:
    """What the ranks answered to one request."""

    results: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its answer
    dead: dict[int, str] = field(default_factory=dict)  # rank -> how it ended
    order: list[int] = field(default_factory=list)  # ranks in the order their news arrived

    @property
    def answered(self) -> set[int]:
        return set(self.results) | set(self.failures)


class WorkerGroup:
    """N rank processes of one gloo group; see the module docstring.

    Args:
        number: the group's number in its pool (names its folder and its journal events).
        world: how many ranks.
        setup: ``setup(rank, world_size) -> state``, run in each rank once the group formed.
        folder: where each rank's output goes (``rank<r>.log``).
        env: extra environment for the ranks.
    """

    def __init__(self, number: int, world: int, setup: Callable[[int, int], Any] | None,
                 folder: str, env: dict[str, str]) -> None:
        self.number = number
        self.world = world
        self.folder = folder
        self.started_at = time.monotonic()
        self.ready_at: float | None = None
        self.failure: StartFailure | None = None
        self.killed = False
        self._requests = 0
        self._unfinished: tuple[int, Outcome] | None = None  # a failed request, maybe running
        os.makedirs(folder, exist_ok=True)
        self._store = store_server.host_on_loopback(STORE_S)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ends: list[LeaderEnd] = []
        self._ready: set[int] = set()
        base = {**os.environ, **leader_env.leader_context(), **env,
                "MASTER_ADDR": store_server.LOOPBACK, "MASTER_PORT": str(self._store.port),
                "WORLD_SIZE": str(world), "TORCHELASTIC_USE_AGENT_STORE": "True",
                **sealed.host_env(),  # this group's own store seal
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        base.setdefault("RANKGUARD_GRACE", "2")
        # inherited by whatever the ranks start, so that close() and kill() find it after the
        # rank is gone (a variable of its own: a launcher's marker, if any, stays as it was)
        self._token = secrets.token_hex(8)
        base[GROUP_MARKER] = self._token
        self._ledgers: list[LedgerReader] = []
        for rank in range(world):
            ledger_path = os.path.join(folder, f"rank{rank}.ledger")
            _ledger.create(ledger_path, world)
            self._ledgers.append(LedgerReader(ledger_path))
            mine, theirs = pair()
            with open(self.log_path(rank), "ab", opener=private_files.opener) as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "rankguard.serving.worker"],
                    env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank),
                         leader_env.FD: str(theirs.fileno()), _ledger.PATH_ENV: ledger_path,
                         stacks.PATH_ENV: self.stacks_path(rank)},
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),), start_new_session=True)
            theirs.close()
            self.procs.append(proc)
            self.ends.append(LeaderEnd(mine))
        for end in self.ends:
            try:
                end.send({"op": "start", "setup": setup}, time.monotonic() + SEND_S)
            except (ChannelClosed, TimeoutError):
                pass  # that rank is gone already: poll_start reports it

    # -- start-up -------------------------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def log_path(self, rank: int) -> str:
        return os.path.join(self.folder, f"rank{rank}.log")

    def stacks_path(self, rank: int) -> str:
        return os.path.join(self.folder, f"rank{rank}.stacks")

    def capture_stacks(self, ranks: list[int] | None = None, budget: float = STACKS_S
                       ) -> dict[int, str]:
        """Ask ``ranks`` (default: all) that are alive for the stacks of all their threads
        (SIGUSR1; a stopped rank is continued to answer); rank -> the dump, for those that
        answered within ``budget`` seconds. Each dump is also appended to ``stacks_path``."""
        wanted = range(self.world) if ranks is None else ranks
        targets = {r: (self.procs[r].pid, [self.stacks_path(r)]) for r in wanted
                   if self.procs[r].poll() is None}
        return stack_requests.ask(targets, budget,  # type: ignore[return-value]
                                  gone=lambda r: self.procs[r].poll() is not None)

    def log_size(self, rank: int) -> int:
        try:
            return os.path.getsize(self.log_path(rank))
        except OSError:
            return 0

    def log_since(self, rank: int, offset: int = 0, limit: int = 4000) -> str:
        """What rank ``rank`` wrote after byte ``offset`` of its log: the last ``limit``
        characters of it, after ``...`` when cut."""
        try:
            with open(self.log_path(rank), errors="replace") as f:
                f.seek(offset)
                text = f.read()
        except OSError:
            return ""
        return text if len(text) <= limit else "...\n" + text[-limit:]

    def poll_start(self, start_timeout: float) -> str:
        """``starting``, ``ready`` or ``failed`` (then see ``failure``); never blocks."""
        if self.ready_at is not None:
            return "ready"
        if self.failure is not None:
            return "failed"
        for rank, end in enumerate(self.ends):
            if rank in self._ready:
                continue
            try:
                messages = end.receive()
            except ChannelClosed:
                self.failure = StartFailure(rank, f"exited during start-up "
                                            f"({self._ending(rank)}):\n{self.log_since(rank, limit=2000)}")
                return "failed"
            for message in messages:
                if message.get("op") == "ready":
                    self._ready.add(rank)
                elif message.get("op") == "setup_failed":
                    self.failure = StartFailure(
                        rank, f"failed its setup: {message['error']}: {message['message']}",
                        message["traceback"])
                    return "failed"
        if len(self._ready) == self.world:
            self.ready_at = time.monotonic()
            return "ready"
        if time.monotonic() - self.started_at > start_timeout:
            late = sorted(set(range(self.world)) - self._ready)
            self.failure = StartFailure(late[0], f"was not ready within {start_timeout:g} s "
                                        f"(ranks not ready: {', '.join(map(str, late))})")
            return "failed"
        return "starting"

    def describe(self, rank: int) -> str:
        """The rank's process in one line (state, wait channel, command line)."""
        return proctree.describe(self.procs[rank].pid)

    def alive(self) -> bool:
        return not self.killed and all(proc.poll() is None for proc in self.procs)

    # -- requests ---------------------------------------------------------------------------------

    def run(self, command: dict[str, Any], started: float, deadline_at: float) -> dict[int, Any]:
        """Run ``command`` (``fn``, ``args``, ``kwargs``, ``all``) on every rank; results by rank
        (only rank 0's unless ``all``).

        Raises:
            RequestFailed: a rank raised, exited, was killed, froze, or was still running at
                ``deadline_at`` while a peer waited for it or had answered; ``rank`` None when
                every rank answered with a collective error, or when every rank was still
                running at ``deadline_at`` and none was behind (cause ``deadline``: see
                :meth:`settle`). Raised within ``deadline_at`` + about 0.1 s, and as soon as
                the root cause is known or every rank has answered.
            UsageError: the command cannot be pickled (no rank got it).
        """
        collective_timeout = max(0.05, deadline_at - time.monotonic() - COLLECTIVE_MARGIN_S)
        request, outcome = self._send(command, collective_timeout, deadline_at)
        self._unfinished = (request, outcome)
        self._collect(request, outcome, deadline_at, lambda o: self._settled(o) or
                      self._verdict(o, started, final=False) is not None)
        verdict = self._verdict(outcome, started, final=len(outcome.results) < self.world)
        if verdict is not None:
            raise verdict
        self._unfinished = None
        return outcome.results

    def settle(self, budget: float) -> bool:
        """After a request that failed: wait up to ``budget`` seconds for every rank to be
        done with it. True if every rank answered it (alive, idle: it may regroup and serve
        again); False if a rank died or is still running it."""
        if self._unfinished is not None:
            request, outcome = self._unfinished
            self._collect(request, outcome, time.monotonic() + budget, self._settled)
            if len(outcome.answered) < self.world:
                return False
            self._unfinished = None
        return self.alive()

    def gather(self, command: dict[str, Any], collective_timeout: float, deadline_at: float,
               grace: float) -> Outcome:
        """Run ``command`` on every rank and collect every rank's answer (or death), until all
        are in or ``deadline_at``; once only ranks that a peer's collective error named as
        missing are left, they get at most ``grace`` seconds more. For reports that want every
        rank's traceback, not just the root cause.

        Raises:
            UsageError: the command cannot be pickled (no rank got it).
        """
        request, outcome = self._send(command, collective_timeout, deadline_at)

        def only_named_left(o: Outcome) -> bool:
            named = {r for a in o.failures.values() for r in a.get("missing", [])}
            left = set(range(self.world)) - o.answered - set(o.dead)
            return bool(named) and left <= named

        self._collect(request, outcome, deadline_at,
                      lambda o: self._settled(o) or only_named_left(o))
        if not self._settled(outcome):
            self._collect(request, outcome, min(deadline_at, time.monotonic() + grace),
                          self._settled)
        return outcome

    def _settled(self, outcome: Outcome) -> bool:
        """Every rank answered or died."""
        return len(outcome.answered | set(outcome.dead)) == self.world

    def _send(self, command: dict[str, Any], collective_timeout: float, deadline_at: float
              ) -> tuple[int, Outcome]:
        self._requests += 1
        request = self._requests
        try:
            data = dumps({"op": "run", "id": request, "timeout": collective_timeout, **command})
        except Exception as error:  # noqa: BLE001 (whatever pickling raises)
            raise UsageError("Pool.run", f"the function or its arguments cannot be pickled: "
                             f"{error}", "use a module-level function and picklable "
                             "arguments") from None
        outcome = Outcome()
        for rank, end in enumerate(self.ends):
            try:
                end.send_pickled(data, min(deadline_at, time.monotonic() + SEND_S))
            except ChannelClosed:
                self._record_death(outcome, rank)
            except TimeoutError:
                break  # that rank stopped reading; the verdict at the deadline names it
        return request, outcome

    def _collect(self, request: int, outcome: Outcome, until: float,
                 finished: Callable[[Outcome], bool]) -> None:
        """Read the answers to ``request`` (and the deaths of ranks) into ``outcome`` until
        ``finished(outcome)`` or ``until``."""
        with selectors.DefaultSelector() as selector:
            for rank, end in enumerate(self.ends):
                if rank not in outcome.dead and rank not in outcome.answered:
                    selector.register(end, selectors.EVENT_READ, rank)
            while not finished(outcome):
                now = time.monotonic()
                if now >= until:
                    return
                for key, _ in selector.select(min(until - now, TICK_S)):
                    rank = key.data
                    try:
                        messages = key.fileobj.receive()  # type: ignore[union-attr]
                    except ChannelClosed:
                        selector.unregister(key.fileobj)
                        self._record_death(outcome, rank)
                        continue
                    for answer in messages:
                        if answer.get("op") != "answer" or answer["id"] not in (request, None):
                            continue  # not an answer to this request
                        outcome.order.append(rank)
                        if answer["ok"]:
                            outcome.results[rank] = answer["result"]
                        else:
                            outcome.failures[rank] = answer

    def _record_death(self, outcome: Outcome, rank: int) -> None:
        outcome.dead[rank] = self._ending(rank)
        outcome.order.append(rank)

    def _ending(self, rank: int) -> str:
        """How rank ``rank`` ended, once its channel closed (bounded wait for its status)."""
        proc = self.procs[rank]
        try:
            return proctree.exit_detail(proc.wait(EXIT_STATUS_S))
        except subprocess.TimeoutExpired:
            return "closed its channel"

    def _verdict(self, outcome: Outcome, started: float, final: bool) -> RequestFailed | None:
        """The error for a request that failed, once its root cause is known (or, ``final``,
        at the deadline); None while it may still succeed."""
        took = time.monotonic() - started
        for rank in outcome.order:
            victims = sorted(r for r, a in outcome.failures.items() if a["collective"])
            if rank in outcome.dead:
                detail = outcome.dead[rank]
                cause = "signalled" if detail.startswith("was killed") else "exited"
                return RequestFailed(rank, cause, f"{detail} during the request",
                                     victims=victims, took=took)
            answer = outcome.failures.get(rank)
            if answer is not None and not answer["collective"]:
                return RequestFailed(rank, "raised", f"raised {answer['error']}: "
                                     f"{answer['message']}", error_type=answer["error"],
                                     remote_traceback=answer["traceback"], victims=victims,
                                     took=took)
        if not final:
            return None
        silent = sorted(set(range(self.world)) - outcome.answered - set(outcome.dead))
        victims = sorted(outcome.failures)
        absent, where = self._absent()
        stopped = [r for r in silent if proctree.is_stopped(self.procs[r].pid)]
        # silent ranks are to blame when stopped, behind the others, or slower than peers that
        # answered; when every rank is silent and none is behind, the deadline was the call's
        culprits = (stopped or [r for r in silent if r in absent]
                    or (silent if outcome.answered else []))
        if not culprits and silent:
            return RequestFailed(None, "deadline", "did not finish before the call's deadline: "
                                 "every rank was still running it and none was behind the "
                                 "others (the deadline was too short for the call, no rank is "
                                 "at fault)", took=took)
        if not culprits:  # every rank answered with a collective error and none is to blame
            first = next(r for r in outcome.order if r in outcome.failures)
            answer = outcome.failures[first]
            return RequestFailed(None, "raised", f"failed: rank {first} raised "
                                 f"{answer['error']}: {answer['message']}",
                                 error_type=answer["error"], victims=victims, took=took)
        rank = culprits[0]
        context = f"; it never reached {where}" if rank in absent and where else ""
        if len(culprits) > 1:
            context += f" (ranks {', '.join(map(str, culprits))} did not answer)"
        victims = sorted(set(victims) | (set(range(self.world)) - set(absent) - set(culprits)))
        if rank in stopped:
            return RequestFailed(rank, "frozen", f"was frozen (its process is stopped) at the "
                                 f"request's deadline{context}", victims=victims, took=took)
        return RequestFailed(rank, "deadline", f"was still running when the request's "
                             f"deadline passed{context}", victims=victims, took=took)

    def _absent(self) -> tuple[list[int], str]:
        """From the ranks' ledgers: the ranks behind the furthest collective any rank entered,
        and that collective (``all_reduce #3``); ([], "") when no rank is behind. Entries are
        written by the calling thread, so they are exact even for a rank that holds the GIL
        (completions are recorded by another thread, and may lag)."""
        world = {}
        for rank, reader in enumerate(self._ledgers):
            slot = next((g for g in reader.read().groups if g.is_world), None)
            if slot is not None:
                world[rank] = slot
        if not world:
            return [], ""
        absent, target = _ledger.behind(range(self.world), world)
        if not absent:
            return [], ""
        kind = next(g.kind for g in world.values() if g.entered == target)
        return absent, f"{kind} #{_ledger.seq_of(target, True)}"

    # -- after a fault ------------------------------------------------------------------------------

    def regroup(self, timeout: float) -> bool:
        """A fresh generation of the same ranks (every rank alive and idle); False if it did
        not form within ``timeout`` plus a second."""
        deadline_at = time.monotonic() + timeout + 1.0
        try:
            for end in self.ends:
                end.send({"op": "regroup", "timeout": timeout}, deadline_at)
        except (ChannelClosed, TimeoutError):
            return False
        done: set[int] = set()
        with selectors.DefaultSelector() as selector:
            for rank, end in enumerate(self.ends):
                selector.register(end, selectors.EVENT_READ, rank)
            while len(done) < self.world and time.monotonic() < deadline_at:
                for key, _ in selector.select(max(0.0, deadline_at - time.monotonic())):
                    try:
                        messages = key.fileobj.receive()  # type: ignore[union-attr]
                    except ChannelClosed:
                        return False
                    for message in messages:
                        if message.get("op") == "regrouped":
                            if not message["ok"]:
                                return False
                            done.add(key.data)
        return len(done) == self.world

    def kill(self, wait: bool = False) -> None:
        """SIGKILL every rank's process tree; reaped in the background, or (``wait``) here,
        within a few seconds."""
        self.killed = True
        for proc in self.procs:
            if proc.poll() is None:
                proctree.signal_tree(proc.pid, signal.SIGKILL)
                proctree.signal_tree(proc.pid, signal.SIGCONT)
        proctree.kill_all(proctree.with_env(GROUP_MARKER, self._token))  # what the ranks left
        if wait:
            self._reap()
        else:
            threading.Thread(target=self._reap, name="rankguard-reap", daemon=True).start()

    def _reap(self) -> None:
        deadline_at = time.monotonic() + REAP_S
        for proc in self.procs:
            try:
                proc.wait(max(0.01, deadline_at - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for end in self.ends:
            end.close()
        for reader in self._ledgers:
            reader.close()
        self._store = None

    def close(self, timeout: float) -> None:
        """Ask the ranks to shut down (a bounded barrier); kill what is left after
        ``timeout``, and reap them."""
        deadline_at = time.monotonic() + timeout
        if self.alive():
            for end in self.ends:
                try:
                    end.send({"op": "exit", "timeout": max(0.1, timeout - 0.5)}, deadline_at)
                except (ChannelClosed, TimeoutError):
                    break
        for proc in self.procs:
            try:
                proc.wait(max(0.01, deadline_at - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        self.kill(wait=True)
