"""Several nodes meeting in a real etcd server (``--rdzv-backend etcd-v2``): torch's dynamic
rendezvous on its etcd backend, the job-wide keys in etcd, each round's traffic in a store that
the round's node 0 hosts. The point of etcd: the job survives the loss of any node, the first
one to start (which hosts the first round's store) included.

Each test starts its own etcd (``etcd_server``) and stops it; every agent's whole tree is
killed at the end."""

import signal
import time

import pytest

from rankguard.processes import proctree
from tests.conftest import Run, script
from tests.launcher.etcd_server import etcd_server
from tests.launcher.test_multinode import (_agents, _await_output, _await_rounds, _envs, _error,
                                           _finish_all, _kill_all, _run, _start_agents)


def _round_host(procs) -> int:
    """The index of the agent that is node 0 of the first round (its store's host)."""
    hosts = [i for i, (_, log_dir) in enumerate(procs)
             if any(e["event"] == "rendezvous" and e["group_rank"] == 0
                    for e in Run(0, "", "", 0.0, log_dir).events)]
    assert len(hosts) == 1
    return hosts[0]


@pytest.mark.slow
@pytest.mark.deadline(180)
def test_two_nodes_meet_in_etcd_and_their_ranks_use_node_0s_store(tmp_path):
    with etcd_server(tmp_path) as endpoint:
        runs, etcd_port = _agents(tmp_path, [script("node_env.py"), "3"], etcd=endpoint)
    assert [run.code for run in runs] == [0, 0], _error(runs)
    envs = _envs(runs)
    assert sorted(envs) == [0, 1, 2, 3], _error(runs)
    stores = {(env["MASTER_ADDR"], env["MASTER_PORT"]) for env in envs.values()}
    assert len(stores) == 1 and stores != {("127.0.0.1", str(etcd_port))}, stores
    for run in runs:
        start = run.event("run_start")
        assert (start["rdzv_backend"], start["store_host"]) == ("etcd-v2", False)
        assert run.event("round_end")["ok"] is True


@pytest.mark.slow
@pytest.mark.deadline(300)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_the_job_survives_the_loss_of_the_node_that_hosts_the_rounds_store(tmp_path, sig):
    """Three agents for two nodes: node 0 of the first round (the first to start, its store's
    host) is killed or frozen with its ranks; the other node names it, the standby takes its
    place in the next round, whose store the survivors host, and the job ends well."""
    with etcd_server(tmp_path) as endpoint:
        procs = _start_agents(tmp_path, ["--hang-timeout", "3", "--max-restarts", "1"], nodes=3,
                              nnodes="2", steps=300, etcd=endpoint)
        try:
            joined = _await_rounds(procs, 2, time.monotonic() + 120)
            _await_output([procs[i] for i in joined], "]:STEPPED", time.monotonic() + 120)
            lost = _round_host(procs)
            proctree.signal_tree(procs[lost][0].pid, sig)
            runs = _finish_all([p for i, p in enumerate(procs) if i != lost], 150)
        finally:
            _kill_all(procs)
    assert [run.code for run in runs] == [0, 0], _error(runs)
    survivor = next(run for run in runs if run.log_dir == procs[joined[joined[0] == lost]][1])
    cause = survivor.event("restart")["root_cause"]
    assert "node 0 of the round, which hosts its store, is lost" in cause, cause
    rounds = [(e["round"], e["group_world_size"]) for run in runs for e in run.events
              if e["event"] == "rendezvous"]
    assert sorted(rounds) == [(0, 2), (1, 2), (1, 2)], rounds


@pytest.mark.slow  # over 4 s here: out of the quick run
def test_an_etcd_endpoint_where_nothing_answers_is_a_bounded_join_failure_naming_it(tmp_path):
    from tests.launcher.etcd_server import require_etcd
    from tests.launcher.test_multinode import _free_port

    require_etcd()
    port = _free_port()
    started = time.monotonic()
    proc = _run(["--nnodes", "2", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint",
                 f"127.0.0.1:{port}", "--rdzv-id", "j", "--rdzv-conf", "join_timeout=2",
                 script("node_env.py")], tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"nothing answered at 127.0.0.1:{port} within join_timeout 2 s" in lines[0]
    assert time.monotonic() - started < 2 + 30  # + starting Python on a loaded machine


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_an_rdzv_id_used_again_after_its_job_ended_is_refused_not_a_false_success(tmp_path):
    """etcd outlives jobs: agents that come with the id of a job that ended there must not
    report that job's end as their own."""
    with etcd_server(tmp_path) as endpoint:
        first, _ = _agents(tmp_path / "first", [script("node_env.py"), "2"], etcd=endpoint)
        assert [run.code for run in first] == [0, 0], _error(first)
        again, _ = _agents(tmp_path / "again", [script("node_env.py"), "2"], etcd=endpoint)
    assert [run.code for run in again] == [1, 1], _error(again)
    for run in again:
        assert "has ended already in the store" in run.stderr, run.stderr[-2000:]
        assert "give each job a new --rdzv-id" in run.stderr
    assert not _envs(again)  # no rank ran
