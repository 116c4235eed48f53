"""Suites that every rank of a job runs (Megatron style: ``torchrun ... -m pytest``).

Under a launcher (``RANK``, ``WORLD_SIZE`` > 1, ``MASTER_ADDR`` and ``MASTER_PORT`` set), the
plugin turns on the rank runtime at configure time (``rankguard.init``: SIGTERM teardown,
stacks on demand, bounded collectives for the groups the suite creates). A rank that leaves a
test by itself (it fails, skips or xfails it, or a fixture of it fails at setup or teardown; a
skip by the test's marks is every rank's) retires the group and tells its peers how, so that
none waits for it, or pairs that test's collectives with the next one's.

**The group is re-formed between tests**, so one failure does not fail the rest of the suite:
at the setup of its next test, each rank whose world group was retired posts where it is in the
suite; the ranks resume together at the furthest test any of them reached (a rank behind skips
the tests in between, saying why) and form a fresh generation there (``rankguard.regroup``).
A rank that reached the end of its session posts that instead, before its end-of-session
barrier (without waiting: no peer may be re-forming), so a peer re-forming is not kept waiting
for it: the peer skips its remaining tests, saying that rank is in session teardown, and meets
it at the barrier. A collective that only some ranks run (the others finished the suite) thus
costs one test deadline, plus ``margins.SESSION_END_NOTICE_S`` at most.
If a rank does not reach a test boundary within that test's deadline, re-forming is given up
for the session: that setup fails naming the rank, and later collectives raise
``GroupRetired`` at once.

**The ranks check that they collected the same tests**, in the same order, before the first
test: each brings a fingerprint of its test ids (``collected``) to a store barrier in the store
the launcher hosts (``torchrun``, ``rankguard run``), bounded by ``shutdown_timeout``; ranks
that differ exchange their lists, and every rank stops its session before any test (pytest's
"Interrupted", exit status 2) naming the first test that differs and which ranks have which.
Where no launcher hosts the store (rank 0 hosts it in its ``init_process_group``), the check
is made as the first test's call begins, once the default group exists (its fixtures' setup
has run by then).

The plugin ends the session
with ``rankguard.shutdown``: a bounded barrier, then ``destroy_process_group``; a rank that
never arrives is named on every rank that did, the group is aborted instead, and those ranks'
sessions fail (exit status 1), so no rank waits forever and none reports success by mistake.
``-x`` is not needed for safety.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from typing import Any, Callable, Literal, NoReturn

import pytest

from .. import margins
from ..deadline import Deadline
from ..errors import CollectiveError, GroupRetired
from ..runtime import internal
from .collected import FIX, Collected, agree, difference, digest, ranks_text

DEFAULT_SHUTDOWN_TIMEOUT_S = 60.0


def under_launcher() -> bool:
    """Whether this pytest process is one rank of a multi-rank job."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return False
    return (world > 1 and "RANK" in os.environ and "MASTER_ADDR" in os.environ
            and "MASTER_PORT" in os.environ)


def refuse_xdist(config: pytest.Config) -> None:
    """Under a launcher, refuse pytest-xdist's workers: a rank is one session whose tests pair
    with its peers' by their order, and a worker would take the rank's place in its checks.

    Raises:
        pytest.UsageError: ``-n`` or ``--dist`` asked for workers.
    """
    workers = getattr(config.option, "numprocesses", None)
    dist = getattr(config.option, "dist", "no")
    if not workers and dist == "no":
        return
    asked = f"-n {workers}" if workers else f"--dist {dist}"
    raise pytest.UsageError(
        f"rankguard: pytest-xdist ({asked}) cannot split a suite every rank runs (this is rank "
        f"{os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}): each rank's tests pair "
        f"with its peers' by their order; run each rank without -n (or with -n 0), and let the "
        f"launcher's ranks be the parallelism")


def start() -> None:
    """``rankguard.init()`` in this rank (imported here: the plugin loads in every pytest)."""
    from ..runtime.init import init

    init()


class EveryRank:
    """The plugin's part in a suite every rank runs; registered by the plugin under a launcher.

    ``shutdown_timeout``: seconds the session's end waits for every rank (and the bound of
    re-forming when a test has no deadline). ``deadline_of(item)``: the deadline of the item's
    setup and call, or None.
    """

    def __init__(self, shutdown_timeout: float,
                 deadline_of: Callable[[pytest.Item], Deadline | None]) -> None:
        self.shutdown_timeout = shutdown_timeout
        self._deadline_of = deadline_of
        self._order: dict[str, int] = {}
        self._nodeids: list[str] = []
        self._tests = digest([])  # which tests this rank runs, in their order
        self._compared = False  # whether the ranks compared their collections
        self._resume_at: str | None = None
        self._failure = "a failure"  # why the group was last re-formed (its retirement reason)
        self._gave_up: str | None = None
        self._ended: list[int] = []  # peers found in session teardown when re-forming

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> None:
        """Before the first test: stop every rank if they collected different tests.

        The list is the one the loop runs, read here: a hook after ``modifyitems`` (another
        plugin's ``pytest_collection_finish``) may still have changed it."""
        self._nodeids = [item.nodeid for item in session.items]
        self._order = {nodeid: index for index, nodeid in enumerate(self._nodeids)}
        self._tests = digest(self._nodeids)
        if session.config.option.collectonly:
            return
        # a rank with collection errors stops (pytest's rule): its peers must stop with it
        errors = 0 if session.config.option.continue_on_collection_errors else session.testsfailed
        problem = self._compare(internal.meet_in_job_store, Deadline.after(self.shutdown_timeout),
                                errors)
        if problem is not None:
            _stop(session, problem)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        """Where no launcher hosts the store: compare once the default group exists."""
        if not self._compared and internal.world() is not None:
            problem = self._compare(internal.meet, self._until(item), 0)
            if problem is not None:
                _stop(item.session, problem)

    def _compare(self, meet: Callable[[str, Deadline, str], internal.Meeting | None],
                 limit: Deadline, errors: int) -> str | None:
        """Meet every rank (``meet``: in the job's store, or the default group's) by ``limit``
        with this rank's ``Collected``; the reason to stop every rank, or None (they agree, or
        there is no store to meet in yet: ``meet`` returned None)."""
        name = _collected_name()
        try:
            meeting = meet(name, limit, Collected.of(self._nodeids, errors).dumps())
            if meeting is None:
                return None
            self._compared = True
            if meeting.missing:
                one = len(meeting.missing) == 1
                return (f"rankguard: {ranks_text(meeting.missing)} did not come to compare "
                        f"{'its' if one else 'their'} collected tests within "
                        f"{self.shutdown_timeout:g} s (rankguard_shutdown_timeout): still "
                        f"collecting, stuck, or not comparing "
                        f"({'its session has' if one else 'their sessions have'} "
                        f"--collect-only or -p no:rankguard); every rank stops")
            if agree({rank: Collected.loads(at) for rank, at in meeting.arrived.items()}):
                return None
            lists = meet(f"{name}/tests", Deadline.after(self.shutdown_timeout),
                         json.dumps([self._nodeids, errors]))
            if lists is None or lists.missing:
                late = ranks_text(lists.missing) if lists is not None else "a rank"
                return (f"rankguard: the ranks collected different tests (or had other "
                        f"collection errors), and {late} did not send the list in time; every "
                        f"rank stops; {FIX}")
            brought = {rank: json.loads(at) for rank, at in lists.arrived.items()}
        except (RuntimeError, ValueError) as error:  # StoreStalled is a RuntimeError
            self._compared = True
            return (f"rankguard: could not compare the collected tests with the other ranks "
                    f"through the job's store ({error}); every rank stops")
        problem = (f"rankguard: the ranks collected different tests, so their collectives "
                   f"would pair across tests; every rank stops: "
                   + difference({rank: tests for rank, (tests, _) in brought.items()},
                                {rank: count for rank, (_, count) in brought.items()}))
        internal.exits_on_usage_error(problem)  # every attempt would collect the same again
        return problem

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self._ended:
            pytest.skip(self._ended_reason())
        if self._resume_at is not None:
            if item.nodeid != self._resume_at:
                pytest.skip(self._passed_reason())
            self._resume_at = None
            self._regroup(item)
        elif self._gave_up is None and internal.world_retired() is not None:
            self._reform(item)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Any:
        report = yield
        if (call.excinfo is not None
                and not isinstance(call.excinfo.value, (CollectiveError, GroupRetired))
                and not (call.when == "setup" and report.skipped and _skip_marked(item))):
            abandon(left_test(item.nodeid, call.when, report.outcome,
                              hasattr(report, "wasxfail")))
        return report

    def _reform(self, item: pytest.Item) -> None:
        """Agree with every rank on the test to resume at; skip to it or regroup here."""
        position = json.dumps({"at": self._order.get(item.nodeid, -1), "tests": self._tests})
        self._failure = internal.world_retired() or "a failure"
        meeting = internal.meet(_reform_name(), self._until(item), position)  # sealed
        ended = sorted(rank for rank, at in meeting.arrived.items() if at == _SESSION_END)
        if meeting.missing:
            also = f" ({ranks_text(ended)} in session teardown)" if ended else ""
            self._give_up(f"{ranks_text(meeting.missing)} did not reach a test boundary in "
                          f"time{also}")
        if ended:
            self._ended = ended
            pytest.skip(self._ended_reason())
        positions = {rank: json.loads(at) for rank, at in meeting.arrived.items()}
        other = sorted(rank for rank, at in positions.items() if at["tests"] != self._tests)
        if other:
            self._give_up(f"{ranks_text(other)} collected other tests than rank "
                          f"{os.environ.get('RANK')} (or in another order), so no test is "
                          f"where all meet: run the same tests on every rank (the same "
                          f"files, -k, -m and --lf, and no per-rank deselection)")
        furthest = max(at["at"] for at in positions.values())
        names = {index: nodeid for nodeid, index in self._order.items()}
        if furthest > self._order[item.nodeid]:
            self._resume_at = names[furthest]
            pytest.skip(self._passed_reason())
        self._regroup(item)

    def _passed_reason(self) -> str:
        """Why a test this rank reaches after the others went past it is skipped (naming the
        failure that retired the group: a peer's failed test is reported by that peer)."""
        return (f"rankguard: the other ranks were past this test when the process group was "
                f"re-formed after {self._failure}; all resume at {self._resume_at}")

    def _ended_reason(self) -> str:
        one = len(self._ended) == 1
        return (f"rankguard: {ranks_text(self._ended)} had finished {'its' if one else 'their'} "
                f"tests ({'it is' if one else 'they are'} in session teardown) when the process "
                f"group was to be re-formed after a failure; the rest of this rank's tests are "
                f"skipped")

    def _regroup(self, item: pytest.Item) -> None:
        try:
            internal.regroup(self._until(item), exclude=())
        except (CollectiveError, GroupRetired) as error:
            self._give_up(str(error))

    def _until(self, item: pytest.Item) -> Deadline:
        """When re-forming must have ended: shortly before the test's deadline
        (``margins.reformed_by``), so that a failure is the test's."""
        limit = self._deadline_of(item)
        if limit is None:
            return Deadline.after(self.shutdown_timeout)
        return margins.reformed_by(limit)

    def _give_up(self, why: str) -> None:
        self._gave_up = why
        pytest.fail(f"rankguard: could not re-form the process group after a failure: {why}; "
                    f"the rest of the session's collectives raise GroupRetired", pytrace=False)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self._gave_up is None and not self._ended:
            _announce_end()
        problem = finish(Deadline.after(self.shutdown_timeout))
        if problem is None:
            return
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write("\n")  # end the progress line
            reporter.write_line(f"rankguard: {problem}", red=True)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


_SESSION_END = "end"  # the position a rank in session teardown brings to a re-forming


def _stop(session: pytest.Session, problem: str) -> NoReturn:
    """End the session at once (pytest's "Interrupted", exit status 2), saying ``problem``
    first: every rank learns it at the same barrier, and a launcher stops the ranks that are
    still running as soon as one exits."""
    plugins = session.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is not None:  # from a test's call too, whose output pytest captures
        with capture.global_and_fixture_disabled() if capture is not None else nullcontext():
            reporter.write("\n")  # end the progress line
            reporter.write_line(problem, red=True)
    raise session.Interrupted("rankguard: every rank stops (see above)")


def _collected_name() -> str:
    """The store barrier where the ranks of this attempt compare their collections."""
    return f"rankguard/pytest/collected{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def _reform_name() -> str:
    """The store barrier of the next re-forming (every rank counts the same generations)."""
    return f"rankguard/pytest/reform{internal.next_generation()}/at"


def _announce_end() -> None:
    """Arrive at the next re-forming as a rank in session teardown (see the module's
    docstring); bounded by ``margins.SESSION_END_NOTICE_S``. A store that fails is left to the
    end-of-session barrier to report."""
    if internal.world() is None:
        return
    try:
        internal.arrive(_reform_name(), Deadline.after(margins.SESSION_END_NOTICE_S),
                        _SESSION_END)
    except RuntimeError:  # StoreStalled is one
        pass


def _skip_marked(item: pytest.Item) -> bool:
    """Whether a skip in the item's setup is its marks' (skip, skipif, xfail(run=False)): the
    same on every rank, so none needs telling."""
    return any(item.iter_markers(name) for name in ("skip", "skipif", "xfail"))


def left_test(nodeid: str, when: Literal["setup", "call", "teardown"],
              outcome: Literal["failed", "skipped"], xfail: bool) -> str:
    """How this rank left test ``nodeid`` before its end, in the words of its notice to the
    peers: ``when`` is the phase that raised (setup, call, teardown), ``outcome`` its report's
    (failed, skipped), ``xfail`` whether that was an expected failure."""
    did = "xfailed" if xfail else "skipped" if outcome == "skipped" else "failed"
    return f"{did} {nodeid}" if when == "call" else f"{did} the {when} of {nodeid}"


def abandon(left: str) -> None:
    """This rank ``left`` a test (see ``left_test``) by itself, in any phase (a fixture's setup
    or teardown, the test, a skip or xfail): its peers must not keep waiting for it in that
    test's collectives, nor pair them with the next test's."""
    if "torch.distributed" in sys.modules:
        internal.abandon_world(f"rank {os.environ.get('RANK')} {left}")


def finish(limit: Deadline) -> str | None:
    """The bounded end of a rank's session (the barrier by ``limit``); a reason to fail it, or
    None."""
    report = internal.shutdown(limit)
    if report.clean:
        return None
    internal.blame(report.missing)  # under rankguard run: the launcher blames them, not us
    return f"session teardown: {report.detail}; the process group was aborted"
