"""A pool whose process is SIGKILLed leaves nothing behind: its guardian kills every process the
pool started (the zygote, the ranks of every replica, what they started, detached or forked)
and removes the pool's temporary log folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from rankguard.processes import proctree
from rankguard.serving.pool import MARKER
from rankguard.supervisor.guardian import SWEEP_S

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GONE_WITHIN_S = SWEEP_S + 10.0  # the guardian's sweeps, on a loaded machine

LEADER = textwrap.dedent(f"""
    import json, sys
    import rankguard
    from tests.serving import rank_functions as rf
    pool = rankguard.Pool(2, rf.load, spares=1, timeout=30.0)
    started = [pid for pids in pool.run(rf.start_sleepers, all_ranks=True) for pid in pids]
    started += pool.run(rf.fork_sleeper, all_ranks=True) + pool.run(rf.pid, all_ranks=True)
    token = pool.run(rf.environ, [{MARKER!r}])[{MARKER!r}]
    print(json.dumps({{"started": started, "token": token, "log_dir": pool.log_dir}}),
          flush=True)
    sys.stdin.read()  # until the test kills this process
""")


@pytest.mark.slow
@pytest.mark.deadline(150)
def test_a_pool_whose_process_is_sigkilled_leaves_no_process_and_no_folder() -> None:
    leader = subprocess.Popen([sys.executable, "-c", LEADER], cwd=REPO, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    marked: list[int] = []
    try:
        assert leader.stdout is not None
        line = leader.stdout.readline()
        assert line, "the leader printed nothing"
        found = json.loads(line)
        marked = proctree.with_env(MARKER, found["token"])
        assert set(found["started"]) <= set(marked), (found["started"], marked)
        assert os.path.isdir(found["log_dir"])
        leader.kill()
        leader.wait(timeout=10)
        deadline = time.monotonic() + GONE_WITHIN_S
        # a killed process still exiting no longer shows its environment: wait for both
        while (proctree.with_env(MARKER, found["token"])
               or any(proctree.alive(pid) for pid in found["started"])) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        left = proctree.with_env(MARKER, found["token"])
        assert not left, [proctree.describe(pid) for pid in left]
        assert not [pid for pid in found["started"] if proctree.alive(pid)]
        while os.path.exists(found["log_dir"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(found["log_dir"])
    finally:
        if leader.poll() is None:
            leader.kill()
        leader.wait(timeout=10)
        proctree.kill_all(marked)
        for stream in (leader.stdin, leader.stdout):
            if stream is not None:
                stream.close()
