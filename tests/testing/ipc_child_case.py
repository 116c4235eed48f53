"""The cuda-python case, for the CPU (tests/testing) and a GPU (tests/gpu): a test spawns a
child (torch.multiprocessing, the spawn context) that receives the parent's tensor (shared
memory on the CPU, a CUDA IPC handle on a GPU) and wedges holding it; the parent's join times
out, then its cleanup joins the child for good. The plugin must name the child, end it before
the parent blocks for good, and go on with the session."""

from __future__ import annotations

from pathlib import Path

from tests.testing.suite import Session, run_suite

SUITE = '''
import os
import time

import torch
import torch.multiprocessing as mp

DEVICE = os.environ["SUITE_DEVICE"]


def child_main(queue):
    shared = queue.get()  # the parent's memory (a CUDA IPC handle on a GPU)
    assert shared.sum().item() == 4
    time.sleep(1000)  # wedged, holding it


def test_a_child_holding_the_parents_tensor_wedges():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=child_main, args=(queue,))
    child.start()
    tensor = torch.ones(4, device=DEVICE)
    queue.put(tensor)
    try:
        child.join(timeout=2)
        assert not child.is_alive(), "the child did not end within 2 s"
    finally:
        child.join()  # the cleanup: waits for the child for good
        del tensor


def test_good_after():
    assert 1 + 1 == 2
'''

TEST = "test_a_child_holding_the_parents_tensor_wedges"


def run(tmp_path: Path, device: str, deadline: float, env: dict[str, str] | None = None
        ) -> Session:
    return run_suite(tmp_path, {"test_ipc.py": SUITE}, ["--rankguard-deadline", f"{deadline:g}"],
                     timeout=deadline * 3 + 60, env={**(env or {}), "SUITE_DEVICE": device})


def check_named_released_and_the_session_goes_on(session: Session) -> None:
    assert session.result(TEST) == "failed", session.output
    text = session.text(TEST)
    assert "in join" in text or "in poll" in text or "in wait" in text, text  # the parent
    assert "spawn_main" in text, text  # the child, by its command line
    assert "released: SIGTERM to 1 process(es) of the test" in text, text
    assert session.result("test_good_after") == "passed", session.output
