"""rankguard's pytest plugin: no test of distributed or multiprocess code can wedge CI.

Registered automatically when rankguard is installed (``pytest11`` entry point); ``-p
no:rankguard`` turns it off. What it does for every test:

**A deadline** (``rankguard_deadline`` in the ini file, ``--rankguard-deadline S`` on the
command line, ``@pytest.mark.deadline(S)`` on a test; default 600 s, 0 turns it off). Setup and
call share it; the teardown gets a fresh one of the same length, so the teardown after a failed
or timed-out test is bounded too. When it passes, the stacks of the test process and of every
process the test started are captured, the test's processes are stopped (SIGTERM, then
SIGKILL), the test fails with a report that names where each one was stuck, and the session goes
on with the next test (see ``watchdog``).

**Distributed tests** (``@pytest.mark.ranks(N)``). The test function runs on N rank processes of
a warm pool that share an initialised gloo process group (``torch.distributed`` is ready: call
``dist.get_rank()``, ``dist.all_reduce``...); the values of the fixtures it asks for are pickled
to every rank. One outcome is reported: the rank that failed first, the ranks that were stuck
(with their stacks) and the victims, apart (see ``report``). Every collective in the test is
bounded by the test's remaining time. Pools are reused across tests; one that saw a fault forms
a fresh group generation, or is replaced (see ``warm_ranks``).

**Suites run by every rank of a job** (``torchrun ... -m pytest``): the rank runtime is on,
and the end of the session is a bounded barrier that names a missing rank (see ``session``).

**No leaked processes** (``rankguard_leaks = fail | warn | ignore``, ``--rankguard-leaks``;
default ``fail``). Every process a test started, however, and that is still alive when its
teardown ends is reported with its command line and killed, whatever the teardown raised;
``fail`` makes the teardown fail, or adds the report to the error it raised (see ``leaks``).

**Signals**: the plugin takes two real-time signals of the pytest process, its stack request
(``processes.STACK_SIGNAL``) and the watchdog's interruption (``watchdog.INTERRUPT_SIGNAL``);
SIGUSR1 and SIGUSR2 are left to the tests.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import tempfile
import uuid
import warnings
from collections.abc import Generator
from typing import Any, Literal

import pytest

from ..processes import proctree
from ..deadline import Deadline, check_seconds
from ..errors import PoolUnavailable, UsageError
from ..inputs.options import number
from . import abort, leaks, processes
from . import session as rank_session
from .report import RanksFailed, compose
from .warm_ranks import WarmRanks
from ..serving.placement import Names, ReplicaPlacement
from ..serving.pool_options import placed
from .watchdog import DeadlineExceeded, Phase, Watchdog

PYTEST_FAILED: Literal["failed"] = "failed"  # pytest's word for a failed phase

DEFAULT_DEADLINE_S = 600.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rankguard", "rankguard: tests that can never wedge")
    group.addoption("--rankguard-deadline", dest="rankguard_deadline", default=None,
                    metavar="S", help="deadline of each test in seconds (setup + call; the "
                    "teardown gets as long again); 0 turns it off (default: the ini value, 600)")
    group.addoption("--rankguard-leaks", dest="rankguard_leaks", default=None,
                    choices=leaks.MODES, help="a process left running by a test makes its "
                    "teardown fail, warns, or is ignored (it is killed in every case but ignore)")
    parser.addini("rankguard_deadline", "deadline of each test in seconds (0: off)",
                  default=str(DEFAULT_DEADLINE_S))
    parser.addini("rankguard_leaks", "fail | warn | ignore: processes left running by a test",
                  default="fail")
    parser.addini("rankguard_shutdown_timeout", "under a launcher: seconds the session's "
                  "barriers (its start: the collected tests compared; its end) wait for the "
                  "other ranks",
                  default=str(rank_session.DEFAULT_SHUTDOWN_TIMEOUT_S))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "deadline(seconds): the deadline of this test (rankguard); 0 turns it off")
    config.addinivalue_line(
        "markers", "ranks(n, devices=None): run this test on n rank processes with a gloo "
        "process group, or an NCCL one with rank r on CUDA device devices[r] (rankguard)")
    config.pluginmanager.register(_Guard(config), "rankguard-guard")


def _setting(where: str, value: Any, hint: str, *, off: bool) -> float:
    """A number of seconds from the command line or the ini file, by the rule of every flag
    (``options.number``: plain decimal text, at most ``MAX_SECONDS``; a TOML number is taken as
    is); 0 only when ``off`` (it turns the thing off)."""
    try:
        if isinstance(value, str):
            seconds = number(where, value.strip(), float, 0, hint)
        else:
            seconds = check_seconds(where, value, zero=True, text=False, hint=hint)
        if seconds == 0 and not off:
            raise UsageError(where, f"{value!r} is not above 0", hint)
    except UsageError as error:
        raise pytest.UsageError(str(error)) from None
    return seconds


def _marker_value(item: pytest.Item, marker: pytest.Mark, keyword: str, hint: str,
                  options: frozenset[str] = frozenset()) -> Any:
    """The one value a marker takes, positional or as ``keyword`` (besides the keyword
    ``options`` it may have); UsageError otherwise, naming a keyword it does not take and
    those it does."""
    where = f"{item.nodeid}: @pytest.mark.{marker.name}"
    spelled = ", ".join([*map(repr, marker.args),
                         *(f"{k}={v!r}" for k, v in marker.kwargs.items())])
    unknown = sorted(set(marker.kwargs) - {keyword} - options)
    if unknown:
        takes = " and ".join(f"{k}=" for k in (keyword, *sorted(options)))
        raise UsageError(where, f"unknown keyword {', '.join(f'{k}=' for k in unknown)} in "
                         f"({spelled})", f"it takes {takes}; {hint}")
    given = [*marker.args, *(v for k, v in marker.kwargs.items() if k == keyword)]
    if len(given) != 1:
        raise UsageError(where, f"takes one value, got ({spelled})", hint)
    return given[0]


def _test_deadline(item: pytest.Item, default: float) -> float:
    """The test's budget: its ``deadline`` marker's seconds (the rule of ``rankguard.deadline``
    and ``Pool``: an int or a float, no text; 0 turns it off), else ``default``.

    Raises:
        UsageError: the marker's value is not such a number.
    """
    marker = item.get_closest_marker("deadline")
    if marker is None:
        return default
    hint = "give an int or a float of seconds, e.g. @pytest.mark.deadline(30); 0 turns it off"
    return check_seconds(f"{item.nodeid}: @pytest.mark.deadline",
                         _marker_value(item, marker, "seconds", hint),
                         zero=True, text=False, hint=hint)


def _ranks_placement(item: pytest.Item) -> ReplicaPlacement | None:
    """Where the ranks of a ranks test run (None: not one): ``ranks(n)``, n ranks on the CPU
    over gloo; ``ranks(n, devices=[...])``, rank r on CUDA device ``devices[r]`` over NCCL
    (ranks that share a device are hosts of their own, as in a pool).

    Raises:
        UsageError: the number is not an int from 1 to 64, or the devices are not one visible
            CUDA device index per rank.
    """
    marker = item.get_closest_marker("ranks")
    if marker is None:
        return None
    hint = "give an int from 1 to 64, e.g. @pytest.mark.ranks(2)"
    value = _marker_value(item, marker, "n", hint, frozenset({"devices"}))
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 64:
        raise UsageError(f"{item.nodeid}: @pytest.mark.ranks",
                         f"needs a number of ranks from 1 to 64, got {value!r}", hint)
    devices = marker.kwargs.get("devices")
    if devices is None:
        return ReplicaPlacement(value)
    try:
        return placed(devices, None, value, 1, 0, RANKS_NAMES)[0]
    except UsageError as error:
        raise UsageError(f"{item.nodeid}: {error.what}", error.problem, error.hint) from None


class _Guard:
    """The plugin's state for one test process (one per xdist worker)."""

    def __init__(self, config: pytest.Config) -> None:
        option = config.getoption("rankguard_deadline")
        self.deadline = (_setting("--rankguard-deadline", option, _OFF, off=True)
                         if option is not None else
                         _setting("rankguard_deadline (ini)", config.getini("rankguard_deadline"),
                                  _OFF, off=True))
        self.leaks = config.getoption("rankguard_leaks") or config.getini("rankguard_leaks")
        if self.leaks not in leaks.MODES:
            raise pytest.UsageError(f"rankguard_leaks (ini): {self.leaks!r} is not one of "
                                    f"{', '.join(leaks.MODES)}")
        self.token = uuid.uuid4().hex[:12]
        self._stacks: Any = None  # the file this process's faulthandler dumps into, if ours
        if rank_session.under_launcher():
            shutdown_timeout = _setting("rankguard_shutdown_timeout (ini)",
                                        config.getini("rankguard_shutdown_timeout"),
                                        "give a positive number of seconds, e.g. 60", off=False)
            rank_session.refuse_xdist(config)
            rank_session.start()
            config.pluginmanager.register(rank_session.EveryRank(shutdown_timeout, item_deadline),
                                          "rankguard-every-rank")
        self.tracking = proctree.Tracking(f"pytest-{self.token}")  # see processes
        self.stacks_file = self._answer_stack_requests()
        self._item: pytest.Item | None = None  # the running test
        self.watchdog = Watchdog(self.stacks_file, self.tracking, self._last_words,
                                 backstop=not _faulthandler_timeout(config))
        self.watchdog.install()
        self.scope_tags: dict[int, str] = {}
        self.known: set[int] = set()
        self.pools: dict[ReplicaPlacement, WarmRanks] = {}

    def _answer_stack_requests(self) -> str | None:
        """Register faulthandler on ``processes.STACK_SIGNAL`` in this process, so that the
        children forked from it answer stack requests (into this file), unless the program
        already handles that signal."""
        if signal.getsignal(processes.STACK_SIGNAL) not in (signal.SIG_DFL, None):
            return None
        _sweep_stacks_files()
        fd, path = tempfile.mkstemp(prefix=f"{_STACKS_PREFIX}{os.getpid()}-", suffix=".stacks")
        os.close(fd)
        self._stacks = open(path, "a")  # noqa: SIM115 (lives as long as the session)
        faulthandler.register(processes.STACK_SIGNAL, file=self._stacks, all_threads=True,
                              chain=False)
        return path

    # -- one test ----------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> Generator[None]:
        tag = f"{self.token}/{uuid.uuid4().hex[:8]}"
        item.stash[_TAG] = tag
        item.stash[_KNOWN] = set(self.tracking.processes()) | self.known
        item.stash[_DEADLINE] = None
        try:  # checked once: a bad marker is one error (see ..._refuses_a_bad_marker)
            item.stash[_BUDGET] = _test_deadline(item, self.deadline)
            item.stash[_WORLD] = _ranks_placement(item)
        except UsageError as error:
            item.stash[_BUDGET], item.stash[_WORLD] = self.deadline, None
            item.stash[_BAD_MARKER] = error
        previous = os.environ.get(processes.TAG)
        os.environ[processes.TAG] = tag
        self._item = item
        try:
            return (yield)
        finally:
            self._item = None
            _restore(processes.TAG, previous)

    def _last_words(self, phase: Phase, report: str, why: str) -> bool:
        """The watchdog is about to end this process (the main thread is stuck in C code):
        report the test and finish the session (see ``abort``), kill the pools, clean up.
        Returns whether the report was made."""
        for pool in self.pools.values():
            pool.close(graceful=False)
        self.pools.clear()
        item, told = self._item, False
        if item is not None and item.nodeid == phase.nodeid:
            took = phase.deadline.seconds - phase.deadline.remaining()
            abort.report_and_finish(item, phase.when, report, took, why)
            told = True
        self._clean_up()
        return told

    def _phase(self, item: pytest.Item, when: str) -> Phase | None:
        budget = item.stash[_BUDGET]
        if budget <= 0:
            return None
        deadline = Deadline.after(budget)
        if when == "setup" or item.stash[_DEADLINE] is None:
            item.stash[_DEADLINE] = deadline  # setup and call share it
        if when != "teardown":
            deadline = item.stash[_DEADLINE]
        return Phase(item.nodeid, when, deadline, item.stash[_TAG], str(item.path),
                     item.stash[_KNOWN], getattr(item, "instance", None))

    def _guarded(self, item: pytest.Item, when: str) -> Generator[None]:
        """Run the phase under its deadline. A phase whose deadline passed fails with the
        report, also when the phase raised an error of its own that the interruption did not
        replace (the release ended the child it joined, and it went on to fail): that error
        is the report's cause. A KeyboardInterrupt stays what it is: it ends the session."""
        phase = self._phase(item, when)
        if phase is not None:
            self.watchdog.arm(phase)
        raised: BaseException | None = None
        try:
            result = yield
        except BaseException as error:  # noqa: BLE001 (re-raised below, or the report's cause)
            raised = error
        finally:
            report = self.watchdog.disarm() if phase is not None else None
        if report is not None and not isinstance(raised, (DeadlineExceeded, KeyboardInterrupt)):
            raise DeadlineExceeded(report) from raised
        if raised is not None:
            raise raised
        return result

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None]:
        return (yield from self._guarded(item, "setup"))

    @pytest.hookimpl(tryfirst=True, specname="pytest_runtest_setup")
    def pytest_runtest_setup_refuses_a_bad_marker(self, item: pytest.Item) -> None:
        """A bad marker is the test's one error, in its setup, before its fixtures (inside
        the other plugins' setup wrappers, whose teardowns expect their setup to have run)."""
        bad = item.stash.get(_BAD_MARKER, None)
        if bad is not None:
            raise bad

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None]:
        return (yield from self._guarded(item, "call"))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: Any) -> Generator[None]:
        try:
            result = yield from self._guarded(item, "teardown")
        except BaseException as raised:  # a fixture's, pytest-timeout's Failed, our deadline
            self._check_leaks(item, raised)
            raise
        self._check_leaks(item, None)
        return result

    def _check_leaks(self, item: pytest.Item, raised: BaseException | None) -> None:
        """Kill what the test left running, whatever its teardown did; report it by the
        ``leaks`` mode: as the teardown's error, a note on the error the teardown ``raised``
        (that one stays the error), or a warning."""
        if self.leaks == "ignore":
            return
        described = leaks.collect(item.stash[_TAG], item.stash[_KNOWN] | self.known,
                                  self.tracking)
        if not described:
            return
        error = leaks.LeakedProcesses(item.nodeid, described)
        if self.leaks == "warn":
            warnings.warn(str(error), pytest.PytestWarning, stacklevel=1)
        elif raised is not None:  # BaseException.add_note, which Python 3.10 lacks
            raised.__notes__ = [*getattr(raised, "__notes__", []), f"rankguard: {error}"]
        else:
            raise error

    # -- distributed tests --------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        placement = pyfuncitem.stash[_WORLD]
        if placement is None:
            return None
        world = placement.world_size
        names = pyfuncitem._fixtureinfo.argnames
        try:
            args = pickle.dumps({name: pyfuncitem.funcargs[name] for name in names})
        except Exception as error:  # noqa: BLE001 (any pickling failure)
            raise pytest.UsageError(f"{pyfuncitem.nodeid}: the fixture values of a ranks test "
                                    f"are sent to the ranks, and these cannot be pickled: "
                                    f"{error}") from None
        with self.watchdog.paused() as paused:  # a pool start-up is bounded by its own limit
            pool = self._pool(placement)
        deadline = item_deadline(pyfuncitem)
        if deadline is not None:
            deadline = pyfuncitem.stash[_DEADLINE] = deadline.later(paused[0])
        else:
            deadline = Deadline.after(DEFAULT_DEADLINE_S)
        offsets = {rank: pool.log_size(rank) for rank in range(world)}
        healthy = False
        try:
            answers = pool.run(str(pyfuncitem.path), _qualname(pyfuncitem), args, deadline)
            missing = sorted(set(range(world)) - set(answers))
            text = compose(world, answers, pool.stacks(missing) if missing else {},
                           {r: pool.log_since(r, offsets[r]) for r in range(world)})
            kept = all(answer.get("group", True) for answer in answers.values())
            healthy = (not missing and kept and pool.alive()
                       and (text is None or pool.regroup()))
        finally:
            if not healthy:
                self.pools.pop(placement, None)
                pool.close(graceful=False)
        if text is not None:
            raise RanksFailed(text)
        return True

    def _pool(self, placement: ReplicaPlacement) -> WarmRanks:
        pool = self.pools.get(placement)
        if pool is not None and pool.alive():
            return pool
        if pool is not None:
            pool.close()
        pool = self.pools[placement] = WarmRanks(
            placement, f"{self.token}/pool{placement.world_size}")
        self.known.update(pool.pids)
        return pool

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Generator[None]:
        expired = call.excinfo.value if call.excinfo is not None and isinstance(
            call.excinfo.value, DeadlineExceeded) else None
        report = yield
        if expired is not None and not isinstance(call.excinfo.value, DeadlineExceeded):
            # a unittest case records its own error (or skip) and returns, and pytest reports
            # that one: the phase's expiry stays what fails it, the error its cause
            expired.__cause__ = expired.__cause__ or call.excinfo.value
            report.outcome = PYTEST_FAILED
            report.longrepr = item.repr_failure(pytest.ExceptionInfo.from_exception(expired))
        if call.excinfo is not None and (
                isinstance(call.excinfo.value, (RanksFailed, PoolUnavailable))
                or call.excinfo.value is item.stash.get(_BAD_MARKER, None)):
            report.longrepr = str(call.excinfo.value)  # says it all: no traceback of ours
        return report

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools.clear()

    # -- fixtures of a wider scope -------------------------------------------------------------

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Generator[None]:
        if fixturedef.scope == "function":
            return (yield)
        tag = f"{self.token}/{fixturedef.scope}/{fixturedef.argname}/{uuid.uuid4().hex[:6]}"
        self.scope_tags[id(fixturedef)] = tag
        previous = os.environ.get(processes.TAG)
        os.environ[processes.TAG] = tag
        before = set(self.tracking.processes())
        try:
            return (yield)
        finally:
            self.known |= set(self.tracking.processes()) - before
            _restore(processes.TAG, previous)

    def pytest_fixture_post_finalizer(self, fixturedef: Any, request: Any) -> None:
        tag = self.scope_tags.pop(id(fixturedef), None)
        if tag is None or self.leaks == "ignore":
            return
        described = leaks.collect(tag, set(), None)
        if described:
            warnings.warn(str(leaks.LeakedProcesses(
                f"{fixturedef.scope}-scoped fixture {fixturedef.argname!r}", described)),
                pytest.PytestWarning, stacklevel=1)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._clean_up()

    def _clean_up(self) -> None:
        self.tracking.close(kill=False)
        if self._stacks is not None:
            faulthandler.unregister(processes.STACK_SIGNAL)  # before its fd can be reused
            self._stacks.close()
            os.unlink(self._stacks.name)
            self._stacks = None


_STACKS_PREFIX = "rankguard-pytest-"


def _sweep_stacks_files() -> None:
    """Remove the stacks files of this user's pytest sessions that ended without cleaning up
    (killed): their process, named in the file's name, is gone."""
    folder = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(folder)
                 if n.startswith(_STACKS_PREFIX) and n.endswith(".stacks")]
    except OSError:
        return
    for name in names:
        pid = name[len(_STACKS_PREFIX):].split("-", 1)[0]
        path = os.path.join(folder, name)
        try:
            if (not pid.isdigit() or proctree.alive(int(pid))
                    or os.lstat(path).st_uid != os.geteuid()):
                continue
            os.unlink(path)
        except OSError:
            continue


RANKS_NAMES = Names("@pytest.mark.ranks(devices=)", "@pytest.mark.ranks(gpus_per_replica=)")
_TAG = pytest.StashKey[str]()
_KNOWN = pytest.StashKey[set]()
_DEADLINE = pytest.StashKey["Deadline | None"]()
_BUDGET = pytest.StashKey[float]()  # the test's seconds (0: off)
_WORLD = pytest.StashKey["ReplicaPlacement | None"]()  # where a ranks test's ranks run
_BAD_MARKER = pytest.StashKey[UsageError]()
_OFF = "give a number of seconds, e.g. 30; 0 turns it off"


def item_deadline(item: pytest.Item) -> Deadline | None:
    """The deadline of the item's setup and call, once its setup started (None: off)."""
    return item.stash.get(_DEADLINE, None)


def _faulthandler_timeout(config: pytest.Config) -> float:
    """pytest's ``faulthandler_timeout`` (0 when unset or when that plugin is off)."""
    try:
        return float(config.getini("faulthandler_timeout") or 0)
    except (ValueError, TypeError):
        return 0.0


def _qualname(item: pytest.Function) -> str:
    """``test_x``, or ``TestClass.test_x`` for a method."""
    if item.cls is None:
        return item.originalname
    return f"{item.cls.__qualname__}.{item.originalname}"


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
