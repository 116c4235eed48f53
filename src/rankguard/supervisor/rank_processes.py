"""One set of rank processes: start, watch, stacks, kill, reap, close.

A set is the ranks of one launcher attempt, of one replica of a ``rankguard.Pool``, or of the
pytest plugin's warm ranks. Each rank runs in a session of its own (its process group can be
signalled as a whole) and carries this set's marker (``MARKER_VAR``) in its environment, which
whatever it starts inherits: :meth:`RankProcesses.sweep` finds those by it.

Everything that can happen is an event in one selector: a rank's exit (its pidfd), its output
(pipes, when it has them), readers its user registers (the launcher's signal wakeup fd, a
replica's channels), timers, and a wake pipe that any thread may poke (:meth:`wake`). The
driver either pumps the events itself (:meth:`pump`, the launcher's loop) or lets a thread of
the set do it (:meth:`watch`, a replica, whose requests wait on their own condition).
Nothing waits without a :class:`~rankguard.deadline.Deadline`.
"""

from __future__ import annotations

import heapq
import itertools
import os
import secrets
import selectors
import signal as _signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from ..records import ledger as _ledger
from ..records import private_files
from ..processes import proctree, stack_requests
from ..deadline import Deadline
from .output import OutputStream

MARKER_VAR = "RANKGUARD_RANKS_TOKEN"  # this set's marker, inherited by whatever a rank starts
RANK_MARKER_VAR = "RANKGUARD_RANK_TOKEN"  # one rank process's marker, likewise
Writer = Callable[[bytes], None]
Tee = Callable[[int], tuple[Writer | None, Writer | None]]  # rank -> its (stdout, stderr) writers


@dataclass(frozen=True)
class RankFiles:
    """Where one rank's files are: its output log, its stacks dump, its progress ledger."""

    log: str
    stacks: str
    ledger: str


@dataclass(eq=False)
class RankProcess:
    """One rank process of a set."""

    rank: int
    proc: subprocess.Popen[bytes]
    files: RankFiles
    started_at: float  # monotonic
    pidfd: int = -1
    returncode: int | None = None  # Popen's: negative for a signal
    exited_at: float | None = None  # monotonic, when its exit was seen
    killed: bool = False  # its supervisor had to SIGKILL it
    stopped: bool = False  # its supervisor sent it SIGTERM or SIGKILL (``signal``)
    warm: bool = False  # a warm spare became this rank
    marker: str = ""  # its own marker (``RANK_MARKER_VAR``), inherited by what it starts

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.returncode is None

    @property
    def ledger_path(self) -> str:
        return self.files.ledger

    @property
    def stacks_path(self) -> str:
        return self.files.stacks

    @property
    def log_path(self) -> str:
        return self.files.log

    def ending(self) -> str:
        """How it ended (``exited with code 3``, ``was killed by SIGKILL``); "" while alive."""
        return "" if self.returncode is None else proctree.exit_detail(self.returncode)


def spawn(argv: Sequence[str], env: Mapping[str, str], *, log: str | None = None,
          stdin_pipe: bool = False, pass_fds: Sequence[int] = ()) -> subprocess.Popen[bytes]:
    """Start one process in a session of its own.

    stdin is ``/dev/null``, or a pipe (``stdin_pipe``: a warm spare reads its rank's
    environment from it). stdout and stderr go straight into the file ``log`` (appended, created
    0600): right for a set whose driver does not read all the time; without ``log``, into pipes
    that :class:`RankProcesses` reads into the log and its tee.
    """
    common = dict(env=dict(env), stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
                  pass_fds=tuple(pass_fds), start_new_session=True)
    if log is None:
        return subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                **common)  # type: ignore[call-overload]
    with open(log, "ab", opener=private_files.opener) as out:
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                **common)  # type: ignore[call-overload]


class RankProcesses:
    """The rank processes of one set; see the module docstring.

    Args:
        number: which set this is for its owner (the launcher's attempt number, a pool's
            replica number).
        world: how many ranks the set will have (sizes each rank's ledger).
        tee: where rank output read from pipes is also written, prefixed ``[rankN]:``:
            ``tee(rank)`` gives rank ``rank``'s (stdout, stderr) writers, None for a stream
            that goes only to the rank's log; ``tee`` None: every stream only to the log.
    """

    def __init__(self, number: int, world: int, tee: Tee | None = None) -> None:
        self.number = number
        self.world = world
        self.token = secrets.token_hex(8)
        self._tee = tee
        self._members: list[RankProcess] = []
        self._reported: set[int] = set()  # ranks whose exit the watcher has reported
        self._launched = 0  # rank processes started: numbers each one's marker
        self._hurried = False  # hurry(): the ranks' grace is over
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._timers: list[tuple[float, int, Deadline, Callable[[], None]]] = []  # a heap
        self._timer_ids = itertools.count()
        self._lock = threading.Lock()  # the timers, and who releases the descriptors
        self._exits = threading.Condition()  # notified when a rank's exit has been handled
        self._watcher: threading.Thread | None = None
        self._watching = False  # the watcher's loop runs
        self._closing = False
        self._released = False
        self._watcher_releases = False  # close() found the watcher busy: it releases on exit

    # -- the ranks --------------------------------------------------------------------------

    def start(self, rank: int, files: RankFiles, env: Mapping[str, str],
              launch: Callable[[dict[str, str]], subprocess.Popen[bytes]]) -> RankProcess:
        """Start rank ``rank``: create its ledger at ``files.ledger``, add this set's marker to
        ``env`` and have ``launch(env)`` start the process (with :func:`spawn`, or by handing
        ``env`` to a warm spare). Its exit, and its output when it has pipes, are watched from
        now on."""
        member = self._launch(rank, files, env, launch)
        self._members.append(member)
        return member

    def replace(self, rank: int, files: RankFiles, env: Mapping[str, str],
                launch: Callable[[dict[str, str]], subprocess.Popen[bytes]]) -> RankProcess:
        """Start a new process as rank ``rank``, whose member has exited (been reaped), as
        :meth:`start` does; it takes the old member's place in the set, which keeps nothing
        of the old one (its ledger file is removed; a reader's mapping of it stays readable):
        a set replaced any number of times holds no more than its ``world`` members. Returns
        the new member.

        Raises:
            ValueError: rank ``rank``'s member is still alive, or there is none.
        """
        index = next((i for i, m in enumerate(self._members) if m.rank == rank), None)
        if index is None or self._members[index].alive:
            raise ValueError(f"rank {rank} has no member that has exited")
        member = self._launch(rank, files, env, launch)
        old = self._members[index]
        with self._exits:
            self._members[index] = member
            self._reported.discard(rank)
        if old.ledger_path != member.ledger_path:
            _remove(old.ledger_path)
        return member

    def _launch(self, rank: int, files: RankFiles, env: Mapping[str, str],
                launch: Callable[[dict[str, str]], subprocess.Popen[bytes]]) -> RankProcess:
        _ledger.create(files.ledger, self.world)
        self._launched += 1
        marker = f"{self.token}.{self._launched}"
        proc = launch({**env, MARKER_VAR: self.token, RANK_MARKER_VAR: marker})
        member = RankProcess(rank, proc, files, time.monotonic(), marker=marker)
        member.pidfd = os.pidfd_open(proc.pid)
        self._selector.register(member.pidfd, selectors.EVENT_READ, ("exit", member))
        if proc.stdout is not None and proc.stderr is not None:
            log = open(files.log, "ab", opener=private_files.opener)  # noqa: SIM115 (at EOF)
            tees = self._tee(rank) if self._tee is not None else (None, None)
            for pipe, tee in zip((proc.stdout, proc.stderr), tees):
                os.set_blocking(pipe.fileno(), False)
                stream = OutputStream(f"[rank{rank}]:".encode(), tee, log)
                self._selector.register(pipe, selectors.EVENT_READ, ("out", stream))
        return member

    def __iter__(self) -> Iterator[RankProcess]:
        return iter(list(self._members))

    def __len__(self) -> int:
        return len(self._members)

    def __getitem__(self, rank: int) -> RankProcess:
        """The member that is rank ``rank`` (its global number: on a node other than the
        first, that is not its place in the set).

        Raises:
            KeyError: no member is rank ``rank``.
        """
        for member in self._members:
            if member.rank == rank:
                return member
        raise KeyError(f"no rank {rank} in this set (ranks "
                       f"{', '.join(str(m.rank) for m in self._members)})")

    @property
    def pids(self) -> list[int]:
        return [member.pid for member in self._members]

    def live(self) -> list[RankProcess]:
        return [member for member in self._members if member.alive]

    # -- events -----------------------------------------------------------------------------

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the driver's thread) whenever ``fd`` is readable."""
        self._selector.register(fd, selectors.EVENT_READ, ("call", callback))

    def remove_reader(self, fd: int) -> None:
        try:
            self._selector.unregister(fd)
        except (KeyError, ValueError):
            pass

    def call_at(self, when: Deadline, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the driver's thread) once ``when`` has passed; any thread
        may ask."""
        with self._lock:
            heapq.heappush(self._timers, (when.at, next(self._timer_ids), when, callback))
        self.wake()

    def wake(self) -> None:
        """Wake the driver's wait at once (from any thread)."""
        with self._lock:
            if self._released:
                return
            try:
                os.write(self._wake_w, b"\0")
            except BlockingIOError:
                pass  # already poked: the pipe is full

    def pump(self, until: Deadline) -> list[RankProcess]:
        """Wait for events until the first comes or ``until`` passes, handle them (reap the
        ranks that exited, read output, call readers and due timers); returns the ranks that
        exited. Only the driver calls it: one thread at a time."""
        with self._lock:
            wake = until.sooner(self._timers[0][2]) if self._timers else until
        exited = []
        for key, _ in self._selector.select(wake.wait_time_or_none()):
            what, obj = key.data
            if what == "exit":
                self._reap(obj)
                exited.append(obj)
            elif what == "out":
                self._read_output(key.fileobj, obj)  # type: ignore[arg-type]
            elif what == "wake":
                _drain(self._wake_r)
            else:
                obj()
        for callback in self._due_timers():
            callback()
        return exited

    def _due_timers(self) -> list[Callable[[], None]]:
        with self._lock:
            due = []
            while self._timers and self._timers[0][2].passed():
                due.append(heapq.heappop(self._timers)[3])
            return due

    def watch(self, on_exit: Callable[[RankProcess], None], name: str) -> None:
        """Drive the events from a thread of the set's own until :meth:`close`: for a user
        that waits on its own state rather than on the selector. ``on_exit`` is called (from
        that thread) for each rank that exited, once it is reaped."""

        def loop() -> None:
            try:
                while not self._closing:
                    for member in self.pump(Deadline.never()):
                        try:
                            on_exit(member)
                        finally:  # waiters in other threads see the exit once it is reported
                            with self._exits:
                                self._reported.add(member.rank)
                                self._exits.notify_all()
            finally:
                with self._lock:
                    self._watching = False
                    release = self._watcher_releases
                if release:
                    self._release()

        self._watching = True
        self._watcher = threading.Thread(target=loop, name=name, daemon=True)
        self._watcher.start()

    def _reap(self, member: RankProcess) -> None:
        member.returncode = member.proc.wait()  # its pidfd is readable: a zombie, at once
        member.exited_at = time.monotonic()
        self.remove_reader(member.pidfd)
        os.close(member.pidfd)
        member.pidfd = -1
        with self._exits:
            self._exits.notify_all()

    def _read_output(self, pipe: IO[bytes], stream: OutputStream) -> None:
        try:
            data = os.read(pipe.fileno(), 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self._selector.unregister(pipe)
            pipe.close()
        stream.feed(data)

    def _driven_here(self) -> bool:
        return self._watcher is None or threading.current_thread() is self._watcher

    def hurry(self) -> None:
        """End the grace the ranks were given, now and for the rest of the attempt: a wait
        with ``grace=True`` returns at once (its caller kills what is left). Only sets a flag:
        safe from a signal handler, whose signal wakes the driver's wait through the wakeup
        fd the launcher reads."""
        self._hurried = True

    def wait_exits(self, until: Deadline, ranks: set[int] | None = None, *,
                   grace: bool = False) -> bool:
        """Wait until every rank (of ``ranks``, default all) has exited and been reaped, or
        ``until`` passes, or (``grace``: a wait for ranks to end on their own) :meth:`hurry`
        was called; returns whether they all have. From the driver's thread it pumps the
        events; from another, it waits for the watcher to report the exits."""

        def done() -> bool:
            return not any(ranks is None or m.rank in ranks for m in self.live())

        def reported() -> bool:  # reaped, and the watcher's on_exit has run for each
            return done() and all(m.rank in self._reported for m in self._members
                                  if ranks is None or m.rank in ranks)

        if not self._driven_here():
            with self._exits:
                return self._exits.wait_for(reported, until.wait_time_or_none())
        while not done() and not until.passed() and not (grace and self._hurried):
            self.pump(until)
        return done()

    def drain_output(self, until: Deadline) -> None:
        """Read the rest of the ranks' output until the pipes close (when the last process
        holding them exits) or ``until`` passes. Only the driver calls it."""
        while any(key.data[0] == "out" for key in self._selector.get_map().values()):
            if until.passed():
                return
            self.pump(until)

    # -- stacks and signals -----------------------------------------------------------------

    def stacks(self, until: Deadline, ranks: Sequence[int] | None = None) -> dict[int, str]:
        """Ask the live ranks of ``ranks`` (default: all) for the Python stacks of all their
        threads (SIGUSR1 to the main thread); rank -> the dump, for those that answered before
        ``until``. Each dump is also appended to the rank's stacks file. A stopped rank is
        continued to answer, then stopped again: it is about to be blamed as frozen, and must
        not go on with its steps meanwhile (it did: two more steps with its peers)."""
        wanted = list(self._members) if ranks is None else [self[r] for r in ranks]
        targets = {m.rank: (m.pid, [m.stacks_path]) for m in wanted if m.proc.poll() is None}
        return stack_requests.ask(  # type: ignore[return-value]
            targets, until.wait_time(), gone=lambda r: self[r].proc.poll() is not None,
            keep_stopped=True)

    def signal(self, sig: int, members: Sequence[RankProcess] | None = None) -> None:
        """Send ``sig`` to the process tree and process group of each live rank of
        ``members`` (default: all), then SIGCONT so that a stopped one acts on it at once."""
        for member in self.live() if members is None else members:
            if member.alive:
                member.stopped = member.stopped or sig in (_signal.SIGTERM, _signal.SIGKILL)
                proctree.signal_tree(member.pid, sig)
                proctree.signal_tree(member.pid, _signal.SIGCONT)

    def sweep(self) -> None:
        """SIGKILL every live process that carries this set's marker: what the ranks started
        and left behind, even detached from their process trees (not this process)."""
        proctree.kill_all(proctree.with_env(MARKER_VAR, self.token))

    def sweep_rank(self, member: RankProcess) -> None:
        """SIGKILL what rank ``member`` started and left behind, its own process gone, while
        its peers (and what they started) go on: its process group and session (children,
        forks without exec) and what carries its marker (daemons that left both)."""
        leftovers = set(proctree.in_session(member.pid))
        leftovers.update(proctree.with_env(RANK_MARKER_VAR, member.marker))
        leftovers -= {peer.pid for peer in self.live()}
        try:
            os.killpg(member.pid, _signal.SIGKILL)
        except OSError:
            pass
        proctree.kill_all(sorted(leftovers))

    def kill(self, until: Deadline | None = None) -> bool:
        """SIGKILL every rank's process tree and :meth:`sweep`; then, given ``until``, wait
        until the ranks are reaped or it passes (see :meth:`wait_exits`). Returns whether they
        all are."""
        for member in self.live():
            member.killed = True
        self.signal(_signal.SIGKILL)
        self.sweep()
        return not self.live() if until is None else self.wait_exits(until)

    # -- the end ----------------------------------------------------------------------------

    def close(self, until: Deadline) -> None:
        """Stop the watcher (waiting for it until ``until``), close every descriptor (pidfds,
        pipes, logs, the wake pipe) and remove the ledgers. Call it once the ranks have ended
        (:meth:`kill`, or the user's own escalation): processes still alive are left alone,
        unwatched. A watcher still busy at ``until`` (or the caller itself) releases them when
        it stops. Idempotent."""
        self._closing = True
        self.wake()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(until.wait_time_or_none())
        with self._lock:
            if self._watching:
                self._watcher_releases = True
                return
        self._release()

    def _release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        for key in list(self._selector.get_map().values()):
            what, obj = key.data
            if what == "out":
                key.fileobj.close()  # type: ignore[union-attr]
                obj.log.close()
        for member in self._members:
            if member.pidfd >= 0:
                os.close(member.pidfd)
                member.pidfd = -1
        self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        for member in self._members:
            _remove(member.ledger_path)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass
