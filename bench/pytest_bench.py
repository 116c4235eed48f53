"""rankguard's pytest plugin against pytest-timeout, on a suite of deliberately bad tests, and
the warm rank pool against spawning ranks in every test. One run, figures side by side.

    python bench/pytest_bench.py [--deadline 3] [--tests 20]

1. The bad suite of tests/testing (a test sleeping past its deadline, a child that never exits,
   a grandchild left running, a teardown that hangs after a failure, a fixture blocked on a
   dead child), each followed by a good test, under: pytest-timeout's signal method,
   pytest-timeout's thread method, and this plugin. For each: wall time until pytest ends (capped
   at --cap), its exit status, the processes it left behind (alive 1 s after pytest ended, or
   at the cap), how many of the 5 culprits' own stack frames are in its report, and how many
   of the 5 good tests ran and passed.
2. --tests small distributed tests (one all_reduce on 2 ranks): on the plugin's warm pool
   (``@pytest.mark.ranks(2)``) vs. ``torch.multiprocessing.spawn`` of 2 ranks inside each test.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from rankguard.processes import proctree  # noqa: E402
from tests.testing import test_plugin_deadlines_and_leaks as bad  # noqa: E402

MARK = "RANKGUARD_BENCH_TAG"
SUITE = {"test_sleeps.py": bad.SLEEPS, "test_child.py": bad.CHILD_NEVER_EXITS,
         "test_grandchild.py": bad.GRANDCHILD, "test_teardown.py": bad.TEARDOWN_HANGS,
         "test_dead_child.py": bad.DEAD_CHILD}
CULPRITS = ["in test_sleeps_in_call", "in child_main", "sleep 1000", "in resource", "in answer"]

POOLED = '''
import pytest, torch, torch.distributed as dist

@pytest.mark.parametrize("i", range({n}))
@pytest.mark.ranks(2)
def test_small(i):
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == 2
'''

SPAWNED = '''
import os, socket
import pytest, torch, torch.distributed as dist, torch.multiprocessing as mp

def body(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank,
                            world_size=2)
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t[0].item() == 2
    dist.destroy_process_group()

@pytest.mark.parametrize("i", range({n}))
def test_small(i):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(body, args=(port,), nprocs=2, join=True)
'''


def run_session(files: dict[str, str], args: list[str], cap: float) -> dict:
    folder = tempfile.mkdtemp(prefix="bench-pytest-")
    for name, body in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(textwrap.dedent(body))
    tag = uuid.uuid4().hex
    env = {**os.environ, MARK: tag}
    log_path = os.path.join(folder, "output.txt")
    started = time.monotonic()
    with open(log_path, "w") as log:  # a file, not a pipe: an orphan holding it must not matter
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-rA",
                                 "-p", "no:cacheprovider", *args, folder], cwd=folder, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: object = proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            code = f"none (killed at {cap:g} s)"
    wall = time.monotonic() - started
    time.sleep(1.0)
    left = [pid for pid in proctree.with_env(MARK, tag) if pid != proc.pid]
    proctree.signal_tree(proc.pid, 9)
    proctree.kill_all(left)
    proc.wait(10)
    with open(log_path, errors="replace") as f:
        out = f.read()
    return {"wall": wall, "code": code, "left": len(left), "out": out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deadline", type=float, default=3.0)
    p.add_argument("--tests", type=int, default=20)
    p.add_argument("--cap", type=float, default=180.0)
    a = p.parse_args()
    d = str(a.deadline)
    variants = {
        "pytest-timeout (signal)": ["-p", "no:rankguard", "-o", f"timeout={d}",
                                    "-o", "timeout_method=signal"],
        "pytest-timeout (thread)": ["-p", "no:rankguard", "-o", f"timeout={d}",
                                    "-o", "timeout_method=thread"],
        "rankguard plugin": ["-p", "no:timeout", "--rankguard-deadline", d],
    }
    print(f"bad suite: 5 bad tests, each followed by a good one; deadline {d} s")
    print(f"{'':26} {'wall':>8} {'exit':>22} {'left':>5} {'culprit stacks':>15} {'good ok':>8}")
    for name, args in variants.items():
        r = run_session(SUITE, args, a.cap)
        culprits = sum(c in r["out"] for c in CULPRITS)
        good = len(re.findall(r"PASSED \S+::test_good_after", r["out"]))
        print(f"{name:26} {r['wall']:7.1f}s {str(r['code']):>22} {r['left']:>5} "
              f"{culprits:>13}/5 {good:>6}/5")
    n = a.tests
    pooled = run_session({"test_pooled.py": POOLED.format(n=n)}, ["-p", "no:timeout"], a.cap)
    spawned = run_session({"test_spawned.py": SPAWNED.format(n=n)}, ["-p", "no:timeout"],
                          max(a.cap, 30.0 * n))
    print(f"\n{n} small distributed tests (2 ranks, one all_reduce each), whole session:")
    print(f"{'warm pool (@pytest.mark.ranks)':40} {pooled['wall']:7.1f}s  "
          f"{pooled['wall'] / n * 1000:6.0f} ms/test  exit {pooled['code']}")
    print(f"{'torch.multiprocessing.spawn per test':40} {spawned['wall']:7.1f}s  "
          f"{spawned['wall'] / n * 1000:6.0f} ms/test  exit {spawned['code']}  "
          f"({spawned['wall'] / pooled['wall']:.1f}x)")


if __name__ == "__main__":
    main()
