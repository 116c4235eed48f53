"""Root cause vs victim, each rank's outcome, and the run's exit code: the launcher's
decisions after a fault, table-driven over fake ledger snapshots and process exits (no
processes, no clock; milliseconds in all).

The end-to-end runs that prove the same on real ranks are in test_faults.py,
test_blame_end_to_end.py and test_launcher_signals.py.
"""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass

import pytest

from rankguard.records import ledger as L
from rankguard.launcher.monitor import Verdict
from rankguard.launcher.outcome import (OUTCOMES, Fault, FaultKind, RankOutcome, RankSnapshot,
                                        classify, deadline_verdict, first_fault, lingering,
                                        restarts_after, run_status)
from rankguard.launcher.summary import AttemptReport, render
from tests.launcher.snapshots import (group, leaving, ledger, nccl, raised_in, usage_error,
                                      world)

WINDOW, HANG = 0.3, 3.0


def _in_step_loop(progress: L.RankProgress) -> L.RankProgress:
    return dataclasses.replace(progress, flags=progress.flags | L.FLAG_STEP_LOOP)


@dataclass
class FaultCase:
    states: list[RankSnapshot]
    now: float
    root: tuple[int | None, str, float] | None  # (rank, describe(), at) or None
    hint: str = ""


BAD_ARG = "rankguard.regroup(keep_size): expected True or False, got 'yes'"
USAGE_ROOT = f"rank 1 stopped on a usage error: {BAD_ARG}; not restarted (fix the script)"

FIRST_FAULT = {
    # sys.exit(3) in rank 1, whose interpreter is still tearing down; rank 0 failed in #11
    "nonzero exit is the root while its process lives on": FaultCase(
        [RankSnapshot(0, raised_in(12, 1.2)), RankSnapshot(1, leaving(11, 1.0, 3))], 1.25,
        (1, "rank 1 exited with code 3", 1.0)),
    "nonzero exit counts even before the peer fails": FaultCase(
        [RankSnapshot(0, ledger(world(12, 11, t_enter=0.9))), RankSnapshot(1, leaving(11, 1.0, 3))],
        1.01, (1, "rank 1 exited with code 3", 1.0)),
    "sys.exit(0) before the peers' collective is the root": FaultCase(
        [RankSnapshot(0, raised_in(12, 1.2)), RankSnapshot(1, leaving(11, 1.0, 0))], 1.21,
        (1, "rank 1 exited with code 0 before all_reduce #11 (rank 0 went on to it)", 1.0)),
    # os._exit(0): nothing in the ledger; the exit is seen after the peer already failed
    "os._exit(0) seen late is timed by the failure it caused": FaultCase(
        [RankSnapshot(0, raised_in(12, 1.2)), RankSnapshot(1, ledger(world(11)), 0, 1.25)], 1.3,
        (1, "rank 1 exited with code 0 before all_reduce #11 (rank 0 went on to it)", 1.2)),
    "the peer waits --hang-timeout for a rank that left with 0": FaultCase(
        [RankSnapshot(0, ledger(world(12, 11, t_enter=1.0))), RankSnapshot(1, leaving(11, 0.9, 0))],
        1.0 + HANG, (1, "rank 1 exited with code 0 before all_reduce #11 (rank 0 went on to it)",
                     0.9)),
    # rankguard.StepLoop caught the failed all_reduce (done) and waits in its regroup
    "a peer still in its StepLoop --hang-timeout after a rank left with 0": FaultCase(
        [RankSnapshot(0, _in_step_loop(ledger(world(12)))), RankSnapshot(1, leaving(11, 0.9, 0))],
        0.9 + HANG, (1, "rank 1 exited with code 0 before all_reduce #11 (rank 0 went on to it)",
                     0.9)),
    "a peer in its StepLoop less than --hang-timeout after the departure: nothing yet":
        FaultCase([RankSnapshot(0, _in_step_loop(ledger(world(12)))),
                   RankSnapshot(1, leaving(11, 0.9, 0))], 0.9 + HANG - 0.1, None),
    "a peer in its StepLoop that did no more than the leaver: no fault": FaultCase(
        [RankSnapshot(0, _in_step_loop(ledger(world(11)))), RankSnapshot(1, leaving(11, 0.9, 0))],
        0.9 + HANG + 5, None),
    # busy rank 1 caught up with the operations rank 0 enqueued long before, then left with
    # its sampler's last tick behind its last operations: rank 0's completions still move
    "an asynchronous peer whose completions moved within --hang-timeout proves nothing yet":
        FaultCase([RankSnapshot(0, ledger(nccl(13, -1, 12, t_enter=1.0, t_done=8.5))),
                   RankSnapshot(1, dataclasses.replace(
                       leaving(11, 8.9, 0), groups=(nccl(11, -1, 11, 8.0, 8.0),)))],
                  8.5 + HANG - 0.1, None),
    "an asynchronous peer whose completions stalled --hang-timeout after a rank left with 0":
        FaultCase([RankSnapshot(0, ledger(nccl(13, -1, 12, t_enter=1.0, t_done=8.5))),
                   RankSnapshot(1, dataclasses.replace(
                       leaving(11, 8.9, 0), groups=(nccl(11, -1, 11, 8.0, 8.0),)))],
                  8.9 + HANG, (1, "rank 1 exited with code 0 before all_reduce #12 (rank 0 "
                               "went on to it)", 8.9)),
    "a peer waiting less than --hang-timeout proves nothing yet": FaultCase(
        [RankSnapshot(0, ledger(world(12, 11, t_enter=1.0))), RankSnapshot(1, leaving(11, 0.9, 0))],
        1.0 + HANG - 0.1, None),
    "ranks that finished the same work are no fault": FaultCase(
        [RankSnapshot(0, leaving(12, 1.0, 0), 0, 1.5),
         RankSnapshot(1, leaving(12, 1.1, 0), 0, 1.6)],
        2.0, None),
    "point-to-point counts differ between ranks: no evidence": FaultCase(
        [RankSnapshot(0, ledger(world(12, 11, kind="recv", t_enter=1.0))),
         RankSnapshot(1, leaving(11, 0.9, 0))], 10.0, None),
    "a failure in a collective waits for its cause to show": FaultCase(
        [RankSnapshot(0, raised_in(12, 1.0)), RankSnapshot(1, ledger(world(12, 11)))], 1.0 + 0.1,
        None),
    "a failure in a collective with no other cause is the root after the window": FaultCase(
        [RankSnapshot(0, raised_in(12, 1.0)), RankSnapshot(1, ledger(world(12, 11)))],
        1.0 + WINDOW, (0, "rank 0 raised an exception inside a collective", 1.0)),
    "a peer that left as much as the failed rank is no cause": FaultCase(
        [RankSnapshot(0, raised_in(12, 1.0)), RankSnapshot(1, leaving(12, 0.5, 0), 0, 0.6)],
        1.0 + WINDOW, (0, "rank 0 raised an exception inside a collective", 1.0)),
    # SIGKILL: the peer's gloo error is recorded before the launcher reaps the killed rank
    "a death beats the failure it caused, whatever the clock says": FaultCase(
        [RankSnapshot(0, raised_in(12, 1.02)), RankSnapshot(1, ledger(world(11)), -9, 1.05)],
        1.05, (1, "rank 1 was killed by SIGKILL", 1.05)),
    "a death beats the failure it caused, even when both are seen late": FaultCase(
        [RankSnapshot(0, raised_in(12, 1.02)), RankSnapshot(1, ledger(world(11)), -9, 1.05)],
        1.05 + WINDOW, (1, "rank 1 was killed by SIGKILL", 1.05)),
    "an exception outside a collective is the root at once": FaultCase(
        [RankSnapshot(0, ledger(world(5), fault=L.FAULT_RAISED, t_fault=1.0)),
         RankSnapshot(1, ledger(world(6, 5)))], 1.0, (0, "rank 0 raised an exception", 1.0)),
    "a rankguard.UsageError is the root at once, named with its message": FaultCase(
        [RankSnapshot(0, ledger(world(6, 5))), RankSnapshot(1, usage_error(5, 1.0, BAD_ARG))],
        1.0, (1, USAGE_ROOT, 1.0)),
    # the script's own mistake, even where the rank was inside a collective: no window
    "a usage error inside a collective is no cascade: it beats a peer's earlier failure":
        FaultCase([RankSnapshot(0, raised_in(12, 0.9)),
                   RankSnapshot(1, usage_error(12, 1.0, BAD_ARG, in_collective=True))],
                  1.0, (1, USAGE_ROOT, 1.0)),
    "argparse's refusal of the arguments (exit code 2) is a usage error at once": FaultCase(
        [RankSnapshot(0, ledger(world(1))),
         RankSnapshot(1, dataclasses.replace(leaving(1, 1.0, 2), error=L.ErrorKind.USAGE,
                                             error_text="train.py: error: bad --steps"))],
        1.0, (1, "rank 1 stopped on a usage error: train.py: error: bad --steps; not "
              "restarted (fix the script)", 1.0)),
    "a SIGTERM teardown counts when its exit is seen": FaultCase(
        [RankSnapshot(0, ledger(world(5), fault=L.FAULT_TERMINATED, t_fault=1.0)),
         RankSnapshot(1, ledger(world(6, 5)))], 2.0, None),
    "a SIGTERM teardown that exited": FaultCase(
        [RankSnapshot(0, ledger(world(5), fault=L.FAULT_TERMINATED, t_fault=1.0), 0, 1.1),
         RankSnapshot(1, ledger(world(6, 5)))], 2.0,
        (0, "rank 0 got SIGTERM (tore itself down, exited with code 0)", 1.0)),
    "the earliest of two established faults": FaultCase(
        [RankSnapshot(0, leaving(5, 1.5, 2)), RankSnapshot(1, ledger(world(5)), 4, 1.2)], 2.0,
        (1, "rank 1 exited with code 4", 1.2)),
    "the earliest of two failures in collectives, once both windows passed": FaultCase(
        [RankSnapshot(0, raised_in(12, 1.1)), RankSnapshot(1, raised_in(12, 1.0))], 1.1 + WINDOW,
        (1, "rank 1 raised an exception inside a collective", 1.0)),
    "ranks that run on show no fault": FaultCase(
        [RankSnapshot(0, ledger(world(12, 11, t_enter=1.0))), RankSnapshot(1, ledger(world(11)))],
        1.0 + 10 * HANG, None),
    "sys.exit(0) before the peers' collective on a sub-group they share is the root": FaultCase(
        [RankSnapshot(0, ledger(world(6), group(4, 3, "all_reduce", 1.0, 0b11, "a"))),
         RankSnapshot(1, ledger(world(6), group(3, 3, "all_reduce", 0.5, 0b11, "a"),
                             fault=L.FAULT_EXITING, t_fault=0.9))],
        1.0 + HANG, (1, "rank 1 exited with code 0 before all_reduce #4 on group ranks 0,1 "
                     "(rank 0 went on to it)", 0.9)),
    "a peer ahead on a group the leaver is not in is no evidence": FaultCase(
        [RankSnapshot(0, ledger(world(6), group(4, 3, "all_reduce", 1.0, 0b101, "b"))),
         RankSnapshot(1, leaving(6, 0.9, 0))], 1.0 + 10 * HANG, None),
    # os._exit(7) in a non-daemon thread or an atexit handler once the script returned: the
    # process's own exit code says the job failed (torchrun fails it too)
    "a process that exits non-zero by itself after its script ended with 0 is the root":
        FaultCase([RankSnapshot(0, ledger(world(6, 5))),
                   RankSnapshot(1, leaving(5, 1.0, 0), 7, 1.5)], 1.5,
                  (1, "rank 1 exited with code 7 after its script ended with code 0", 1.5)),
    # a daemon thread coming back into the finalizing interpreter aborts it (SIGABRT)
    "a signal that ends a process whose script ended with 0 is no fault": FaultCase(
        [RankSnapshot(0, ledger(world(6, 5))), RankSnapshot(1, leaving(5, 1.0, 0), -6, 1.5)],
        1.5, None),
    # ended as lingering, or in a peer's teardown: its SIGTERM teardown overran (exit 143)
    "a rank the launcher stopped after its script ended with 0 is no fault, whatever its code":
        FaultCase([RankSnapshot(0, ledger(world(6, 5))),
                   RankSnapshot(1, leaving(5, 1.0, 0), 143, 1.5, stopped=True)], 1.5, None),
}


@pytest.mark.parametrize("case", FIRST_FAULT.values(), ids=FIRST_FAULT.keys())
def test_first_fault(case: FaultCase) -> None:
    fault = first_fault(case.states, case.now, WINDOW, HANG)
    if case.root is None:
        assert fault is None
    else:
        assert fault is not None
        assert (fault.rank, fault.describe(), fault.at) == case.root




ROOT_1 = Fault("exited", 1.0, 1, "exited with code 3")
TEARDOWN = 2.0  # when the launcher began stopping the ranks
HUNG_1 = Verdict(True, (1,), (0,), "all_reduce", 10, 3.0, "no_progress")
# (outcome, exit_code, signal, detail) of each rank
Ends = dict[int, tuple[str, int | None, str | None, str]]


@dataclass
class OutcomeCase:
    states: list[RankSnapshot]
    root: Fault | None
    hang: Verdict | None
    teardown_at: float | None
    ends: Ends


def _clean(rank: int, at: float = 1.0) -> RankSnapshot:
    return RankSnapshot(rank, ledger(world(5)), 0, at)


def _torn_down(rank: int, at: float = TEARDOWN + 0.1) -> RankSnapshot:
    """Stopped by the launcher's SIGTERM: tore itself down and exited 0."""
    return RankSnapshot(rank, ledger(world(6, 5), fault=L.FAULT_TERMINATED, t_fault=at - 0.05), 0,
                     at)


OK0 = ("ok", 0, None, "exited with code 0")
VICTIM0 = ("victim", 0, None, "exited with code 0")

CLASSIFY = {
    "every rank that exited 0 with no fault is ok": OutcomeCase(
        [_clean(0), _clean(1, 1.1)], None, None, None, {0: OK0, 1: OK0}),
    "the root cause's rank gets its fault's kind (exited), the others are victims": OutcomeCase(
        [_torn_down(0), RankSnapshot(1, ledger(world(5)), 3, 1.0)], ROOT_1, None, TEARDOWN,
        {0: VICTIM0, 1: ("exited", 3, None, "exited with code 3")}),
    "raised: an exception escaped the script": OutcomeCase(
        [_torn_down(0), RankSnapshot(1, ledger(world(5), fault=L.FAULT_RAISED, t_fault=1.0), 1,
                                  1.3)],
        Fault("raised", 1.0, 1, "raised an exception"), None, TEARDOWN,
        {0: VICTIM0, 1: ("raised", 1, None, "exited with code 1")}),
    "usage_error: a rankguard.UsageError escaped the script": OutcomeCase(
        [_torn_down(0), RankSnapshot(1, usage_error(5, 1.0, BAD_ARG), 1, 1.3)],
        Fault("usage_error", 1.0, 1, USAGE_ROOT), None, TEARDOWN,
        {0: VICTIM0, 1: ("usage_error", 1, None, "exited with code 1")}),
    "signalled: killed by a signal it did not expect": OutcomeCase(
        [_torn_down(0), RankSnapshot(1, ledger(world(5)), -9, 1.0)],
        Fault("signalled", 1.0, 1, "was killed by SIGKILL"), None, TEARDOWN,
        {0: VICTIM0, 1: ("signalled", None, "SIGKILL", "was killed by SIGKILL")}),
    "a rank that was leaving keeps its script's exit code, though a signal ended it":
        OutcomeCase([_torn_down(0), RankSnapshot(1, leaving(5, 1.0, 3), -9, 2.5, 0, True)],
                    ROOT_1, None, TEARDOWN,
                    {0: VICTIM0, 1: ("exited", 3, "SIGKILL", "its script ended with code 3, "
                                     "then its process was killed by SIGKILL as it exited")}),
    "a rank that left with code 0 before its peers' collective is the root (exited)":
        OutcomeCase([_torn_down(0), RankSnapshot(1, leaving(5, 1.0, 0), 0, 1.2)],
                    Fault("exited", 1.0, 1, "exited with code 0 before all_reduce #5"), None,
                    TEARDOWN, {0: VICTIM0, 1: ("exited", 0, None, "exited with code 0")}),
    "hung: the rank a hang blames, the others are victims": OutcomeCase(
        [_torn_down(0), _torn_down(1)], Fault("hung", 1.0, None, "hang: ..."), HUNG_1, TEARDOWN,
        {0: VICTIM0, 1: ("hung", 0, None, "exited with code 0")}),
    "hung even when the blamed rank needed SIGKILL": OutcomeCase(
        [_torn_down(0), RankSnapshot(1, ledger(world(5)), -9, 7.0, 0, True)],
        Fault("hung", 1.0, None, "hang: ..."), HUNG_1, TEARDOWN,
        {0: VICTIM0, 1: ("hung", None, "SIGKILL", "was killed by SIGKILL")}),
    "a straggler report blames no one": OutcomeCase(
        [_clean(0), _clean(1)], None, Verdict(False, (1,), (0,), "all_reduce", 10, 3.0, "busy"),
        None, {0: OK0, 1: OK0}),
    "teardown_timeout: a rank SIGKILLed after the grace period": OutcomeCase(
        [RankSnapshot(0, ledger(world(6, 5)), -9, 7.0, 0, True),
         RankSnapshot(1, ledger(world(5)), 3, 1.0)], ROOT_1, None, TEARDOWN,
        {0: ("teardown_timeout", None, "SIGKILL", "was killed by SIGKILL"),
         1: ("exited", 3, None, "exited with code 3")}),
    "victim: any exit once the teardown began, whatever its code": OutcomeCase(
        [RankSnapshot(0, ledger(world(6, 5)), 1, TEARDOWN + 0.2),
         RankSnapshot(1, ledger(world(5)), 3, 1.0)],
        ROOT_1, None, TEARDOWN,
        {0: ("victim", 1, None, "exited with code 1"), 1: ("exited", 3, None,
                                                           "exited with code 3")}),
    "victim: failed inside a collective after the root cause, before the teardown":
        OutcomeCase([RankSnapshot(0, raised_in(12, 1.1), 1, 1.2),
                     RankSnapshot(1, ledger(world(11)), 3, 1.0)], ROOT_1, None, TEARDOWN,
                    {0: ("victim", 1, None, "exited with code 1"),
                     1: ("exited", 3, None, "exited with code 3")}),
    "a failure inside a collective before the root cause is its own": OutcomeCase(
        [RankSnapshot(0, raised_in(12, 0.9), 1, 1.2), RankSnapshot(1, ledger(world(11)), 3, 1.0)],
        ROOT_1, None, TEARDOWN, {0: ("raised", 1, None, "exited with code 1"),
                                 1: ("exited", 3, None, "exited with code 3")}),
    # node 1 was killed; this node learned it at 1.4 (its beats), after its rank 0's
    # collective broke (1.1): the failure is still the lost node's effect
    "a failure inside a collective before another node's fault was learned is a victim":
        OutcomeCase([RankSnapshot(0, raised_in(12, 1.1), 1, 1.2)],
                    Fault("node_lost", 1.4, None, "node 1 (host h1) has published no progress"),
                    None, TEARDOWN, {0: ("victim", 1, None, "exited with code 1")}),
    "a failure outside a collective after the root cause is its own, not a victim":
        OutcomeCase([RankSnapshot(0, ledger(world(5), fault=L.FAULT_RAISED, t_fault=1.5), 1, 1.6),
                     RankSnapshot(1, ledger(world(5)), 3, 1.0)], ROOT_1, None, TEARDOWN,
                    {0: ("raised", 1, None, "exited with code 1"),
                     1: ("exited", 3, None, "exited with code 3")}),
    "a rank that finished cleanly before the fault is ok": OutcomeCase(
        [_clean(0, 0.5), RankSnapshot(1, ledger(world(5)), 3, 1.0)], ROOT_1, None, TEARDOWN,
        {0: OK0, 1: ("exited", 3, None, "exited with code 3")}),
    # it printed "done" and its script returned; its process was still exiting (flushing,
    # atexit) when a peer's crash made the launcher stop the ranks
    "a rank whose script ended with 0 before the teardown is ok, though it exited later":
        OutcomeCase([RankSnapshot(0, leaving(5, 1.5, 0), 0, TEARDOWN + 0.2),
                     RankSnapshot(1, ledger(world(5)), 3, 1.0)], ROOT_1, None, TEARDOWN,
                    {0: OK0, 1: ("exited", 3, None, "exited with code 3")}),
    # a daemon thread coming back into the finalizing interpreter aborts it: no fault, and
    # the journal says both (it read "ok, exit code 0, SIGABRT")
    "a rank aborted as it exited after its script ended with 0 is ok, and says both":
        OutcomeCase([RankSnapshot(0, leaving(5, 1.0, 0), -6, 1.5)], None, None, None,
                    {0: ("ok", 0, "SIGABRT", "its script ended with code 0, then its process "
                                             "was killed by SIGABRT as it exited")}),
    "a rank whose process exited 7 by itself after its script ended with 0 reports 7":
        OutcomeCase([_torn_down(0), RankSnapshot(1, leaving(5, 1.0, 0), 7, 1.5)],
                    Fault("exited", 1.5, 1,
                          "exited with code 7 after its script ended with code 0"), None,
                    TEARDOWN, {0: VICTIM0, 1: ("exited", 7, None, "exited with code 7")}),
    "a rank whose script ended with 0 only once the teardown began is a victim": OutcomeCase(
        [RankSnapshot(0, leaving(5, TEARDOWN + 0.1, 0), 0, TEARDOWN + 0.2),
         RankSnapshot(1, ledger(world(5)), 3, 1.0)], ROOT_1, None, TEARDOWN,
        {0: VICTIM0, 1: ("exited", 3, None, "exited with code 3")}),
    # the launcher's notice to the survivors comes before the teardown: a failure after the
    # root cause may be its effect (PeerFailed caught, then sys.exit(2))
    "a rank that failed by itself after the root cause and exited after the teardown is a "
    "victim": OutcomeCase(
        [RankSnapshot(0, leaving(5, 1.5, 2), 2, TEARDOWN + 0.2),
         RankSnapshot(1, ledger(world(5)), 3, 1.0)], ROOT_1, None, TEARDOWN,
        {0: ("victim", 2, None, "exited with code 2"), 1: ("exited", 3, None,
                                                           "exited with code 3")}),
    "a rank that tore itself down on the teardown's SIGTERM after its script ended is a victim":
        OutcomeCase([RankSnapshot(0, ledger(world(5), fault=L.FAULT_TERMINATED,
                                         t_fault=TEARDOWN + 0.1), 0, TEARDOWN + 0.2),
                     RankSnapshot(1, ledger(world(5)), 3, 1.0)], ROOT_1, None, TEARDOWN,
                    {0: VICTIM0, 1: ("exited", 3, None, "exited with code 3")}),
    "the launcher was signalled: every rank it stopped is a victim": OutcomeCase(
        [_torn_down(0), _torn_down(1)], Fault("launcher_signal", TEARDOWN, None, "..."), None,
        TEARDOWN, {0: VICTIM0, 1: VICTIM0}),
    "a rank still running is said so": OutcomeCase(
        [RankSnapshot(0, ledger(world(5)))], None, None, None, {0: ("ok", None, None,
                                                                   "still running")}),
}


@pytest.mark.parametrize("case", CLASSIFY.values(), ids=CLASSIFY.keys())
def test_classify(case: OutcomeCase) -> None:
    outcomes = classify(case.states, case.root, case.hang, case.teardown_at)
    assert {o.rank: (o.outcome, o.exit_code, o.signal, o.detail) for o in outcomes} == case.ends
    assert {o.outcome for o in outcomes} <= set(OUTCOMES)


def test_every_outcome_kind_is_proven_by_a_row() -> None:
    assert {o for case in CLASSIFY.values() for o, *_ in case.ends.values()} == set(OUTCOMES)


def test_outcome_carries_the_pid_for_the_journal() -> None:
    [outcome] = classify([RankSnapshot(0, None, -15, 1.0, pid=4242)], None, None, None)
    assert outcome.as_dict() == {"rank": 0, "pid": 4242, "outcome": "signalled",
                                 "exit_code": None, "signal": "SIGTERM",
                                 "detail": "was killed by SIGTERM"}


@pytest.mark.parametrize("fault, launcher_signal, status, code", [  # the README's table
    (None, None, "succeeded", 0),
    (Fault("raised", 1.0, 1), None, "failed", 1),
    (Fault("exited", 1.0, 1), None, "failed", 1),
    (Fault("signalled", 1.0, 1), None, "failed", 1),
    (Fault("usage_error", 1.0, 1), None, "failed", 1),
    (Fault("hung", 1.0), None, "failed", 3),
    (Fault("launcher_signal", 1.0), signal.SIGINT, "was interrupted", 130),
    (Fault("launcher_signal", 1.0), signal.SIGTERM, "was interrupted", 143),
    (Fault("launcher_signal", 1.0), signal.SIGHUP, "was interrupted", 128 + signal.SIGHUP),
])
def test_run_status_and_exit_code_follow_the_readme_table(fault, launcher_signal, status,
                                                           code) -> None:
    assert run_status(fault, launcher_signal) == (status, code)


RESTARTS_AFTER = {
    "a rank that raised is restarted (it may have met a passing fault)": (FaultKind.RAISED, True),
    "a rank that exited or was killed is restarted": (FaultKind.SIGNALLED, True),
    "a hang is restarted": (FaultKind.HUNG, True),
    "a usage error is not restarted: every process running the script makes it again":
        (FaultKind.USAGE_ERROR, False),
    "a launcher told to stop restarts nothing": (FaultKind.LAUNCHER_SIGNAL, False),
    "a lost job store ends the job": (FaultKind.STORE_LOST, False),
}


@pytest.mark.parametrize("row", RESTARTS_AFTER)
def test_restarts_after(row: str) -> None:
    kind, expected = RESTARTS_AFTER[row]
    assert restarts_after(Fault(kind, 1.0, 1, "...")) is expected


def _deadline_raised(blamed: tuple[int, ...], *slots: L.GroupProgress,
                     fault: int = L.FAULT_RAISED) -> L.RankProgress:
    """Rank 0 raised CollectiveTimeout at 5.0 naming ``blamed``."""
    return ledger(*slots, fault=fault, in_collective=True, t_fault=5.0, blamed=blamed)


DEADLINE = {
    "the ranks a rank's deadline names are hung, it waited": (
        _deadline_raised((1,), world(6, t_enter=4.0)), {1},
        Verdict(True, (1,), (0,), "all_reduce", 5, 1.0, "collective_deadline",
                L.group_key("world"))),
    "in the group it last entered, by its label": (
        _deadline_raised((2,), world(6, t_enter=1.0, members=0b111),
                         group(3, 3, "barrier", 4.5, 0b101, "a")), {1, 2},
        Verdict(True, (2,), (0,), "barrier", 3, 0.5, "collective_deadline", L.group_key("a"),
                "ranks 0,2")),
    "a named rank that already died is its own fault": (
        _deadline_raised((1, 2), world(6, t_enter=4.0)), {2}, None),
    "a failure naming no rank is no hang": (_deadline_raised((), world(6, t_enter=4.0)), {1},
                                            None),
    "a rank that raised before its first collective waited in init_process_group since it "
    "took its rank (a replacement's join; not since the clock's zero, 'collective #-1')": (
        ledger(world(0), fault=L.FAULT_RAISED, t_fault=5.0, t_start=2.0, blamed=(1,)), {1},
        Verdict(True, (1,), (0,), "init_process_group", -1, 3.0, "collective_deadline",
                L.group_key("world"))),
    "a rank leaving is no deadline": (
        _deadline_raised((1,), world(6, t_enter=4.0), fault=L.FAULT_EXITING), {1}, None),
}


@pytest.mark.parametrize("progress, alive, verdict", DEADLINE.values(), ids=DEADLINE.keys())
def test_deadline_verdict(progress, alive, verdict) -> None:
    assert deadline_verdict(0, progress, alive) == verdict


def test_summary_names_the_first_root_cause_each_attempt_and_its_timings() -> None:
    first = AttemptReport(0, [RankOutcome(0, 10, "victim", 0, None, ""),
                              RankOutcome(1, 11, "hung", None, "SIGKILL", "")],
                          "hang: rank 1 never reached all_reduce #5", "rank 1 never reached "
                          "all_reduce #5 (made no progress)", {1: "/l/stacks_rank1.txt"},
                          detect_s=3.2, stop_s=3.5, first_step_s=1.25)
    second = AttemptReport(1, [RankOutcome(0, 12, "ok", 0, None, ""),
                               RankOutcome(1, 13, "ok", 0, None, "")], None)
    text = render("r1", "succeeded", 0, [first, second], "/l", "/l/journal.jsonl", [2.5],
                  "rank output dropped: 10 bytes")
    assert text.splitlines() == [
        "rankguard: run r1 succeeded after 2 attempts (exit code 0)",
        "  root cause: hang: rank 1 never reached all_reduce #5 (attempt 0)",
        "  attempt 0: 0:victim  1:hung",
        "    verdict: rank 1 never reached all_reduce #5 (made no progress)",
        "    stacks: /l/stacks_rank1.txt",
        "    detected in 3.20 s; all ranks stopped 3.50 s after the fault; first step 1.25 s "
        "after start",
        "  attempt 1: 0:ok  1:ok",
        "  fault to first step of the restarted attempt: 2.50 s",
        "  rank output dropped: 10 bytes",
        "  logs: /l  journal: /l/journal.jsonl"]


def test_summary_of_a_clean_single_attempt_has_no_root_cause() -> None:
    report = AttemptReport(0, [RankOutcome(0, 10, "ok", 0, None, "")], None)
    assert render("r2", "succeeded", 0, [report], "/l", "/j", []).splitlines() == [
        "rankguard: run r2 succeeded after 1 attempt (exit code 0)",
        "  attempt 0: 0:ok", "  logs: /l  journal: /j"]


LIMIT = 5.0
LINGERING = {
    "a script that ended with code 0 the limit ago, its process alive: it lingers":
        (RankSnapshot(1, leaving(11, 1.0, 0)), 1.0 + LIMIT, LIMIT),
    "less than the limit ago: not yet": (RankSnapshot(1, leaving(11, 1.0, 0)), 0.9 + LIMIT, None),
    "its process exited: nothing lingers":
        (RankSnapshot(1, leaving(11, 1.0, 0), returncode=0, exited_at=2.0), 9.0 + LIMIT, None),
    "a script that ended with another code is a fault of its own, not a linger":
        (RankSnapshot(1, leaving(11, 1.0, 3)), 9.0 + LIMIT, None),
    "a script still running does not linger": (RankSnapshot(1, ledger(world(11))), 99.0, None),
    "no ledger read: nothing known": (RankSnapshot(1, None), 99.0, None),
}


@pytest.mark.parametrize("state, now, since", LINGERING.values(), ids=LINGERING.keys())
def test_a_rank_lingers_once_its_script_ended_well_the_limit_ago_and_its_process_lives(
        state, now, since):
    assert lingering(state, now, LIMIT) == since
