"""``rankguard run --recovery in-place``: a rank that dies, freezes or raises is replaced while the
others wait, and the run ends with the same parameters, bit for bit, as a run without the fault.

Every run is ``examples/train_inplace.py`` (DDP in ``rankguard.StepLoop``), which prints a
checksum of its final parameters.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.conftest import ROOT, Run, finish, launch, script, text_now

EXAMPLE = str(ROOT / "examples" / "train_inplace.py")
ARGS = ["--nproc-per-node", "3", "--hang-timeout", "3", "--max-restarts", "3"]
SCRIPT = [EXAMPLE, "--steps", "40", "--step-time", "0.05", "--width", "16"]


def _checksum(run: Run) -> str:
    found = re.findall(r"checksum ([0-9a-f]{16})", run.stdout)
    assert found, f"no checksum; exit {run.code}; stderr:\n{run.stderr[-4000:]}"
    return found[-1]


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> str:
    log_dir = tmp_path_factory.mktemp("fault_free")
    started = time.monotonic()
    run = finish(launch([*ARGS, *SCRIPT], log_dir), log_dir, 120, started)
    assert run.code == 0, run.stderr[-3000:]
    return _checksum(run)


def _events(run: Run, name: str) -> list[dict[str, Any]]:
    return [e for e in run.events if e["event"] == name]


@pytest.mark.slow
@pytest.mark.deadline(240)
@pytest.mark.parametrize("fault", ["kill:rank=1,at=op20", "stop:rank=2,at=op20",
                                   "raise:rank=0,at=op20", "crash:3:rank=1,at=op25",
                                   "kill:rank=2,at=step15",
                                   # the survivors fail in DDP's first backward (the first
                                   # bounded operation of a backward already under way), and
                                   # in the second step, whose forward lays the buckets out
                                   "kill:rank=1,at=step0", "kill:rank=1,at=step1"])
def test_a_replaced_rank_costs_no_step_and_the_run_ends_bit_for_bit(
        run_rankguard: Any, fault_free: str, fault: str) -> None:
    run = run_rankguard([*ARGS, "--recovery", "in-place", "--inject", fault, *SCRIPT],
                        timeout=180)
    assert run.code == 0, run.stderr[-4000:]
    assert _checksum(run) == fault_free
    rank = int(fault.split("rank=")[1].split(",")[0])
    (replace,) = _events(run, "replace")
    assert replace["rank"] == rank and replace["old_pid"] != replace["new_pid"]
    (replaced,) = _events(run, "replaced")
    assert replaced["rank"] == rank and replaced["pid"] == replace["new_pid"]
    assert replace["ts"] <= replaced["held_at"] <= replaced["ts"], (replace, replaced)
    assert replaced["source"] != rank and replaced["nbytes"] > 0
    assert not _events(run, "restart")  # one attempt: the survivors never stopped
    assert run.outcomes(0) == {0: "ok", 1: "ok", 2: "ok"}
    # torch warns of each store wait that times out: waiting for the replacement in slices of
    # 0.1 s printed some 260 such lines; a few from the probe's longer waits may remain
    assert run.stderr.count("waitForInput") < 20, run.stderr[-2000:]
    if fault.startswith("stop"):  # found hung, its stacks taken before it was stopped
        assert replace["stacks"] and "hang" in replace["cause"]
        assert replace["old_ending"] == "stopped by the launcher (was killed by SIGKILL)"
    elif not fault.startswith("raise"):  # (one that raised and lingers 1 s is stopped too)
        assert not replace["old_ending"].startswith("stopped"), replace
    if fault.startswith("kill"):  # the report draws the replacement on the rank's lane
        page = run.log_dir / "report.html"
        made = subprocess.run([sys.executable, "-m", "rankguard.cli", "report", "-o", str(page),
                               str(run.log_dir)], capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
        html = page.read_text()
        assert f"rank {rank} (pid {replace['old_pid']}, then {replace['new_pid']})" in html
        assert f"rank {rank} replaced by " in html and "flag-replaced" in html


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_gradients_a_cut_short_step_left_are_not_added_again(run_rankguard: Any,
                                                              fault_free: str) -> None:
    # the step clears its gradients after optimizer.step(): the survivors' cut-short backward
    # left its gradients in place, which the step run again would add to (the same fault-free
    # run: the first step starts with none either way)
    run = run_rankguard([*ARGS, "--recovery", "in-place", "--inject", "kill:rank=1,at=op20",
                         *SCRIPT, "--zero-grad-after"], timeout=180)
    assert run.code == 0, run.stderr[-4000:]
    assert len(_events(run, "replaced")) == 1
    assert _checksum(run) == fault_free


@pytest.mark.slow
@pytest.mark.deadline(300)
@pytest.mark.parametrize("second", ["op30", "op15"], ids=["in_a_row", "at_once"])
def test_two_faults_are_each_repaired(run_rankguard: Any, fault_free: str, second: str) -> None:
    run = run_rankguard([*ARGS, "--recovery", "in-place", "--inject", "kill:rank=1,at=op15",
                         "--inject", f"kill:rank=2,at={second}", *SCRIPT], timeout=240)
    assert run.code == 0, run.stderr[-4000:]
    assert _checksum(run) == fault_free
    replaced = _events(run, "replaced")
    assert sorted(e["rank"] for e in replaced) == [1, 2]
    assert not _events(run, "restart")
    if second == "op15":  # the survivor found both silent: one generation fills both places
        assert {e["generation"] for e in replaced} == {1}


@pytest.mark.slow
@pytest.mark.deadline(300)
def test_ranks_reaped_together_are_replaced_together(tmp_path: Any, fault_free: str) -> None:
    """Ranks 1 and 2 are SIGKILLed while the launcher is stopped (SIGSTOP), so that it reaps
    both at once and its fault names one: the other, found dead then, is replaced with it, each
    for its own death, in one generation (it was refused as "rank 2 has already exited": a
    restart)."""
    log_dir = tmp_path / "run"
    started = time.monotonic()
    # the fault-free run's steps, slower: the kills land well before the end
    proc = launch([*ARGS, "--recovery", "in-place", *SCRIPT, "--step-time", "0.25"], log_dir)
    try:
        until = time.monotonic() + 120
        while not any(e["event"] == "first_step" for e in Run(0, "", "", 0, log_dir).events):
            assert time.monotonic() < until and proc.poll() is None, "no first step"
            time.sleep(0.05)
        pids = {e["rank"]: e["pid"] for e in Run(0, "", "", 0, log_dir).events
                if e["event"] == "rank_start"}
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            for rank in (1, 2):
                os.kill(pids[rank], signal.SIGKILL)
            until = time.monotonic() + 30
            while not (_gone(pids[1]) and _gone(pids[2])):
                assert time.monotonic() < until, "the killed ranks did not die"
                time.sleep(0.05)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
    finally:
        run = finish(proc, log_dir, 180, started)
    assert run.code == 0, run.stderr[-4000:]
    assert _checksum(run) == fault_free
    assert not _events(run, "replace_refused") and not _events(run, "restart")
    replace = {e["rank"]: e for e in _events(run, "replace")}
    assert sorted(replace) == [1, 2], replace
    for rank in (1, 2):
        assert replace[rank]["cause"] == f"rank {rank} was killed by SIGKILL", replace[rank]
        assert replace[rank]["old_pid"] == pids[rank]
    replaced = _events(run, "replaced")
    assert sorted(e["rank"] for e in replaced) == [1, 2]
    assert {e["generation"] for e in replaced} == {1}


@pytest.mark.slow
@pytest.mark.deadline(300)
@pytest.mark.parametrize("sig, delay", [(signal.SIGKILL, 0.5), (signal.SIGKILL, 0.0),
                                        (signal.SIGSTOP, 0.5)],
                         ids=["killed", "killed_at_once", "stopped"])
def test_a_survivor_killed_or_stopped_while_the_replacement_joins_is_replaced_too(
        tmp_path: Any, fault_free: str, sig: signal.Signals, delay: float) -> None:
    """Rank 2 is SIGKILLed half a second after rank 1's replacement started: most often it had
    joined the generation the replacement joins, and died before that generation connected.
    The survivors gave up on it after the whole join's timeout (30 s), and the replacement
    exited on its failed connect, to be replaced again (here: three replacements for two
    faults; on four ranks the two survivors also took each other for dead, a rank without a
    default group answering probes with nothing, and the run failed blaming a healthy rank).
    Now both places are filled in the next generation.

    Rank 2 SIGSTOPped instead was not found hung while the replacement joined (the hang rules
    wait for it): after 66 s rank 1's replacement gave up on it, and was itself replaced as
    a rank that raised (three replacements for two faults, a healthy rank blamed). Now it is
    found stopped after --hang-timeout and replaced as the killed one is.

    Rank 2 killed or stopped before it arrived at the generation rank 0 forms: rank 0 waited
    for it out the whole join timeout (33 s), though the launcher had posted it a notice
    naming rank 2. Now a notice naming a member ends the wait (and the replacement's, once a
    member decided that the generation failed), and the next generation fills both places."""
    log_dir = tmp_path / "run"
    started = time.monotonic()
    # rank 1 killed from outside in a step of 0.2 s: the survivors learn of it in the step's
    # collective, and form the generation as rank 2 is signalled
    proc = launch([*ARGS, "--recovery", "in-place", *SCRIPT, "--step-time", "0.2"], log_dir)
    first_killed = killed = None
    try:
        until = time.monotonic() + 120
        while killed is None:
            assert time.monotonic() < until and proc.poll() is None, "no replacement started"
            events = Run(0, "", "", 0, log_dir).events
            pids = {e["rank"]: e["pid"] for e in events if e["event"] == "rank_start"}
            stepped = [e["ts"] for e in events if e["event"] == "first_step"]
            if first_killed is None and stepped and time.time() > stepped[0] + 1.5:
                first_killed = pids[1]
                os.kill(first_killed, signal.SIGKILL)
            if any(e["event"] == "replace" for e in events):
                killed = pids[2]
                time.sleep(delay)
                os.kill(killed, sig)
            time.sleep(0.01)
    finally:
        run = finish(proc, log_dir, 240, started)
    assert run.code == 0, run.stderr[-4000:]
    assert _checksum(run) == fault_free
    replace = _events(run, "replace")
    assert [e["rank"] for e in replace] == [1, 2], replace
    assert replace[1]["old_pid"] == killed, replace
    if sig == signal.SIGSTOP:
        assert "was stopped (SIGSTOP) for" in replace[1]["cause"], replace
        assert replace[1]["ts"] - replace[0]["ts"] < 30, replace  # 3 s stopped, not 66
    # a generation that did not form was given up before the join timeout (30 s), not after
    given_up = [float(s) for s in re.findall(r"regroup ([0-9.]+) s, transfer [0-9.]+ s; failed",
                                             run.stdout)]
    assert all(s < 25 for s in given_up), given_up
    assert not _events(run, "restart") and not _events(run, "replace_refused")


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_a_script_without_step_loop_falls_back_to_a_restart(run_rankguard: Any) -> None:
    run = run_rankguard([*ARGS, "--recovery", "in-place", "--inject", "kill:rank=1,at=op20",
                         str(ROOT / "examples" / "train.py"), "--steps", "30"], timeout=180)
    assert run.code == 0, run.stderr[-4000:]
    (refused,) = _events(run, "replace_refused")
    assert "does not run its loop in rankguard.StepLoop" in refused["reason"]
    assert _events(run, "restart") and not _events(run, "replace")


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_when_replacements_run_out_the_run_fails_with_the_fault(run_rankguard: Any) -> None:
    args = ["--nproc-per-node", "3", "--hang-timeout", "3", "--max-restarts", "1"]
    run = run_rankguard([*args, "--recovery", "in-place", "--inject", "kill:rank=1,at=op15",
                         "--inject", "kill:rank=2,at=op30", *SCRIPT], timeout=180)
    assert run.code != 0
    assert len(_events(run, "replace")) == 1
    (refused,) = _events(run, "replace_refused")
    assert "no restarts left" in refused["reason"]
    assert "rank 2 was killed by SIGKILL" in run.stderr


GRACE_S = 30.0  # what the survivors would wait without the launcher's word
SOON_S = 15.0  # fault to end: well below the grace, generous for a loaded machine


@pytest.mark.slow
@pytest.mark.deadline(240)
@pytest.mark.parametrize("bug, restarts, reason", [
    ("usage", "3", "a usage error is the script's own"),
    ("step", "1", "no restarts left"),  # rank 1's replacement raises again, at the same step
])
def test_a_refused_repair_ends_the_survivors_at_once_not_after_the_grace(
        run_rankguard: Any, bug: str, restarts: str, reason: str) -> None:
    """The launcher's refusal reaches the survivors with its notice: their StepLoop raises
    PeerFailed naming it instead of waiting for a replacement, and they exit by themselves,
    long before ``--grace`` would have them stopped."""
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "3", "--max-restarts",
                         restarts, "--grace", f"{GRACE_S:g}", "--recovery", "in-place",
                         script("step_loop_bugs.py"), bug], timeout=180)
    assert run.code == 1, run.stderr[-4000:]
    (refused,) = _events(run, "replace_refused")
    assert reason in refused["reason"], refused
    assert f"rank 1 will not be replaced: {refused['reason']}" in run.stdout + run.stderr
    end = run.event("attempt_end")
    assert end["ts"] - end["at"] < SOON_S, (end, run.stderr[-3000:])
    stopped = [e for e in _events(run, "escalate") if e["step"] in ("term", "kill")
               and 0 in e["ranks"]]
    assert not stopped, stopped  # rank 0 ended by itself
    assert run.outcomes(0)[0] == "victim"


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_a_replacement_killed_while_it_joins_is_replaced_in_turn(tmp_path: Any,
                                                                   fault_free: str) -> None:
    import time

    from tests.conftest import finish, launch

    log_dir = tmp_path / "logs"
    started = time.monotonic()
    proc = launch([*ARGS, "--recovery", "in-place", "--inject", "kill:rank=1,at=op20",
                   *SCRIPT], log_dir)
    killed = _kill_once_replaced(proc, log_dir, 120, lambda replace, events: replace["new_pid"])
    run = finish(proc, log_dir, 180, started)
    assert killed is not None, run.stderr[-3000:]
    assert run.code == 0, run.stderr[-4000:]
    assert _checksum(run) == fault_free
    replaces = _events(run, "replace")
    assert [e["rank"] for e in replaces] == [1, 1] and replaces[1]["old_pid"] == killed
    (replaced,) = _events(run, "replaced")
    assert replaced["pid"] == replaces[1]["new_pid"]
    assert not _events(run, "restart")


def _kill_once_replaced(proc: Any, log_dir: Any, timeout: float,
                       pick: Any) -> int | None:
    """SIGKILL the process ``pick(replace_event, events)`` names once the journal shows the
    first ``replace`` (within ``timeout``); its pid, or None if none came."""
    import json
    import os
    import signal
    import time

    until = time.monotonic() + timeout
    while time.monotonic() < until and proc.poll() is None:
        events = [json.loads(line) for line in text_now(log_dir / "journal.jsonl").splitlines()]
        replace = next((e for e in events if e["event"] == "replace"), None)
        if replace is not None:
            pid = pick(replace, events)
            os.kill(pid, signal.SIGKILL)
            return pid
        time.sleep(0.01)
    return None


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_replacement_variables_left_in_the_users_shell_do_not_reach_the_ranks(
        run_rankguard: Any, fault_free: str) -> None:
    run = run_rankguard([*ARGS, *SCRIPT], timeout=180,
                        env={"RANKGUARD_REPLACING": "1", "RANKGUARD_REPLACE_TIMEOUT": "abc"})
    assert run.code == 0, run.stderr[-4000:]
    assert _checksum(run) == fault_free


@pytest.mark.slow
@pytest.mark.deadline(240)
def test_a_single_rank_is_not_replaced_in_place_but_restarted(run_rankguard: Any) -> None:
    run = run_rankguard(["--nproc-per-node", "1", "--hang-timeout", "3", "--max-restarts", "1",
                         "--recovery", "in-place", "--inject", "kill:rank=0,at=op10",
                         *SCRIPT], timeout=180)
    assert run.code == 0, run.stderr[-4000:]
    (refused,) = _events(run, "replace_refused")
    assert "no other rank holds the state" in refused["reason"]
    assert _events(run, "restart")



@pytest.mark.slow
@pytest.mark.deadline(180)
def test_an_error_of_get_state_is_the_root_cause_not_a_peers_fault(run_rankguard: Any) -> None:
    """The healthy rank's get_state raises while it would send the state: that error (not the
    peer's fault it was handling, nor a hang of the replacement waiting for the state) ends the
    run."""
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "3", "--max-restarts", "1",
                         "--recovery", "in-place", "--inject", "kill:rank=1,at=op15",
                         script("step_loop_bugs.py"), "get_state"], timeout=150)
    assert run.code == 1, run.stderr[-4000:]
    assert "RuntimeError: the script's get_state broke" in run.stdout + run.stderr
    root = run.event("run_end")["root_cause"]
    assert root.startswith("rank 0 raised"), root


@pytest.mark.slow
@pytest.mark.deadline(180)
def test_a_rank_that_fails_in_every_replacement_is_replaced_alone_then_ends_the_run(
        run_rankguard: Any) -> None:
    """Rank 1 raises at step 10 in every process: each replacement joins, resumes, and raises
    again; the healthy ranks stay members of every generation (a rank that answered the probe
    is never taken for failed), and once the replacements are spent the run fails with rank
    1's error."""
    run = run_rankguard(["--nproc-per-node", "3", "--hang-timeout", "3", "--max-restarts", "3",
                         "--recovery", "in-place", script("step_loop_bugs.py"), "step"],
                        timeout=150)
    assert run.code == 1, run.stderr[-4000:]
    assert "left out of generation" not in run.stdout + run.stderr
    assert [e["rank"] for e in _events(run, "replace")] == [1, 1, 1]
    assert len(_events(run, "replaced")) == 3
    assert run.event("run_end")["root_cause"].startswith("rank 1 raised"), run.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.deadline(180)
@pytest.mark.parametrize("where", ["group_at_top", "group_in_on_regroup"])
def test_a_sub_group_made_in_on_regroup_survives_a_replacement_and_one_made_at_the_top_is_refused(
        run_rankguard: Any, where: str) -> None:
    """A sub-group made in ``loop.on_regroup`` is made again on every rank after the state
    arrived, and the run goes on; one made at the top of the script is refused in the
    replacement at once (the survivors wait for it in the state's exchange), instead of a wait
    until the replacement limit."""
    run = run_rankguard(["--nproc-per-node", "2", "--hang-timeout", "3", "--max-restarts", "1",
                         "--recovery", "in-place", "--inject", "kill:rank=1,at=op15",
                         script("step_loop_bugs.py"), where], timeout=150)
    replaced = [e["rank"] for e in _events(run, "replace")]
    if where == "group_in_on_regroup":
        assert run.code == 0, run.stderr[-4000:]
        assert replaced == [1] and len(_events(run, "replaced")) == 1
        return
    assert run.code == 1, run.stderr[-4000:]
    assert "dist.new_group(): called by a replacement rank before it received the state" \
        in run.stderr and "loop.on_regroup(fn)" in run.stderr
    assert replaced == [1] and not _events(run, "replaced")  # the replacement was refused
    spent = run.event("run_end")["ts"] - _events(run, "replace")[0]["ts"]
    assert spent < 60, spent  # not the replacement limit (96 s at --hang-timeout 3)


SMALL = [script("step_loop_small.py")]
TWO = ["--nproc-per-node", "2", "--hang-timeout", "3", "--recovery", "in-place"]


@pytest.mark.slow
@pytest.mark.deadline(150)
def test_a_replacement_whose_first_resume_fails_in_the_rebuild_reports_once_it_holds_the_state(
        run_rankguard: Any, tmp_path: Any) -> None:
    """Rank 1's replacement receives the state, then a peer dies in the rebuild (its on_regroup
    collective): that resume fails and the next generation's, with rank 2 replaced too, ends
    well. The replacement reported only after a resume that brought it the state, so it never
    reported: the launcher waited for it out the replacement limit, then restarted a job whose
    ranks had all finished (slow set, 1 in about 10 runs of the SIGSTOP double fault)."""
    run = run_rankguard(["--nproc-per-node", "3", "--hang-timeout", "3", "--recovery", "in-place",
                         "--max-restarts", "3", "--inject", "kill:rank=1,at=step5", *SMALL],
                        timeout=120, env={"KILL_IN_REBUILD": "2", "PID_DIR": str(tmp_path),
                                          "STEPS": "40"})
    assert run.code == 0, run.stderr[-4000:]
    assert (tmp_path / "killed").exists(), run.stderr[-4000:]  # the fault happened
    assert [e["rank"] for e in _events(run, "replace")] == [1, 2], _events(run, "replace")
    assert sorted(e["rank"] for e in _events(run, "replaced")) == [1, 2], run.stderr[-4000:]
    assert not _events(run, "restart") and not _events(run, "replace_refused")


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_when_every_rank_dies_at_once_the_attempt_restarts_at_once(run_rankguard: Any) -> None:
    run = run_rankguard([*TWO, "--max-restarts", "5", "--inject", "kill:rank=0,at=step5",
                         "--inject", "kill:rank=1,at=step5", *SMALL], timeout=90)
    assert run.code == 0, run.stderr[-4000:]
    refused = _events(run, "replace_refused")
    # the second death seen is refused: as the only other rank's (no giver of the state, when
    # the first was replaced), or, when both deaths were reaped at once, as a rank gone
    assert refused and re.search(r"no other rank holds the state|rank [01] has already exited",
                                 refused[0]["reason"]), refused
    # one restart, the refused repair's: the replacement started before it (when rank 1's
    # death came first) belonged to the ended attempt, and its fault does not end the next one
    (restart,) = _events(run, "restart")
    assert "SIGKILL" in restart["root_cause"], restart
    assert len(_events(run, "replace")) <= 1
    assert run.wall_s < 70, run.wall_s  # not the replacement limit (96 s at --hang-timeout 3)


@pytest.mark.slow
@pytest.mark.deadline(150)
def test_when_the_only_giver_dies_while_the_replacement_joins_the_first_death_is_the_cause(
        tmp_path: Any) -> None:
    """Rank 1 dies; rank 0, the only rank that can give its replacement the state, is killed
    once the replacement started: the repair is refused and the attempt restarts, its root
    cause rank 1's death, the first in time (it was rank 0's: adversarial pass, 2 of 2)."""
    import time

    log_dir = tmp_path / "logs"
    started = time.monotonic()
    proc = launch([*TWO, "--max-restarts", "3", "--inject", "kill:rank=1,at=step5",
                   *SMALL], log_dir)
    giver = _kill_once_replaced(proc, log_dir, 60, lambda replace, events: next(
        e["pid"] for e in events if e["event"] == "rank_start" and e["rank"] == 0))
    run = finish(proc, log_dir, 120, started)
    assert giver is not None, run.stderr[-3000:]
    assert run.code == 0, run.stderr[-4000:]
    (refused,) = _events(run, "replace_refused")
    assert "no other rank holds the state" in refused["reason"], refused
    (restart,) = _events(run, "restart")
    assert restart["root_cause"].startswith("rank 1 "), restart


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_survivor_that_ends_while_its_peer_is_replaced_ends_the_wait_at_once(
        run_rankguard: Any) -> None:
    run = run_rankguard([*TWO, "--max-restarts", "2", "--inject", "stop:rank=1,at=step19",
                         *SMALL], timeout=90)
    assert run.code == 0, run.stderr[-4000:]
    assert len(_events(run, "replace")) == 1
    (refused,) = _events(run, "replace_refused")
    assert "rank 0 has already exited" in refused["reason"], refused
    (restart,) = _events(run, "restart")
    assert "SIGSTOP" in restart["root_cause"], restart
    assert "can no longer join" in run.stderr
    assert run.wall_s < 70, run.wall_s  # not the replacement limit (96 s at --hang-timeout 3)


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_fault_after_the_loops_ended_says_the_peer_left_its_loop_not_that_it_never_ran_one(
        run_rankguard: Any) -> None:
    """Rank 1 exits 3 after its loop; rank 0's loop has ended too: no replacement can resume
    with it, and the refusal says so (it said rank 0 'does not run its loop in StepLoop')."""
    run = run_rankguard([*TWO, "--max-restarts", "1", *SMALL], timeout=90,
                        env={"EXIT_AFTER": "1"})
    assert run.code == 0, run.stderr[-4000:]
    (refused,) = _events(run, "replace_refused")
    assert refused["reason"] == "rank 0 has left its rankguard.StepLoop (its run() ended)", \
        refused


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_replacement_stopped_while_it_joins_ends_the_wait_after_the_hang_timeout(
        run_rankguard: Any) -> None:
    """A stopped (SIGSTOP) replacement cannot join: the attempt ends once it has been stopped
    for --hang-timeout (3 s), not at the replacement limit (96 s), and restarts."""
    run = run_rankguard([*TWO, "--max-restarts", "2", "--inject", "kill:rank=1,at=step5",
                         *SMALL], timeout=90, env={"STOP_REPLACEMENT": "1"})
    assert run.code == 0, run.stderr[-4000:]
    (refused,) = _events(run, "replace_refused")
    assert "replacement was stopped (SIGSTOP) for" in refused["cause"], refused
    (restart,) = _events(run, "restart")
    spent = restart["ts"] - _events(run, "replace")[0]["ts"]
    assert spent < 30, spent  # 3 s stopped, plus a cold start on a loaded machine


@pytest.mark.slow
@pytest.mark.deadline(120)
def test_a_replaced_ranks_children_are_stopped_when_it_is_replaced(tmp_path: Any) -> None:
    """Each rank starts a ``sleep`` child; the killed rank's child (re-parented) is stopped
    with it, before its replacement holds the state, not at the end of the run."""
    from tests.conftest import finish, launch

    children = tmp_path / "children"
    children.mkdir()
    log_dir = tmp_path / "run"
    started = time.monotonic()
    proc = launch([*TWO, "--max-restarts", "2", "--inject", "kill:rank=1,at=step10", *SMALL],
                  log_dir, env={"CHILD": "1", "CHILD_DIR": str(children), "STEPS": "60"})
    try:
        replaced, old_pid = None, None
        while time.monotonic() - started < 60 and proc.poll() is None and replaced is None:
            time.sleep(0.1)
            journal = log_dir / "journal.jsonl"
            lines = journal.read_text().splitlines() if journal.exists() else []
            events = [json.loads(line) for line in lines if line.endswith("}")]
            old_pid = next((e["old_pid"] for e in events if e["event"] == "replace"), old_pid)
            replaced = next((e for e in events if e["event"] == "replaced"), None)
        assert replaced is not None and proc.poll() is None, "no replacement while it ran"
        old_child = int((children / f"rank1-{old_pid}").read_text())
        assert _gone(old_child), f"rank 1's child {old_child} outlived its replacement"
    finally:
        run = finish(proc, log_dir, 60, started)
    assert run.code == 0, run.stderr[-4000:]


def _gone(pid: int) -> bool:
    """``pid`` has exited (a zombie not reaped yet counts)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
