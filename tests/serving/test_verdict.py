"""The pool's verdict on a failed request (``serving.verdict``), over plain snapshots: the
ranks' answers and deaths in the order they arrived, their ledger positions, which processes
are stopped. No processes: the decision only (the end-to-end proof is in test_pool.py)."""

from __future__ import annotations

import signal
from dataclasses import dataclass

import pytest

from rankguard.serving.verdict import CHANNEL_CLOSED, Ending, Outcome, behind, verdict


@dataclass(frozen=True)
class Pos:
    """A rank's world group in its ledger: how many operations it entered, the last one's kind."""

    entered: int
    kind: str = "all_reduce"


def own(error: str = "ValueError") -> dict:
    return {"error": error, "message": "boom", "traceback": f"Traceback...\n{error}: boom",
            "collective": False, "missing": []}


def victim(error: str = "PeerFailed", missing: tuple[int, ...] = ()) -> dict:
    return {"error": error, "message": "a peer failed", "traceback": f"...\n{error}",
            "collective": True, "missing": list(missing)}


def outcome(*news: tuple[int, str, object]) -> Outcome:
    """The ranks' news in arrival order: (rank, "ok" | "failed" | "dead", result/answer/how)."""
    got = Outcome()
    for rank, kind, value in news:
        got.order.append(rank)
        if kind == "ok":
            got.results[rank] = value
        elif kind == "failed":
            got.failures[rank] = value
        else:
            got.dead[rank] = value
    return got


KILLED = Ending.of(-signal.SIGKILL)  # as the supervisor reports the rank's return code
EXIT3 = Ending.of(3)
TERMINATED = Ending.of(0, terminated=True)  # its ledger says it got SIGTERM and tore itself down

# (world, news, final, positions, stopped) -> (rank, cause, victims, words in the detail);
# None: no verdict yet (or none needed)
CASES = {
    "every rank answered: no verdict": (
        2, outcome((0, "ok", 1), (1, "ok", 2)), False, {}, (), None),
    "a victim's error alone is no verdict before the deadline": (
        2, outcome((0, "failed", victim(missing=(1,)))), False, {}, (), None),
    "a killed rank is the cause at once; the peer in its collective is a victim": (
        2, outcome((0, "failed", victim()), (1, "dead", KILLED)), False, {}, (),
        (1, "signalled", [0], "was killed by SIGKILL during the request")),
    "a rank that exited is the cause": (
        2, outcome((0, "dead", EXIT3)), False, {}, (),
        (0, "exited", [], "exited with code 3 during the request")),
    "a rank that exited 0 after its SIGTERM teardown was signalled, and says so": (
        2, outcome((0, "failed", victim()), (1, "dead", TERMINATED)), False, {}, (),
        (1, "signalled", [0], "got SIGTERM (tore itself down, exited with code 0) during "
         "the request")),
    "a rank its teardown did not save (SIGKILLed) was killed by that signal": (
        2, outcome((1, "dead", Ending.of(-signal.SIGKILL, terminated=True))), False, {}, (),
        (1, "signalled", [], "was killed by SIGKILL during the request")),
    "a rank that channel-closed counts as exited": (
        2, outcome((1, "dead", CHANNEL_CLOSED)), False, {}, (), (1, "exited", [], "closed")),
    "a rank's own exception is the cause, its peer's collective error a consequence": (
        2, outcome((0, "failed", victim()), (1, "failed", own())), False, {}, (),
        (1, "raised", [0], "raised ValueError: boom")),
    "the first news decides between two causes": (
        3, outcome((2, "failed", own("KeyError")), (0, "dead", EXIT3)), False, {}, (),
        (2, "raised", [], "raised KeyError")),
    "at the deadline, a stopped silent rank is frozen": (
        2, outcome((0, "failed", victim("CollectiveTimeout", (1,)))), True,
        {0: Pos(3), 1: Pos(3)}, {1}, (1, "frozen", [0], "was frozen")),
    "at the deadline, the silent rank behind the others never reached their collective": (
        2, outcome((0, "failed", victim("CollectiveTimeout", (1,)))), True,
        {0: Pos(3), 1: Pos(2)}, (), (1, "deadline", [0], "it never reached all_reduce #2")),
    "a rank with no ledger slot entered nothing: it is behind": (
        2, outcome((0, "failed", victim("CollectiveTimeout"))), True, {0: Pos(5, "broadcast")},
        (), (1, "deadline", [0], "it never reached broadcast #4")),
    "every rank silent, none behind: the call's own deadline, no rank to blame": (
        2, outcome(), True, {0: Pos(4), 1: Pos(4)}, (),
        (None, "deadline", [], "the deadline was too short for the call")),
    "every rank silent, one behind: that one is blamed and the others are victims": (
        3, outcome(), True, {0: Pos(4), 1: Pos(4), 2: Pos(3)}, (),
        (2, "deadline", [0, 1], "it never reached all_reduce #3")),
    "a silent rank slower than a peer that answered is blamed though not behind": (
        2, outcome((0, "ok", 1.0)), True, {0: Pos(2), 1: Pos(2)}, (),
        (1, "deadline", [0], "was still running when the request's deadline passed")),
    "two silent ranks behind: the first is named, both are listed": (
        3, outcome((0, "failed", victim("CollectiveTimeout", (1, 2)))), True,
        {0: Pos(6), 1: Pos(5), 2: Pos(5)}, (),
        (1, "deadline", [0], "(ranks 1, 2 did not answer)")),
    "stopped beats behind": (
        3, outcome((0, "failed", victim("CollectiveTimeout"))), True,
        {0: Pos(6), 1: Pos(5), 2: Pos(6)}, {2}, (2, "frozen", [0], "was frozen")),
    "a rank that returned without entering the collective its peer timed out in: different "
    "paths through the call (a validate that refused on one rank only), no rank's fault": (
        2, outcome((0, "ok", "refused"), (1, "failed", victim("CollectiveTimeout", (0,)))), True,
        {1: Pos(1)}, (), (None, "raised", [1], "rank 0 returned from the call without entering "
                          "all_reduce #0, which rank 1 entered and waited in: the ranks took "
                          "different paths")),
    "the same while the peer still waits in it: it is not blamed for being slow": (
        3, outcome((2, "ok", "refused")), True, {0: Pos(2), 1: Pos(2), 2: Pos(1)}, (),
        (None, "raised", [0, 1], "rank 2 returned from the call without entering all_reduce #1, "
         "which ranks 0, 1 entered")),
    "every rank answered with a collective error, none to blame": (
        2, outcome((1, "failed", victim("GroupRetired")),
                   (0, "failed", victim("CollectiveTimeout"))), True, {0: Pos(3), 1: Pos(3)}, (),
        (None, "raised", [0, 1], "failed: rank 1 raised GroupRetired")),
}


def test_every_rank_answered_and_the_first_gave_up_as_the_calls_deadline_passed() -> None:
    """Rank 1 reached the collective late (a slow parse of a large body): rank 0 timed out in
    it, then rank 1 failed in it; neither died. The call's deadline, not a culprit; but a
    timeout of the function's own deadline (the call's has not passed) stays ``raised``."""
    news = outcome((0, "failed", victim("CollectiveTimeout", missing=(1,))),
                   (1, "failed", victim("PeerFailed")))
    error = verdict(2, news, 5.0, final=True, positions={0: Pos(3), 1: Pos(3)},
                    out_of_time=True)
    assert error is not None and (error.rank, error.cause, error.victims) == (
        None, "deadline", [0, 1]), error
    assert "rank 0 gave up waiting for rank 1 in a collective" in error.detail, error.detail
    own_deadline = verdict(2, news, 0.5, final=True, positions={0: Pos(3), 1: Pos(3)})
    assert own_deadline is not None and own_deadline.cause == "raised", own_deadline


@pytest.mark.parametrize("world, news, final, positions, stopped, expected", CASES.values(),
                         ids=CASES.keys())
def test_the_verdict_names_the_rank_that_failed_first_its_cause_and_the_victims(
        world, news, final, positions, stopped, expected) -> None:
    error = verdict(world, news, 1.5, final=final, positions=positions, stopped=stopped)
    if expected is None:
        assert error is None
        return
    rank, cause, victims, words = expected
    assert error is not None
    assert (error.rank, error.cause, error.victims) == (rank, cause, victims), error
    assert words in error.detail, error.detail
    assert error.took == 1.5


def test_a_raised_verdict_carries_the_ranks_traceback_and_error_type() -> None:
    error = verdict(2, outcome((1, "failed", own("ZeroDivisionError"))), 0.2, final=False)
    assert error is not None
    assert error.error_type == "ZeroDivisionError"
    assert error.remote_traceback.endswith("ZeroDivisionError: boom")


def test_ledgers_are_read_only_at_the_deadline() -> None:
    silent = outcome((0, "failed", victim("CollectiveTimeout")))
    assert verdict(2, silent, 1.0, final=False, positions={0: Pos(3), 1: Pos(1)},
                   stopped={1}) is None


@pytest.mark.parametrize("positions, expected", [
    ({}, ([], "")),
    ({0: Pos(3), 1: Pos(3)}, ([], "")),
    ({0: Pos(3), 1: Pos(2, "barrier")}, ([1], "all_reduce #2")),
    ({1: Pos(1, "barrier")}, ([0], "barrier #0")),
])
def test_behind_is_the_ledger_rule_and_names_the_collective(positions, expected) -> None:
    assert behind(2, positions) == expected


def test_an_answer_still_arriving_at_the_deadline_blames_no_rank() -> None:
    # rank 0 had finished: its 300 MB answer was on its way when the deadline passed
    error = verdict(2, outcome((1, "ok", 2.0)), 4.0, final=True,
                    positions={0: Pos(2), 1: Pos(2)}, arriving={0: (120_000_000, 300_000_000)})
    assert error is not None and (error.rank, error.cause) == (None, "deadline"), error
    assert "rank 0's answer was still arriving (120.0 of 300.0 MB received)" in error.detail
    assert "return less" in error.detail


@pytest.mark.parametrize("stopped, positions, blamed", [
    ({1}, {0: Pos(2), 1: Pos(2)}, 1),  # a stopped rank is still frozen
    ((), {0: Pos(2), 1: Pos(2), 2: Pos(1)}, 2),  # one behind is still behind
    ((), {0: Pos(2), 1: Pos(2), 2: Pos(2)}, 2),  # a silent rank whose answer is not arriving
])
def test_an_answer_arriving_excuses_only_its_own_rank(stopped, positions, blamed) -> None:
    world = len(positions)
    news = outcome((1, "ok", 2.0)) if world == 3 else outcome()
    error = verdict(world, news, 4.0, final=True, positions=positions, stopped=stopped,
                    arriving={0: (10, 100)})
    assert error is not None and error.rank == blamed, error
