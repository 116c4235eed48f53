"""Warm pools of rank processes for ``@pytest.mark.ranks(N)`` tests.

A pool is N processes of ``rank_worker`` that imported torch and joined one gloo group (its
store hosted in the test process), so a suite of small distributed tests pays the start once.
A test runs on every rank of the pool; the pool answers with each rank's result. After a failed
test the ranks form a fresh generation of their group (``rankguard.regroup``, about 10 ms); a
pool that lost a rank, or that a test left stuck, is closed and a new one starts next time.

Every wait here has a deadline: start-up (``START_S``), each test (its own deadline), regroup
and close.
"""

from __future__ import annotations

import base64
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

from .. import proctree
from . import processes

START_S = 90.0
MISSING_GRACE_S = 1.0  # how long to wait for ranks that peers already named as missing
CLOSE_S = 5.0


class PoolError(Exception):
    """The pool could not start, or broke while serving."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RankPool:
    """N warm rank processes with one gloo group."""

    def __init__(self, world: int, tag: str) -> None:
        from torch.distributed import TCPStore

        self.world = world
        self.folder = tempfile.mkdtemp(prefix=f"rankguard-pool{world}-")
        port = _free_port()
        self._store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                               timeout=timedelta(seconds=60))
        self.procs: list[subprocess.Popen[bytes]] = []
        self._results: list[Any] = []
        self._selector = selectors.DefaultSelector()
        for rank in range(world):
            read_fd, write_fd = os.pipe()
            env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                   "RANKGUARD_POOL_FD": str(write_fd), "RANKGUARD_GRACE": "2",
                   "TORCHELASTIC_USE_AGENT_STORE": "True",  # env:// as a client of ours
                   "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                   processes.TAG: tag}
            with open(self.log_path(rank), "wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "rankguard.testing.rank_worker"], env=env,
                    stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(write_fd,), start_new_session=True)
            os.close(write_fd)
            reader = os.fdopen(read_fd, "rb")
            self.procs.append(proc)
            self._results.append(reader)
            self._selector.register(reader, selectors.EVENT_READ, rank)
        ready = self._collect(time.monotonic() + START_S)
        if len(ready) < world:
            self.close()
            raise PoolError(f"{world - len(ready)} of {world} ranks did not start within "
                            f"{START_S:g} s:\n{self.logs()}")

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def log_path(self, rank: int) -> str:
        return os.path.join(self.folder, f"rank{rank}.log")

    def log_size(self, rank: int) -> int:
        try:
            return os.path.getsize(self.log_path(rank))
        except OSError:
            return 0

    def log_since(self, rank: int, offset: int, limit: int = 4000) -> str:
        try:
            with open(self.log_path(rank), errors="replace") as f:
                f.seek(offset)
                text = f.read()
        except OSError:
            return ""
        return text if len(text) <= limit else "...\n" + text[-limit:]

    def logs(self) -> str:
        return "\n".join(f"--- rank {r}:\n{self.log_since(r, 0)}" for r in range(self.world))

    def alive(self) -> bool:
        return all(proc.poll() is None for proc in self.procs)

    def _send(self, command: dict[str, Any]) -> None:
        line = (json.dumps(command) + "\n").encode()
        for proc in self.procs:
            assert proc.stdin is not None
            try:
                proc.stdin.write(line)
                proc.stdin.flush()
            except OSError:
                pass  # that rank is dead: its answer will be missing

    def _collect(self, deadline: float, named_missing: bool = False) -> dict[int, dict[str, Any]]:
        """Answers by rank until all came, ``deadline`` passed, or (``named_missing``) every
        rank not named missing by a peer answered and the named ones had their grace."""
        answers: dict[int, dict[str, Any]] = {}
        closed: set[int] = set()
        grace_end: float | None = None
        while len(answers) + len(closed - set(answers)) < self.world:
            now = time.monotonic()
            end = min(deadline, grace_end) if grace_end is not None else deadline
            if now >= end:
                break
            for key, _ in self._selector.select(end - now):
                rank = key.data
                line = key.fileobj.readline()
                if not line:
                    closed.add(rank)
                    self._selector.unregister(key.fileobj)
                    continue
                answers[rank] = json.loads(line)
            if named_missing and grace_end is None:
                named = {r for a in answers.values() for r in a.get("missing", [])}
                if named and all(r in answers or r in named for r in range(self.world)):
                    grace_end = time.monotonic() + MISSING_GRACE_S
        return answers

    def run(self, path: str, name: str, args: bytes, deadline: float,
            collective_timeout: float) -> dict[int, dict[str, Any]]:
        """Run test function ``name`` of file ``path`` on every rank; answers by rank (a rank
        that did not answer by ``deadline`` is absent)."""
        self._send({"op": "run", "path": path, "name": name,
                    "args": base64.b64encode(args).decode(),
                    "collective_timeout": collective_timeout})
        return self._collect(deadline, named_missing=True)

    def regroup(self) -> bool:
        """A fresh generation of the group after a failed test; False if it did not form."""
        self._send({"op": "regroup", "timeout": 10})
        answers = self._collect(time.monotonic() + 15)
        return len(answers) == self.world and all(a.get("ok") for a in answers.values())

    def stacks(self, ranks: list[int]) -> dict[int, str]:
        """The stacks of ``ranks`` (all threads), as they answer SIGUSR1."""
        found = {}
        for rank in ranks:
            pid = self.procs[rank].pid
            text = processes.ask_stacks(pid, [processes.own_stacks_file(pid)])
            found[rank] = text or f"(no answer: {proctree.describe(pid)})"
        return found

    def close(self, graceful: bool = True) -> None:
        """Shut the ranks down: ask them (``graceful``) or SIGTERM them (each tears itself down
        and exits at once); kill what is left after ``CLOSE_S``."""
        if graceful and self.alive():
            self._send({"op": "exit", "timeout": 2})
        elif not graceful:
            for proc in self.procs:
                if proc.poll() is None:
                    proctree.signal_tree(proc.pid, signal.SIGTERM)
                    proctree.signal_tree(proc.pid, signal.SIGCONT)
        end = time.monotonic() + CLOSE_S
        for proc in self.procs:
            try:
                proc.wait(max(end - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs:
            if proc.poll() is None:
                proctree.signal_tree(proc.pid, signal.SIGKILL)
                proctree.signal_tree(proc.pid, signal.SIGCONT)
                proc.wait(5)
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        for reader in self._results:
            reader.close()
        self._selector.close()
        for rank in range(self.world):
            try:
                os.unlink(processes.own_stacks_file(self.procs[rank].pid))
            except OSError:
                pass
        self._store = None
