"""Several nodes with a static rendezvous (``--nnodes N --node-rank R``, torchrun's default):
real agents on 127.0.0.1, node 0 hosting the job's store at ``--master-addr:--master-port``,
each given its rank. Every agent's whole tree is killed at the end."""

import signal
import time

import pytest

from rankguard.processes import proctree
from tests.conftest import launch, script
from tests.launcher.test_multinode import (GRACE_S, JOIN_S, _await_output, _envs, _error,
                                           _finish_all, _free_port, _kill_all)


def _static_agents(tmp_path, args, steps="4", delay="0.0"):
    """Start node 1 first, then node 0 (its store's host): node 1 waits for the store."""
    port = _free_port()
    common = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
              "--nproc-per-node", "2", "--grace", str(GRACE_S), "--rdzv-conf",
              f"join_timeout={JOIN_S},close_timeout=10", *args]
    return [(launch([*common, "--node-rank", str(node), script("node_env.py"), steps, delay],
                    tmp_path / f"node{node}"), tmp_path / f"node{node}") for node in (1, 0)]


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_static_nodes_keep_their_given_ranks_and_restart_together(tmp_path):
    procs = _static_agents(tmp_path, ["--max-restarts", "1", "--inject",
                                      "crash:5:rank=1,at=op2"])
    runs = _finish_all(procs, 200)
    assert [run.code for run in runs] == [0, 0], _error(runs)
    envs = _envs(runs)
    assert sorted(envs) == [0, 1, 2, 3], _error(runs)
    for rank, env in envs.items():
        assert env["GROUP_RANK"] == str(rank // 2) and env["dist_world"] == 4
        assert env["TORCHELASTIC_RESTART_COUNT"] == "1"
    for node, run in zip((1, 0), runs):
        rounds = [(e["round"], e["group_rank"]) for e in run.events if e["event"] == "rendezvous"]
        assert rounds == [(0, node), (1, node)], rounds
        assert "rank 1 exited with code 5" in run.event("restart")["root_cause"]
        assert run.event("run_start")["rdzv_backend"] == "static"


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_a_static_node_killed_ends_the_job_on_the_other_without_a_restart(tmp_path):
    """A static round can never fill without the lost node: the other node ends at once
    (with restarts left), naming it, instead of waiting join_timeout for it."""
    procs = _static_agents(tmp_path, ["--max-restarts", "3", "--hang-timeout", "3"],
                           steps="100000", delay="0.02")
    try:
        _await_output(procs, "]:STEPPED", time.monotonic() + 120)
        proctree.signal_tree(procs[0][0].pid, signal.SIGKILL)  # node 1
        (other,) = _finish_all([procs[1]], 90)
    finally:
        _kill_all(procs)
    assert other.code == 1, _error([other])
    root = other.event("run_end")["root_cause"]
    assert root.startswith("node 1 (host ") and "has published no progress" in root, root
    assert not [e for e in other.events if e["event"] == "restart"]
    assert other.wall_s < JOIN_S, other.wall_s


@pytest.mark.slow  # its join_timeout
def test_a_static_node_0_whose_peer_never_comes_names_it_after_join_timeout(tmp_path):
    port = _free_port()
    join = 3
    started = time.monotonic()
    proc = launch(["--nnodes", "2", "--master-port", str(port), "--node-rank", "0",
                   "--rdzv-conf", f"join_timeout={join}", script("node_env.py")], tmp_path)
    (run,) = _finish_all([(proc, tmp_path)], 90)
    assert run.code == 1, _error([run])
    assert f"within join_timeout {join} s: node(s) 1 never came" in run.stderr, run.stderr
    assert "/rankguard/" not in run.stderr  # no store keys in the message
    assert join <= time.monotonic() - started < join + 30


@pytest.mark.slow
@pytest.mark.deadline(180)
def test_two_agents_with_one_static_node_rank_the_second_is_refused_naming_it(tmp_path):
    port = _free_port()
    common = ["--nnodes", "2", "--master-port", str(port), "--nproc-per-node", "1",
              "--rdzv-conf", f"join_timeout={JOIN_S}"]
    procs = [(launch([*common, "--node-rank", str(node), script("node_env.py"), "3"],
                     tmp_path / f"agent{index}"), tmp_path / f"agent{index}")
             for index, node in enumerate((0, 1, 1))]
    runs = _finish_all(procs, 120)
    codes = sorted(run.code for run in runs)
    assert codes == [0, 0, 1], _error(runs)
    refused = next(run for run in runs if run.code == 1)
    assert "another agent of this job has --node-rank 1" in refused.stderr, refused.stderr
