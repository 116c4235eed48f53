"""rankguard run vs torchrun across nodes: the same c10d rendezvous, the same script, one run.

    python bench/multinode_bench.py [--cap 60]

Two agents on this machine (127.0.0.1, two ranks each) form one job under each launcher, with
torch's dynamic rendezvous on the c10d backend (``--rdzv-backend c10d``, an endpoint on
127.0.0.1, ``--local-addr 127.0.0.1``). The script is bench/fault_worker.py (every rank writes its
pid and the time of its first all-reduce of each attempt). Times are from the fault:

- node SIGKILL: the bench kills one node's whole process tree (agent and ranks) once every rank
  has stepped; how long until every rank of the other node is gone;
- node wedge: the same with SIGSTOP (a frozen machine); how long until every rank of the other
  node is gone (torchrun waits for gloo's 30-minute timeout: the bench stops at ``--cap``);
- rank SIGKILL, restart: one rank kills itself at its 20th all-reduce; how long until every
  rank of the next attempt has completed its first all-reduce (``--max-restarts 1``);
- 10 restarts in a row: tests/scripts/restart_until.py, rank 1 failing in each of the first ten
  attempts; whether the eleventh runs to its end, and how long the whole took (the bench stops
  at three times ``--cap``).

Not measured here yet: a partition (it needs network namespaces, see
tests/launcher/netns.py) and a hot spare node. Every process a run started is killed at its end,
whatever happened (a stopped one too).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from launcher_bench import kill_marked, pids_alive, read_floats

from rankguard import proctree

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "fault_worker.py")
RESTARTER = os.path.join(HERE, "..", "tests", "scripts", "restart_until.py")
LAUNCHERS = ("torchrun", "rankguard")
NPROC = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def agent_cmd(which: str, port: int, restarts: int, log_dir: str, script: list[str]) -> list[str]:
    common = ["--nnodes", "2", f"--nproc-per-node={NPROC}", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"bench{port}",
              "--local-addr", "127.0.0.1", f"--max-restarts={restarts}"]
    if which == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *common, *script]
    return [sys.executable, "-m", "rankguard.cli", "run", *common, "--hang-timeout", "3",
            "--log-dir", log_dir, *script]


class Job:
    """Two agents of one job under one launcher, in a scratch folder of their own."""

    def __init__(self, which: str, restarts: int, script: list[str], env: dict[str, str]) -> None:
        self.dir = tempfile.mkdtemp(prefix=f"bench-mn-{which}-")
        port = _free_port()
        self.env = {**os.environ, "BENCH_DIR": self.dir, "OMP_NUM_THREADS": "1", **env}
        self.agents = [subprocess.Popen(
            agent_cmd(which, port, restarts, os.path.join(self.dir, f"logs{i}"), script),
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True) for i in range(2)]

    def rank_pids(self, attempt: int = 0) -> dict[int, int]:
        found = {}
        for rank in range(2 * NPROC):
            pids = read_floats(os.path.join(self.dir, f"pid.{rank}.{attempt}"))
            if pids:
                found[rank] = int(pids[0])
        return found

    def stepped(self, attempt: int, until: float) -> float | None:
        """When the last rank of ``attempt`` completed its first all-reduce (None: not by
        ``until``)."""
        while time.time() < until:
            steps = [read_floats(os.path.join(self.dir, f"step.{rank}.{attempt}"))
                     for rank in range(2 * NPROC)]
            if all(steps):
                return max(step[0] for step in steps)
            time.sleep(0.01)
        return None

    def wait(self, until: float) -> list[int | None]:
        codes = []
        for agent in self.agents:
            try:
                codes.append(agent.wait(timeout=max(0.1, until - time.time())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def close(self) -> None:
        for agent in self.agents:
            if agent.poll() is None:
                proctree.signal_tree(agent.pid, signal.SIGKILL)
            agent.wait()
        for pid in proctree.with_env("BENCH_DIR", self.dir):  # a stopped one: wake to die
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        kill_marked(self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)


def node_fault(which: str, sig: int, cap: float) -> str:
    """Signal one node's whole tree once every rank stepped; until the other node's ranks are
    all gone."""
    job = Job(which, 0, [WORKER], {"STEPS": "100000"})
    try:
        if job.stepped(0, time.time() + 120) is None:
            return "never started"
        pids = job.rank_pids()
        victim = job.agents[1]
        theirs = set(proctree.descendants(victim.pid))
        ours = [pid for pid in pids.values() if pid not in theirs]
        fault = time.time()
        proctree.signal_tree(victim.pid, sig)
        while pids_alive(ours) and time.time() - fault < cap:
            time.sleep(0.005)
        if pids_alive(ours):
            return f"> {cap:.0f} s (still running at the cap)"
        return f"{time.time() - fault:.2f} s"
    finally:
        job.close()


def rank_kill_restart(which: str, cap: float) -> str:
    job = Job(which, 1, [WORKER], {"FAULT": "kill", "FAULT_RANK": "1", "FAULT_AT": "20",
                                   "STEPS": "60"})
    try:
        until = time.time() + 120 + cap
        while not read_floats(os.path.join(job.dir, "fault.0")) and time.time() < until:
            time.sleep(0.005)
        faults = read_floats(os.path.join(job.dir, "fault.0"))
        if not faults:
            return "the fault never happened"
        first = job.stepped(1, faults[0] + cap)
        return f"{first - faults[0]:.2f} s" if first is not None else f"> {cap:.0f} s"
    finally:
        job.close()


def ten_restarts(which: str, cap: float) -> str:
    started = time.time()
    job = Job(which, 10, [RESTARTER, "10"], {})
    try:
        codes = job.wait(started + 3 * cap)
        took = time.time() - started
        if any(code is None for code in codes):
            ended = [code for code in codes if code is not None]
            return f"hung at {3 * cap:.0f} s" + (f" (one exit {ended[0]})" if ended else "")
        return (f"10/10 ok, {took:.1f} s" if codes == [0, 0] else
                f"failed (exit codes {codes}), {took:.1f} s")
    finally:
        job.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap", type=float, default=60.0,
                        help="the most seconds one measurement waits (torchrun's frozen node)")
    args = parser.parse_args()
    rows = [
        ("node SIGKILL -> other node's ranks gone", lambda w: node_fault(w, signal.SIGKILL,
                                                                          args.cap)),
        ("node SIGSTOP -> other node's ranks gone", lambda w: node_fault(w, signal.SIGSTOP,
                                                                          args.cap)),
        ("rank SIGKILL -> first all-reduce of the restart", lambda w: rank_kill_restart(
            w, args.cap)),
        ("10 restarts in a row", lambda w: ten_restarts(w, args.cap)),
    ]
    started = time.monotonic()
    print(f"2 nodes x {NPROC} ranks on 127.0.0.1, c10d rendezvous, one run each")
    print(f"{'':48} {'torchrun':>26} {'rankguard':>26}")
    for label, measure in rows:
        cells = [measure(which) for which in LAUNCHERS]
        print(f"{label:48} {cells[0]:>26} {cells[1]:>26}", flush=True)
    print(f"took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
