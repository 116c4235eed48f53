"""rankguard run vs torchrun across nodes: the same c10d rendezvous, the same script, one run.

    python bench/multinode_bench.py [--cap 60]

Two agents on this machine (127.0.0.1, two ranks each) form one job under each launcher, with
torch's dynamic rendezvous on the c10d backend (``--rdzv-backend c10d``, an endpoint on
127.0.0.1, ``--local-addr 127.0.0.1``); for the partition, each agent runs in a network
namespace of its own (tests/launcher/netns.py: root only, else the row says why not). The script is bench/fault_worker.py (every rank writes its
pid and the time of its first all-reduce of each attempt). Times are from the fault:

- node SIGKILL: the bench kills one node's whole process tree (agent and ranks) once every rank
  has stepped; how long until every rank of the other node is gone;
- node wedge: the same with SIGSTOP (a frozen machine); how long until every rank of the other
  node is gone (torchrun waits for gloo's 30-minute timeout: the bench stops at ``--cap``);
- rank SIGSTOP: one rank of node 1 is stopped while the ranks all-reduce; how long until every
  rank of node 0 is gone (rankguard names it on its own node and ends the round everywhere;
  torchrun waits for gloo's timeout: the bench stops at ``--cap``);
- node partition: node 1's link to the bridge goes down (nothing crosses, no reset is sent);
  how long until every rank of node 0 (the store's host) is gone;
- node SIGKILL, next round: ``--max-restarts 1``; the node that does not host the store is
  killed with its ranks; how long until every rank of the next round has completed its first
  all-reduce, with a hot spare (a third agent, ``--nnodes 2``) taking its place, and without
  one (``--nnodes 1:2``: the survivor goes on alone);
- rank SIGKILL, restart: one rank kills itself at its 20th all-reduce; how long until every
  rank of the next attempt has completed its first all-reduce (``--max-restarts 1``);
- 10 restarts in a row: tests/scripts/restart_until.py, rank 1 failing in each of the first ten
  attempts; whether the eleventh runs to its end, and how long the whole took (the bench stops
  at three times ``--cap``).

Every process a run started is killed at its end, whatever happened (a stopped one too).
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

import psutil
import pytest
from launcher_bench import kill_marked, pids_alive, read_floats

from rankguard.processes import proctree

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tests.launcher import netns  # noqa: E402  (the namespace nodes of the tests)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "fault_worker.py")
RESTARTER = os.path.join(HERE, "..", "tests", "scripts", "restart_until.py")
LAUNCHERS = ("torchrun", "rankguard")
NPROC = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def agent_cmd(which: str, endpoint: str, local: str, restarts: int, log_dir: str,
              script: list[str], nnodes: str = "2", conf: str = "") -> list[str]:
    common = ["--nnodes", nnodes, f"--nproc-per-node={NPROC}", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", endpoint, "--rdzv-id", "bench", "--local-addr", local,
              f"--max-restarts={restarts}", *(["--rdzv-conf", conf] if conf else [])]
    if which == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *common, *script]
    return [sys.executable, "-m", "rankguard.cli", "run", *common, "--hang-timeout", "3",
            "--log-dir", log_dir, *script]


class Job:
    """The agents of one job under one launcher, in a scratch folder of their own: ``agents``
    of them on 127.0.0.1, or one in each namespace node of ``net``."""

    def __init__(self, which: str, restarts: int, script: list[str], env: dict[str, str],
                 agents: int = 2, nnodes: str = "2", net: list | None = None,
                 conf: str = "") -> None:
        self.dir = tempfile.mkdtemp(prefix=f"bench-mn-{which}-")
        self.port = 29400 if net else _free_port()  # each namespace has ports of its own
        endpoint = f"{net[0].address if net else '127.0.0.1'}:{self.port}"
        self.env = {**os.environ, "BENCH_DIR": self.dir, "OMP_NUM_THREADS": "1", **env}
        if net:
            self.env["GLOO_SOCKET_IFNAME"] = netns.IFNAME
        self.agents = [subprocess.Popen(
            [*(net[i].wrap() if net else []),
             *agent_cmd(which, endpoint, net[i].address if net else "127.0.0.1", restarts,
                        os.path.join(self.dir, f"logs{i}"), script, nnodes,
                        _conf(conf, which, i, net))],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True) for i in range(len(net) if net else agents)]

    def store_host(self) -> int:
        """The index of the agent that listens on the store's port."""
        listening = {conn.pid for conn in psutil.net_connections("tcp")
                     if conn.status == psutil.CONN_LISTEN and conn.laddr.port == self.port}
        for index, agent in enumerate(self.agents):
            if agent.pid in listening:
                return index
        raise RuntimeError("no agent hosts the store")

    def joined(self) -> list[int]:
        """The indexes of the agents whose trees hold ranks of attempt 0."""
        pids = set(self.rank_pids().values())
        return [index for index, agent in enumerate(self.agents)
                if pids & set(proctree.descendants(agent.pid))]

    def stepped_after(self, since: float, ranks: int, until: float) -> float | None:
        """When the last of ranks 0 to ``ranks - 1`` completed a first all-reduce after
        ``since`` (in any attempt: a spare's ranks count their attempts from 0)."""
        while time.time() < until:
            firsts = []
            for rank in range(ranks):
                after = [t for t in read_floats(os.path.join(self.dir, f"step.{rank}.*"))
                         if t > since]
                if not after:
                    break
                firsts.append(min(after))
            else:
                return max(firsts)
            time.sleep(0.01)
        return None

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


def _conf(conf: str, which: str, index: int, net: list | None) -> str:
    """``--rdzv-conf`` of agent ``index``: torchrun finds the store's host by its hostname's
    addresses, which a namespace node's address is not: it is told (``is_host``); rankguard
    hosts the store where the endpoint can be bound."""
    if net and which == "torchrun":
        conf = ",".join(filter(None, [conf, f"is_host={int(index == 0)}"]))
    return conf


# The rendezvous settings of the next-round rows, the same under both launchers: torch's
# defaults would keep a lost node in the round for 15 s and wait 30 s for more nodes.
NEXT_ROUND_CONF = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"


def _until_gone(job: Job, survivor: int, fault, cap: float) -> str:
    """Once every rank stepped, ``fault()``; how long until every rank of agent ``survivor``
    is gone."""
    if job.stepped(0, time.time() + 120) is None:
        return "never started"
    theirs = set(proctree.descendants(job.agents[survivor].pid))
    ours = [pid for pid in job.rank_pids().values() if pid in theirs]
    started = time.time()
    fault()
    while pids_alive(ours) and time.time() - started < cap:
        time.sleep(0.005)
    if pids_alive(ours):
        return f"> {cap:.0f} s (still running at the cap)"
    return f"{time.time() - started:.2f} s"


def node_fault(which: str, sig: int, cap: float) -> str:
    """Signal node 1's whole tree; until node 0's ranks are all gone."""
    job = Job(which, 0, [WORKER], {"STEPS": "100000"})
    try:
        return _until_gone(job, 0, lambda: proctree.signal_tree(job.agents[1].pid, sig), cap)
    finally:
        job.close()


def rank_stop(which: str, cap: float) -> str:
    """SIGSTOP one rank of node 1 (in the middle of its all-reduces); until node 0's ranks are
    all gone (rankguard: --hang-timeout 3; node 0 hears the verdict from node 1)."""
    job = Job(which, 0, [WORKER], {"STEPS": "100000"})

    def stop_a_rank_of_node_1() -> None:
        theirs = set(proctree.descendants(job.agents[1].pid))
        os.kill(next(pid for pid in job.rank_pids().values() if pid in theirs), signal.SIGSTOP)

    try:
        return _until_gone(job, 0, stop_a_rank_of_node_1, cap)
    finally:
        job.close()


def partition(which: str, cap: float) -> str:
    """Cut node 1's link; until node 0's ranks are all gone."""
    try:
        with netns.nodes(2) as net:
            job = Job(which, 0, [WORKER], {"STEPS": "100000"}, net=net)
            try:
                return _until_gone(job, 0, lambda: netns.cut(net[1]), cap)
            finally:
                job.close()
    except pytest.skip.Exception as exc:
        return f"not measured: {exc.msg}"


def node_loss_next_round(which: str, spare: bool, cap: float) -> str:
    """Kill the joined node that does not host the store, with its ranks; until every rank of
    the next round has stepped (2 nodes with a spare, the survivor alone without)."""
    job = Job(which, 1, [WORKER], {"STEPS": "100000"}, agents=3 if spare else 2,
              nnodes="2" if spare else "1:2", conf=NEXT_ROUND_CONF)
    try:
        if job.stepped(0, time.time() + 120) is None:
            return "never started"
        host = job.store_host()
        victim = next(index for index in job.joined() if index != host)
        fault = time.time()
        proctree.signal_tree(job.agents[victim].pid, signal.SIGKILL)
        first = job.stepped_after(fault, 2 * NPROC if spare else NPROC, fault + cap)
        return f"{first - fault:.2f} s" if first is not None else f"> {cap:.0f} s"
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
    parser.add_argument("--rows", default="",
                        help="only these rows, by number from 1, e.g. --rows 3,4 (default all)")
    args = parser.parse_args()
    rows = [
        ("node SIGKILL -> other node's ranks gone", lambda w: node_fault(w, signal.SIGKILL,
                                                                          args.cap)),
        ("node SIGSTOP -> other node's ranks gone", lambda w: node_fault(w, signal.SIGSTOP,
                                                                          args.cap)),
        ("node partition -> store host's ranks gone", lambda w: partition(w, args.cap)),
        ("rank SIGSTOP on node 1 -> node 0's ranks gone", lambda w: rank_stop(w, args.cap)),
        ("node SIGKILL -> next round's 1st all-reduce, hot spare",
         lambda w: node_loss_next_round(w, True, args.cap)),
        ("node SIGKILL -> next round's 1st all-reduce, no spare",
         lambda w: node_loss_next_round(w, False, args.cap)),
        ("rank SIGKILL -> first all-reduce of the restart", lambda w: rank_kill_restart(
            w, args.cap)),
        ("10 restarts in a row", lambda w: ten_restarts(w, args.cap)),
    ]
    if args.rows:
        rows = [rows[int(number) - 1] for number in args.rows.split(",")]
    started = time.monotonic()
    print(f"2 nodes x {NPROC} ranks on 127.0.0.1, c10d rendezvous, one run each")
    print(f"{'':56} {'torchrun':>26} {'rankguard':>26}")
    for label, measure in rows:
        cells = [measure(which) for which in LAUNCHERS]
        print(f"{label:56} {cells[0]:>26} {cells[1]:>26}", flush=True)
    print(f"took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
