"""Start real rank processes the way ``mp.spawn`` programs and torchrun do, without either.

``Ranks`` runs ``tests/scripts/runtime_scenarios.py SCENARIO`` as N processes with the env://
variables set (rank 0 hosts the TCPStore, or a process of its own does, as a launcher's), or
under stock torchrun or ``rankguard run``, and
reads what the scenario reports through its folder. Every wait here has a deadline; ``close()``
kills whatever is still alive.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rankguard.processes import proctree

from ..conftest import ROOT, script

SCENARIOS = script("runtime_scenarios.py")
STORE_HOST = ("import sys, time\n"
              "from torch.distributed import TCPStore\n"
              "store = TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, "
              "wait_for_workers=False)\n"
              "time.sleep(300)\n")


def free_port() -> int:
    """A port that is free now, for a rank 0 that binds it a moment later.

    Taken below the kernel's ephemeral range: a port the kernel hands out (bind to 0) is also
    what every outgoing connection gets, and with tests running in parallel one of those took
    it before rank 0 bound it (EADDRINUSE). Outside that range only another explicit bind can.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(1000):
        port = random.randrange(10000, max(10001, low))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port from 10000 to {low} in 1000 tries")


class Ranks:
    """N rank processes of one scenario; a context manager that kills them all at exit."""

    def __init__(self, scenario: str, world: int, folder: Path, launcher: str = "plain",
                 env: dict[str, str] | None = None, launcher_args: tuple[str, ...] = (),
                 store_outside: bool = False) -> None:
        """``store_outside``: (plain ranks) the job's store is hosted by a process of its own,
        for at most 300 s, the ranks its clients (``TORCHELASTIC_USE_AGENT_STORE``)."""
        self.folder = folder
        self.world = world
        folder.mkdir(parents=True, exist_ok=True)
        base = {**os.environ, "SCENARIO_DIR": str(folder), "PYTHONUNBUFFERED": "1",
                **(env or {})}
        self.procs: list[subprocess.Popen[str]] = []
        self.procs_beside: list[subprocess.Popen[str]] = []  # a store host
        self.launcher: subprocess.Popen[str] | None = None
        self.started = time.monotonic()
        self._scenario = scenario
        self._rank_envs: list[dict[str, str]] = []
        if launcher == "plain":
            port = str(free_port())
            if store_outside:
                base["TORCHELASTIC_USE_AGENT_STORE"] = "True"
                self.procs_beside.append(self._start([sys.executable, "-c", STORE_HOST, port],
                                                     base))
            for rank in range(world):
                rank_env = {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                            "RANK": str(rank), "LOCAL_RANK": str(rank),
                            "WORLD_SIZE": str(world)}
                self._rank_envs.append(rank_env)
                self.procs.append(self._start([sys.executable, SCENARIOS, scenario], rank_env))
            return
        if launcher == "torchrun":
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
                   "--master-port", str(free_port()), *launcher_args, SCENARIOS, scenario]
        else:
            cmd = [sys.executable, "-m", "rankguard.cli", "run", "--nproc-per-node", str(world),
                   "--master-port", "0", "--log-dir", str(folder / "logs"), *launcher_args,
                   SCENARIOS, scenario]
        self.launcher = self._start(cmd, base)

    @staticmethod
    def _start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=str(ROOT), env=env, start_new_session=True)

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pid(self, rank: int, mark: str = "ready", timeout: float = 30.0) -> int:
        """The pid rank ``rank`` wrote once it reached ``mark``."""
        return int(self._await_file(f"{mark}_{rank}", f"rank {rank} did not reach {mark!r}",
                                    timeout))

    def first_to_mark(self, mark: str, timeout: float = 30.0) -> int:
        """The rank that reached ``mark`` (the first found, where several did)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rank in range(self.world):
                if (self.folder / f"{mark}_{rank}").exists():
                    return rank
            if self.procs and all(proc.poll() is not None for proc in self.procs):
                break
            time.sleep(0.02)
        raise AssertionError(f"no rank reached {mark!r} within {timeout} s:\n{self.output()}")

    def result(self, rank: int, timeout: float = 30.0) -> dict[str, Any]:
        """What rank ``rank`` reported."""
        return json.loads(self._await_file(f"result_{rank}.json",
                                           f"rank {rank} reported nothing", timeout))

    def text(self, name: str, timeout: float = 30.0) -> str:
        """The text of ``name``, which the scenario writes (by a rename) into the folder."""
        return self._await_file(name, f"no {name!r} from the scenario", timeout)

    def _await_file(self, name: str, failure: str, timeout: float) -> str:
        """The text of ``name`` in the folder once it exists (written by a rename)."""
        path = self.folder / name
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"{failure} within {timeout} s:\n{self.output()}")
            if self.launcher is not None and self.launcher.poll() is not None:
                raise AssertionError(f"the launcher exited early:\n{self.output()}")
            if self.procs and all(proc.poll() is not None for proc in self.procs) \
                    and not path.exists():  # a scenario renames its file before it exits
                raise AssertionError(f"{failure}: every rank has exited:\n{self.output()}")
            time.sleep(0.02)
        return path.read_text()

    def replace(self, rank: int) -> None:
        """Start a replacement for plain rank ``rank`` (``RANKGUARD_REPLACING=1``): it joins
        the generation its survivors form. The old process is kept in ``procs`` for
        ``close()``; ``wait(rank)`` is the replacement's from now."""
        env = {**self._rank_envs[rank], "RANKGUARD_REPLACING": "1"}
        self.procs.append(self.procs[rank])
        self.procs[rank] = self._start([sys.executable, SCENARIOS, self._scenario], env)

    def wait(self, rank: int, timeout: float) -> int:
        """Exit code of plain rank ``rank`` (negative: the signal)."""
        return self.procs[rank].wait(timeout)

    def wait_launcher(self, timeout: float) -> int:
        assert self.launcher is not None
        return self.launcher.wait(timeout)

    def output(self) -> str:
        """What the processes printed so far (only once they have exited), and the results
        the ranks reported (a failing wait for one rank shows what the others saw)."""
        texts = []
        for proc in [*self.procs, *([self.launcher] if self.launcher else [])]:
            if proc.poll() is not None and proc.stderr is not None and not proc.stderr.closed:
                out, err = proc.communicate()
                texts.append(f"--- pid {proc.pid} exit {proc.returncode}\n{out}{err}")
        for path in sorted(self.folder.glob("result_*.json")):
            texts.append(f"--- {path.name}: {path.read_text()}")
        return "\n".join(texts)

    def stderr(self, rank: int) -> str:
        proc = self.procs[rank]
        assert proc.poll() is not None
        return proc.communicate()[1] if proc.stderr and not proc.stderr.closed else ""

    def close(self) -> None:
        for proc in [*self.procs, *([self.launcher] if self.launcher else []),
                     *self.procs_beside]:
            if proc.poll() is None:
                proctree.signal_tree(proc.pid, signal.SIGKILL)
                proctree.signal_tree(proc.pid, signal.SIGCONT)
            try:
                proc.communicate(timeout=10)
            except (subprocess.TimeoutExpired, ValueError):
                pass
