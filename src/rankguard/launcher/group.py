"""The rank processes of one attempt: starting them, their output, noticing their exits.

Exits are events, not polls: each rank has a pidfd in one selector, beside its output pipes and
whatever the agent registers (its signal wakeup fd). ``pump(timeout)`` waits for the next event,
handles it, and returns the ranks that exited.

Each rank runs ``python -m rankguard.runtime.bootstrap`` in its own session (so its process group
can be signalled as a whole) with torchrun's environment plus rankguard's own variables.

Output: each rank's stdout and stderr go, as they come, to its log file and (``--tee``, the
default) to the launcher's own stdout and stderr, each line prefixed with ``[rankN]:``. A line
ends at ``\n`` or ``\r`` (progress bars), so a rank that never prints a newline is still
shown; a partial line is held back (up to ``MAX_PARTIAL`` bytes) so that ranks' lines do not
interleave. Each byte is handled a bounded number of times: the cost is linear in the output.
The terminal never blocks the launcher (see ``terminal``); the log files keep everything.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Callable

from .. import ledger as _ledger
from .. import private_files, sealed
from ..deadline import Deadline
from ..proctree import MARKER
from .config import RunConfig
from .store import namespace
from .terminal import Terminal

MAX_PARTIAL = 1 << 16  # bytes of an unfinished line held back before it is written anyway
_LINE_START = re.compile(rb"(\r\n|\r(?!\n)|\n)(?=.)", re.DOTALL)  # a line ends, one begins


@dataclass(eq=False)
class Rank:
    """One rank process of an attempt."""

    rank: int
    proc: subprocess.Popen[bytes]
    ledger_path: str
    stacks_path: str
    log_path: str
    started_at: float
    pidfd: int = -1
    returncode: int | None = None
    exited_at: float | None = None
    killed_by_launcher: bool = False  # needed SIGKILL after the grace period
    warm: bool = False  # a warm spare became this rank

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.returncode is None


def _activate(spare: subprocess.Popen[bytes], env: dict[str, str]) -> bool:
    """Hand ``env`` to a waiting spare; False (and the spare discarded) when it is gone."""
    assert spare.stdin is not None
    try:
        if spare.poll() is None:
            spare.stdin.write(json.dumps(env).encode() + b"\n")
            spare.stdin.close()
            return True
    except OSError:  # it died meanwhile
        pass
    discard(spare)
    return False


def discard(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a bootstrap process that never became a rank, reap it, close its pipes."""
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


@dataclass
class _Stream:
    """One output pipe of a rank: where it goes and its unfinished line."""

    prefix: bytes
    tee: Callable[[bytes], None] | None
    log: IO[bytes]
    partial: bytearray = field(default_factory=bytearray)
    at_line_start: bool = True  # the last byte written ended a line

    def feed(self, data: bytes) -> None:
        """Take the next bytes read from the pipe (``b""``: end of file)."""
        if not data:
            if self.partial or not self.at_line_start:  # end the last line
                self._emit(bytes(self.partial) + b"\n")
                self.partial.clear()
            return
        cut = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if cut == len(data) - 1 and data[cut] == 13:  # a lone \r could be half of \r\n
            cut = max(data.rfind(b"\n", 0, cut), data.rfind(b"\r", 0, cut))
        if cut < 0:
            self.partial += data
            if len(self.partial) < MAX_PARTIAL:
                return
            block = bytes(self.partial)
            self.partial.clear()
        else:
            block = bytes(self.partial) + data[:cut + 1]
            self.partial[:] = data[cut + 1:]
        self._emit(block)

    def _emit(self, block: bytes) -> None:
        self.log.write(block)
        self.log.flush()
        if self.tee is not None:
            lines = _LINE_START.sub(rb"\1" + self.prefix, block)
            self.tee(self.prefix + lines if self.at_line_start else lines)
        self.at_line_start = block.endswith((b"\n", b"\r"))


def base_env(config: RunConfig, token: str, master_port: int) -> dict[str, str]:
    """The environment every rank of the run shares (a warm spare starts with this)."""
    env = dict(os.environ)
    world = config.nproc
    env.update(
        WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", GROUP_WORLD_SIZE="1",
        ROLE_WORLD_SIZE=str(world), ROLE_NAME="default", MASTER_ADDR=config.master_addr,
        MASTER_PORT=str(master_port), TORCHELASTIC_MAX_RESTARTS=str(config.max_restarts),
        TORCHELASTIC_RUN_ID=config.run_id, TORCHELASTIC_USE_AGENT_STORE="True",
        TORCH_NCCL_ASYNC_ERROR_HANDLING=env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
        PYTHONUNBUFFERED=env.get("PYTHONUNBUFFERED", "1"),
        RANKGUARD_LAUNCHER_PID=str(os.getpid()),
        RANKGUARD_INJECT=";".join(spec.text for spec in config.injections),
        RANKGUARD_GRACE=f"{config.rank_grace:g}",
        RANKGUARD_HANG_TIMEOUT=f"{config.hang_timeout:g}",  # bounds a rank's wait for a store
        RANKGUARD_LOG_DIR=config.log_dir,  # the run's private folder (0700), e.g. for checkpoints
    )
    env[sealed.ENV] = config.secret
    if config.collective_timeout is not None:
        env["RANKGUARD_COLLECTIVE_TIMEOUT"] = f"{config.collective_timeout:g}"
    env[MARKER] = token
    return env


def rank_env(config: RunConfig, rank: int, attempt: int, token: str, master_port: int,
             ledger_path: str, stacks_path: str) -> dict[str, str]:
    """torchrun's environment for ``rank`` plus rankguard's variables."""
    env = base_env(config, token, master_port)
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank),
        TORCHELASTIC_RESTART_COUNT=str(attempt), RANKGUARD_LEDGER=ledger_path,
        RANKGUARD_STACKS=stacks_path, RANKGUARD_ATTEMPT=str(attempt),
        RANKGUARD_NAMESPACE=namespace(config.run_id, attempt),
    )
    return env


def start_bootstrap(config: RunConfig, env: dict[str, str],
                    spare: bool = False) -> subprocess.Popen[bytes]:
    """Start ``python -m rankguard.runtime.bootstrap`` for the run's command, in its own session.

    A spare gets a stdin pipe, for its activation line; a rank gets no stdin.
    """
    argv = [sys.executable, "-m", "rankguard.runtime.bootstrap", *(["--spare"] if spare else []),
            *config.command]
    return subprocess.Popen(argv, env=env, stdin=subprocess.PIPE if spare else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


@dataclass
class RankGroup:
    """All ranks of one attempt and the selector that watches them."""

    config: RunConfig
    attempt: int
    dir: str
    ledger_dir: str  # the run's private ledger folder (``ledger.make_dir``)
    terminal: Terminal | None = None  # where rank output is teed (None: only to the logs)
    ranks: list[Rank] = field(default_factory=list)
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)

    @classmethod
    def start(cls, config: RunConfig, attempt: int, token: str, master_port: int,
              ledger_dir: str,
              spares: Callable[[], subprocess.Popen[bytes] | None] = lambda: None,
              terminal: Terminal | None = None) -> "RankGroup":
        """Create the ledgers and start every rank; returns at once (ranks import in parallel).

        Each rank is a warm spare from ``spares()`` when it gives one, else a new process.
        Rank output is teed to ``terminal`` when given and ``config.tee`` is set.
        """
        attempt_dir = os.path.join(config.log_dir, f"attempt{attempt}")
        os.makedirs(attempt_dir, mode=0o700, exist_ok=True)
        group = cls(config, attempt, attempt_dir, ledger_dir, terminal if config.tee else None)
        for rank in range(config.nproc):
            group._spawn(rank, token, master_port, spares())
        return group

    def _spawn(self, rank: int, token: str, master_port: int,
               spare: subprocess.Popen[bytes] | None) -> None:
        ledger_path = os.path.join(self.ledger_dir, f"attempt{self.attempt}-rank{rank}.ledger")
        _ledger.create(ledger_path, self.config.nproc)
        stacks_path = os.path.join(self.dir, f"stacks_rank{rank}.txt")
        log_path = os.path.join(self.dir, f"rank{rank}.log")
        env = rank_env(self.config, rank, self.attempt, token, master_port, ledger_path,
                       stacks_path)
        proc = spare if spare is not None and _activate(spare, env) else \
            start_bootstrap(self.config, env)
        member = Rank(rank, proc, ledger_path, stacks_path, log_path, time.monotonic(),
                      warm=proc is spare)
        member.pidfd = os.pidfd_open(proc.pid)
        self.selector.register(member.pidfd, selectors.EVENT_READ, ("exit", member))
        log = open(log_path, "ab", opener=private_files.opener)  # noqa: SIM115 (closed at EOF)
        terminal = self.terminal
        tees = (terminal.out.write, terminal.err.write) if terminal is not None else (None, None)
        for pipe, tee in zip((proc.stdout, proc.stderr), tees):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            stream = _Stream(f"[rank{rank}]:".encode(), tee, log)
            self.selector.register(pipe, selectors.EVENT_READ, ("out", stream))
        self.ranks.append(member)

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        """Wake ``pump`` and call ``callback`` when ``fd`` is readable."""
        self.selector.register(fd, selectors.EVENT_READ, ("call", callback))

    def live(self) -> list[Rank]:
        return [member for member in self.ranks if member.alive]

    def pump(self, timeout: float) -> list[Rank]:
        """Wait up to ``timeout`` s for events, handle them; returns ranks that exited."""
        exited = []
        for key, _ in self.selector.select(max(timeout, 0.0)):
            what, obj = key.data
            if what == "exit":
                self._reap(obj, key.fileobj)
                exited.append(obj)
            elif what == "out":
                self._read_output(key.fileobj, obj)
            else:
                obj()
        return exited

    def _reap(self, member: Rank, pidfd: object) -> None:
        member.returncode = member.proc.wait()
        member.exited_at = time.monotonic()
        self.selector.unregister(pidfd)
        os.close(member.pidfd)

    def _read_output(self, pipe: IO[bytes], stream: _Stream) -> None:
        try:
            data = os.read(pipe.fileno(), 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self.selector.unregister(pipe)
            pipe.close()
        stream.feed(data)

    def wait_exits(self, deadline: Deadline, ranks: set[int] | None = None) -> None:
        """Handle events until every rank (of ``ranks``, default all) has exited or
        ``deadline`` passes."""
        while any(ranks is None or m.rank in ranks for m in self.live()):
            if deadline.passed():
                return
            self.pump(deadline.wait_time())

    def drain_output(self, deadline: Deadline) -> None:
        """Read the rest of the ranks' output (pipes close when the last holder exits)."""
        while any(key.data[0] == "out" for key in self.selector.get_map().values()):
            if deadline.passed():
                return
            self.pump(deadline.wait_time(0.05))

    def close(self) -> None:
        for key in list(self.selector.get_map().values()):
            if key.data[0] == "out":
                key.fileobj.close()
                key.data[1].log.close()
        self.selector.close()
        for member in self.ranks:
            try:
                os.unlink(member.ledger_path)
            except OSError:
                pass
