"""Bad arguments to the public runtime API get a UsageError that names them; calls that have
nothing to act on do nothing, cleanly."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

import rankguard
from rankguard.deadline import Deadline
from rankguard.runtime import deadline_scope as deadline_module


# 1e10: past ~9.2e9 s gloo's timeout overflowed and a collective failed at once or hung for good
@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf"), "soon", "1", None, 1e10,
                                     True])
def test_deadline_refuses_anything_but_a_positive_number_of_seconds(seconds: object) -> None:
    with pytest.raises(rankguard.UsageError, match=r"rankguard.deadline\(seconds\)"):
        with rankguard.deadline(seconds):  # type: ignore[arg-type]
            pass


def test_nested_deadlines_keep_the_earliest_and_restore_the_outer_one() -> None:
    with rankguard.deadline(5) as outer:
        with rankguard.deadline(60) as inner:
            assert inner is outer
            assert deadline_module.current() is outer
        with rankguard.deadline(1) as tighter:
            assert tighter.at < outer.at
            assert deadline_module.current() is tighter
        assert deadline_module.current() is outer
    assert deadline_module.current() is None


def test_a_deadline_made_elsewhere_bounds_the_block_unless_an_outer_one_is_earlier() -> None:
    made = Deadline.after(30)  # as a leader makes it and a rank receives it
    with deadline_module.until(made) as limit:
        assert limit is made and deadline_module.current() is made
    with rankguard.deadline(5) as outer:
        with deadline_module.until(made) as limit:
            assert limit is outer
        with deadline_module.until(Deadline.after(1)) as limit:
            assert limit.at < outer.at and deadline_module.current() is limit
        assert deadline_module.current() is outer
    assert deadline_module.current() is None


def test_init_from_another_thread_than_main_is_refused() -> None:
    errors: list[BaseException] = []

    def call() -> None:
        try:
            rankguard.init()
        except rankguard.UsageError as error:
            errors.append(error)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(30)
    assert len(errors) == 1 and "main thread" in str(errors[0])


CHECKS = """
import rankguard
report = rankguard.shutdown(timeout=1)
print("shutdown", report.clean, report.missing)
for call in (lambda: rankguard.shutdown(timeout=0), lambda: rankguard.regroup(),
             lambda: rankguard.init(grace=-2), lambda: rankguard.init(collective_timeout="x"),
             lambda: rankguard.shutdown(timeout="3"), lambda: rankguard.init(grace="2"),
             lambda: rankguard.init(stacks_file=1)):
    try:
        call()
    except rankguard.UsageError as error:
        print("usage", error)
"""


def test_shutdown_without_a_group_is_clean_and_bad_calls_name_their_argument() -> None:
    proc = _script(CHECKS)
    lines = proc.stdout.splitlines()
    assert lines[0] == "shutdown True []"
    assert "rankguard.shutdown(timeout)" in lines[1]
    assert "rankguard.regroup(): there is no process group" in lines[2]
    assert lines[3].startswith("usage grace:") and lines[4].startswith("usage collective_timeout:")
    # seconds given in Python are numbers: text is refused (as Pool and the plugin refuse it)
    assert lines[5].startswith("usage rankguard.shutdown(timeout):") and "'3'" in lines[5]
    assert lines[6].startswith("usage grace:") and "'2'" in lines[6]
    # an int was taken as a file descriptor: stdout here, closed by the next init(stacks_file=)
    assert lines[7] == ("usage stacks_file: expected a path, got 1 (give the file's path as a "
                        "str, or leave it out)"), proc.stdout


def _script(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c code args`` under a minute; it must exit 0."""
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc


def _no_state() -> dict:
    return {}


class _Stateful:
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def _wraps_one_module_twice() -> None:
    import torch

    loop, model = rankguard.StepLoop(_no_state, print), torch.nn.Linear(2, 2)
    loop.ddp(model)
    loop.ddp(model)


@pytest.mark.parametrize("make, fragment", [
    (lambda: rankguard.StepLoop(None, None), "get_state and load_state must be callables"),
    (lambda: rankguard.StepLoop(_no_state, print, regroup_timeout=-1), "regroup_timeout"),
    (lambda: rankguard.StepLoop(_no_state, print, share_timeout=float("nan")), "share_timeout"),
    (lambda: rankguard.StepLoop(_no_state, print, max_recoveries=True), "max_recoveries"),
    (lambda: rankguard.StepLoop.of({"model": 3}), "'model' has no state_dict()"),
    # a module or a list was an AttributeError ('Linear' object has no attribute 'items'),
    # restarted like any script error; a class raised a TypeError at run()'s first get_state
    (lambda: rankguard.StepLoop.of(_Stateful()), "expected a dict of objects by name"),
    (lambda: rankguard.StepLoop.of([_Stateful()]), "expected a dict of objects by name"),
    (lambda: rankguard.StepLoop.of({"model": _Stateful}), "'model' is a class"),
    (lambda: rankguard.StepLoop(_no_state, print).run(print, 1.5), "StepLoop.run(steps)"),
    (lambda: rankguard.StepLoop(_no_state, print).run(print, -1), "StepLoop.run(steps)"),
    # these were a TypeError or an AttributeError from deep inside, restarted like any error
    (lambda: rankguard.StepLoop(_no_state, print).run(None, 3), "StepLoop.run(step_fn)"),
    (lambda: rankguard.StepLoop(_no_state, print).ddp("model"), "expected a torch.nn.Module"),
    # silently accepted: two DDPs on one module, each all-reducing its gradients
    (_wraps_one_module_twice, "wraps that module already"),
])
def test_step_loop_refuses_bad_arguments_before_any_collective(make: object,
                                                                fragment: str) -> None:
    with pytest.raises(rankguard.UsageError, match=fragment.replace("(", r"\(").replace(
            ")", r"\)")):
        make()  # type: ignore[operator]


def test_a_bad_replace_timeout_in_the_environment_is_a_usage_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANKGUARD_REPLACE_TIMEOUT", "soon")
    with pytest.raises(rankguard.UsageError, match="RANKGUARD_REPLACE_TIMEOUT"):
        rankguard.StepLoop(_no_state, print)


def test_a_step_loop_without_a_process_group_says_so() -> None:
    with pytest.raises(rankguard.UsageError, match="no process group"):
        rankguard.StepLoop(_no_state, print).run(print, 3)


def test_a_state_torch_cannot_save_is_named_as_get_states_fault() -> None:
    from rankguard.runtime import peer_state

    with pytest.raises(rankguard.UsageError, match=r"get_state\(\): the state cannot be sent"):
        peer_state._serialize({"model": lambda: None})


@pytest.mark.parametrize("thing, named", [
    (threading.Lock(), "cannot pickle '_thread.lock' object"),
    (object(), "Unsupported global: GLOBAL object was not an allowed global by default"),
])
def test_a_state_a_peer_cannot_load_is_refused_by_the_sender_in_one_line(
        thing: object, named: str) -> None:
    # an object() was saved and sent: the replacement died in torch's weights-only load
    from rankguard.runtime import peer_state

    with pytest.raises(rankguard.UsageError) as caught:
        peer_state._serialize({"model": {"weight": 1.0}, "extra": thing})
    assert "\n" not in str(caught.value) and named in str(caught.value), str(caught.value)
    assert str(caught.value).startswith("get_state(): the state cannot be sent to a peer")


UNSENDABLE = """
import sys
import torch, torch.distributed as dist
import rankguard

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
loop = rankguard.StepLoop(lambda: {"weight": torch.ones(2), "extra": object()}, print)
try:
    loop.run(lambda step: print("step", step), 3)
except rankguard.UsageError as error:
    print("usage", error)
"""


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_a_state_a_peer_could_not_load_is_refused_before_the_first_step(tmp_path: Path) -> None:
    # before, it was found at the first fault, when the run could no longer recover
    proc = _script(UNSENDABLE, str(tmp_path / "store"))
    assert proc.stdout.startswith("usage get_state(): the state cannot be sent to a peer "
                                  "(UnpicklingError: Unsupported global: GLOBAL "), proc.stdout
    assert "step" not in proc.stdout


LARGE = """
import resource
import torch
from rankguard.runtime import peer_state

state = {"model": {"weight": torch.empty(2**30, dtype=torch.uint8)}, "step": 3,
         "layers": [torch.nn.Parameter(torch.empty(2**28))], "sparse": torch.eye(3).to_sparse()}
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
peer_state.check_sendable(state)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_the_check_of_a_state_copies_no_tensors_data() -> None:
    # 2 GiB of tensors never touched: saving them would raise the peak memory by 2 GiB
    proc = _script(LARGE)
    assert int(proc.stdout) < 256, f"the peak memory grew by {proc.stdout.strip()} MiB"


def _tagged(tensor: object, tag: object) -> object:
    tensor.tag = tag  # type: ignore[attr-defined]
    return tensor


def _holding_itself() -> dict:
    state: dict = {"weight": 1.0}
    state["self"] = state
    return state


@pytest.mark.parametrize("make, sendable", [
    # a CSR tensor has no strides: its meta copy failed to save, and the run never started
    pytest.param(lambda torch: {"csr": torch.eye(3).to_sparse_csr()}, True, id="sparse CSR"),
    # pickle keeps a state that holds itself as one object; the check recursed until it broke
    pytest.param(lambda torch: _holding_itself(), True, id="a dict holding itself"),
    # a tensor's Python attributes travel with it: the check dropped them and passed an object
    pytest.param(lambda torch: {"weight": _tagged(torch.ones(2), object())}, False,
                 id="a tensor's attribute an object"),
    pytest.param(lambda torch: [_tagged(torch.nn.Parameter(torch.ones(2)), object())], False,
                 id="a parameter's attribute an object"),
    pytest.param(lambda torch: {"w": _tagged(torch.nn.Parameter(torch.ones(2)), "decay")}, True,
                 id="a parameter's attribute a string"),
])
@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")  # torch's own
def test_the_check_before_the_first_step_judges_a_state_as_its_transfer_would(
        make: object, sendable: bool) -> None:
    import torch
    from rankguard.runtime import peer_state

    state = make(torch)  # type: ignore[operator]
    try:
        peer_state._serialize(state)
    except rankguard.UsageError:
        assert not sendable
    else:
        assert sendable
    if sendable:
        peer_state.check_sendable(state)
    else:
        with pytest.raises(rankguard.UsageError, match="cannot be sent to a peer"):
            peer_state.check_sendable(state)


NESTED = """
import sys
import torch.distributed as dist
import rankguard

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
outer = rankguard.StepLoop(dict, print)

def step(n):
    rankguard.StepLoop(dict, print).run(print, 1)

try:
    outer.run(step, 1)
except rankguard.UsageError as error:
    print("usage", error)
"""


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_a_step_loop_run_inside_another_loops_step_is_refused(tmp_path: Path) -> None:
    proc = _script(NESTED, str(tmp_path / "store"))
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("usage StepLoop.run(): another StepLoop is "
                                                   "running"), proc.stdout


REGROUP_ARGUMENTS = """
import sys
import torch.distributed as dist
import rankguard

rankguard.init()
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
for bad in (dict(exclude=3), dict(exclude="1"), dict(exclude=[None]), dict(exclude=[True]),
            dict(exclude=[1]), dict(exclude=[-1]), dict(keep_size="yes")):
    try:
        rankguard.regroup(timeout=2, **bad)
        print("accepted", bad)
    except rankguard.UsageError as error:
        print("usage", error)
print("still", rankguard.regroup(timeout=5, exclude=[]).world_size)
"""


@pytest.mark.slow  # out of the quick run (its 5 minutes)
def test_regroup_refuses_an_exclude_that_is_not_ranks_of_the_group_in_one_line(
        tmp_path: Path) -> None:
    # exclude=3 raised TypeError from inside regroup; "1", [None], [True], [1] were ignored
    # or taken as rank 1, silently forming a group with the rank the caller meant to leave out
    proc = _script(REGROUP_ARGUMENTS, str(tmp_path / "store"))
    lines = proc.stdout.splitlines()
    assert len(lines) == 8, proc.stdout
    assert all(line.startswith("usage rankguard.regroup(exclude): ") for line in lines[:6]), \
        proc.stdout
    assert "expected a list of ranks, got 3" in lines[0] and "got '1'" in lines[1]
    assert "got None in [None]" in lines[2] and "got True in [True]" in lines[3]
    assert "rank 1 is not in the current group (ranks 0 to 0)" in lines[4]
    assert "rank -1 is not in the current group" in lines[5]
    assert lines[6].startswith("usage rankguard.regroup(keep_size): expected True or False")
    assert lines[7] == "still 1"  # the refusals left the group as it was
