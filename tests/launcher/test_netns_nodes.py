"""Nodes in network namespaces of their own (``netns``): each agent and its ranks see only their
node's address, the job's store is on node 0's, and every byte between nodes crosses a veth
link and a bridge, which a test can cut. Skipped where namespaces cannot be made."""

from __future__ import annotations

import time

import pytest

from tests.conftest import launch, script
from tests.launcher import netns
from tests.launcher.test_multinode import (GRACE_S, JOIN_S, _await_output, _await_rounds,
                                           _envs, _error, _finish_all, _kill_all, _teardown_s)

PORT = 29400  # each namespace has ports of its own: nothing else listens there


def _start(tmp_path, net: list[netns.Node], args: list[str], steps: int,
           nnodes: str | None = None):
    """One agent per namespace node (``--nnodes nnodes``, default one per node), node_env.py
    doing ``steps`` steps of 20 ms."""
    common = ["--nnodes", nnodes or str(len(net)), "--rdzv-backend", "c10d", "--rdzv-endpoint",
              f"{net[0].address}:{PORT}", "--rdzv-id", "nsjob", "--rdzv-conf",
              f"join_timeout={JOIN_S},close_timeout=10", "--nproc-per-node", "2", "--grace",
              str(GRACE_S)]
    return [(launch([*common, "--local-addr", node.address, *args, script("node_env.py"),
                     str(steps), "0.02"], tmp_path / f"node{i}", wrap=node.wrap(),
                    env={"GLOO_SOCKET_IFNAME": netns.IFNAME}), tmp_path / f"node{i}")
            for i, node in enumerate(net)]


@pytest.mark.slow
@pytest.mark.deadline(180)
def test_two_namespace_nodes_run_one_job_across_the_link(tmp_path):
    with netns.nodes(2) as net:
        runs = _finish_all(_start(tmp_path, net, [], steps=20), 120)
    assert [run.code for run in runs] == [0, 0], _error(runs)
    envs = _envs(runs)
    assert sorted(envs) == [0, 1, 2, 3]
    assert {env["MASTER_ADDR"] for env in envs.values()} == {net[0].address}
    assert [runs[0].event("run_start")["store_host"], runs[1].event("run_start")["store_host"]] \
        == [True, False]


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_a_partitioned_node_is_named_by_the_other_and_each_side_ends_bounded(tmp_path):
    """Node 1's link goes down mid-job (no reset reaches anyone): node 0, the store's host,
    names node 1 silent; node 1 names the store silent; both tear their ranks down and end
    within the hang timeout plus their teardown."""
    hang_s = 3
    with netns.nodes(2) as net:
        procs = _start(tmp_path, net, ["--hang-timeout", str(hang_s)], steps=100000)
        try:
            _await_output(procs, "]:STEPPED", time.monotonic() + 120)
            netns.cut(net[1])
            runs = _finish_all(procs, _teardown_s(hang_s))
        finally:
            _kill_all(procs)
    assert [run.code for run in runs] == [1, 1], _error(runs)
    host, cut_off = (run.event("run_end")["root_cause"] for run in runs)
    assert host.startswith(f"node 1 (host {net[1].address}) has published no progress for "), host
    assert cut_off.startswith(f"the job's store at {net[0].address}:{PORT} has not answered for "
                              ), cut_off
    for run in runs:
        # from the cut: the silence (evidence only: up to a beat period before it), then teardown
        assert hang_s - 1 <= run.wall_s < _teardown_s(hang_s), run.wall_s
        assert set(run.outcomes().values()) <= {"victim", "ok"}, run.outcomes()


@pytest.mark.slow
@pytest.mark.deadline(300)
def test_a_hot_spare_node_takes_the_place_of_a_partitioned_one_and_the_job_succeeds(tmp_path):
    """Three namespace nodes for two places: the third waits as a standby. The link of the
    joined node that is not the store's host goes down; the next round forms with the spare in
    its place and the job succeeds; the cut-off node ends on its own (the store is silent)."""
    with netns.nodes(3) as net:
        procs = _start(tmp_path, net, ["--hang-timeout", "3", "--max-restarts", "1"], steps=300,
                       nnodes="2")
        try:
            joined = _await_rounds(procs, 2, time.monotonic() + 120)
            _await_output([procs[i] for i in joined], "]:STEPPED", time.monotonic() + 120)
            # never node 0: it hosts the store (it alone has the endpoint's address), whether
            # it joined or stands by
            cut_index = max(joined)
            (stayed,) = [i for i in joined if i != cut_index]
            (spare_index,) = [i for i in range(3) if i not in joined]
            netns.cut(net[cut_index])
            runs = _finish_all(procs, 150)
        finally:
            _kill_all(procs)
    codes = {i: run.code for i, run in enumerate(runs)}
    assert codes == {stayed: 0, spare_index: 0, cut_index: 1}, _error(runs)
    rounds = [(e["round"], e["group_world_size"]) for e in runs[spare_index].events
              if e["event"] == "rendezvous"]
    assert rounds == [(1, 2)], rounds
    restart = runs[stayed].event("restart")["root_cause"]
    assert f"(host {net[cut_index].address}) has published no progress" in restart, restart
