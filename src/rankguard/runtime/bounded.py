"""Bounded collectives: work handles whose wait ends, and whose failure names the missing ranks.

In bounded mode (``rankguard.init()``, a ``rankguard.deadline()`` block, or a job-wide default)
every operation of an instrumented group returns a :class:`BoundedWork` instead of gloo's own
handle. The deadline itself is enforced by gloo: the remaining time is set as the operation's
timeout, so gloo fails the operation at the deadline, closes its connections and leaves no
thread behind. That also bounds collectives that DistributedDataParallel issues from C++.

``BoundedWork.wait`` waits in slices of ``SLICE`` so that a retirement from another thread
(a SIGTERM teardown, a supervisor's notice) wakes it within one slice. When the operation fails
it retires the group, asks the peers where they are (``runtime.probe``) and raises
:class:`rankguard.CollectiveTimeout` or :class:`rankguard.PeerFailed`, chained to gloo's error.
"""

from __future__ import annotations

import functools
import time
from datetime import timedelta
from typing import Any

from ..records import ledger as _ledger
from ..deadline import Deadline
from ..errors import CollectiveError, CollectiveTimeout, GroupRetired, PeerFailed
from . import failures, groups
from .failures import Cause
from .peer_wait import PEER_TO_PEER, PeerWait
from .state import GroupRecord, current

SLICE = timedelta(milliseconds=50)
NO_ANSWER = "did not answer (stopped, dead, or holding the GIL)"  # a peer's state in an error
ABSENT = "has no such group (it left it, or its connect failed)"  # an answer's ``absent``


def not_there(answer: dict[str, Any] | None) -> str | None:
    """Why a peer whose probe ``answer`` this is cannot be in the group's operation
    (:data:`NO_ANSWER`, :data:`ABSENT`); None when it answered from the group."""
    if answer is None:
        return NO_ANSWER
    return ABSENT if answer.get("absent") else None
_MIN_TIMEOUT_S = 0.001  # gloo's least timeout for an operation whose deadline has passed


def limit_options(args: tuple[Any, ...], kwargs: dict[str, Any], limit: Deadline) -> None:
    """Give the operation's options the deadline as timeout: its ``opts`` keyword argument
    (``dist.barrier`` passes them so), else its last positional argument."""
    options = kwargs.get("opts", args[-1] if args else None)
    if options is not None and hasattr(options, "timeout"):
        options.timeout = timedelta(seconds=limit.wait_time(at_least=_MIN_TIMEOUT_S))


def retire_and_explain(record: GroupRecord, entry: int, op: str, started: float,
                       limit: Deadline | None, error: BaseException | None,
                       reported: dict[str, Any] | None = None) -> CollectiveError:
    """Retire the group, tell its peers, ask them where they are, and build the error for its
    failed operation number ``entry`` (see :func:`explain`); it becomes the rank's
    ``last_failure``. ``started``: when the operation began (monotonic). ``reported``: the
    notice of the peer that saw the failure first, when that is how this rank learnt of it."""
    waited = time.monotonic() - started
    seq = _ledger.seq_of(entry, record.is_world)
    groups.retire(record, f"{op} #{seq} failed")
    answers = groups.tell_peers(record, {"by": record.rank, "op": op, "seq": seq})
    asker = current().asker
    unasked = asker.last_problem if asker is not None and not answers else ""
    failure = explain(record, entry, op, waited, limit, error, answers, reported, unasked,
                      left_at_start=None if limit is None else limit.at - started)
    current().last_failure = failure
    return failure


def explain(record: GroupRecord, entry: int, op: str, waited: float, limit: Deadline | None,
            error: BaseException | None, answers: dict[int, dict[str, Any] | None],
            reported: dict[str, Any] | None = None, unasked: str = "", *,
            left_at_start: float | None = None) -> CollectiveError:
    """The error for the group's failed operation number ``entry`` (``op``), which waited
    ``waited`` seconds: a :class:`CollectiveTimeout` when it passed ``limit`` (or gloo says it
    timed out), else a :class:`PeerFailed`. It names the peers that had not arrived, from their
    ``answers`` to this rank's probe (peer -> its progress, None: no answer; empty: the peers
    could not be asked). ``error``: gloo's; ``reported``: the notice that told this rank of the
    failure (a peer's, or the supervisor's); ``unasked``: why the peers could not be asked,
    said in the error ("": they could, or there was no one to ask). ``left_at_start``: the
    seconds ``limit`` had left when the operation began (None: its whole budget); a deadline
    made before the operation (a test's, an enclosing block's) is named by that figure, not by
    its budget, which the operation never had."""
    seq = _ledger.seq_of(entry, record.is_world)
    missing, states = [], {}
    for peer in record.peers if answers else []:
        answer = answers.get(peer)
        if (gone := not_there(answer)) is not None:
            states[peer] = gone
            missing.append(peer)
        elif answer["entered"] < entry:
            behind = _ledger.seq_of(answer["entered"], answer["world"])
            states[peer] = (f"was at {answer['op']} #{behind}" if behind > 0
                            else "had not entered any collective")
            missing.append(peer)
        elif answer.get("retired"):
            states[peer] = f"arrived, then gave up ({answer['retired']})"
    text = str(error or "")
    why = failures.cause(text, limit is not None and limit.passed(), reported)
    if why is Cause.SUPERVISOR_NOTICE:
        assert reported is not None
        who = f"rank {reported['rank']}" if reported["rank"] >= 0 else "a rank"
        kind, cause = PeerFailed, (f"was abandoned: the supervisor reported that {who} "
                                   f"{reported['kind']}")
    elif why is Cause.PEER_NOTICE:
        assert reported is not None
        kind, cause = PeerFailed, f"was abandoned: {groups.notice_text(reported)}"
    elif why is Cause.DEADLINE:
        kind, cause = CollectiveTimeout, f"passed its deadline{_budget(limit, left_at_start)}"
    else:
        gloo_says = failures.summary(text) if text else "the supervisor reported a failed peer"
        kind, cause = PeerFailed, f"failed because a peer failed ({gloo_says})"
    if unasked:
        cause += f" (the peers could not be asked where they were: {unasked})"
    return kind(cause, op=op, seq=seq, group=record.name, rank=record.rank,
                missing=missing, waited=waited, peers=states)


_SAME_START_S = 0.1  # a deadline made this close before the operation began is its own


def _budget(limit: Deadline | None, left_at_start: float | None) -> str:
    """`` of 30 s`` (the operation had the deadline's whole budget), `` (5.60 s away when it
    began)``, or nothing (no deadline of ours)."""
    if limit is None:
        return ""
    if left_at_start is None or left_at_start >= limit.seconds - _SAME_START_S:
        return f" of {limit.seconds:.3g} s"
    return f" ({max(left_at_start, 0.0):.2f} s away when it began)"


def take_supervisor_notice(record: GroupRecord) -> None:
    """Retire the group if the supervisor posted, in the ledger, that a peer died or hung."""
    notice = groups.supervisor_notice()
    if notice is not None and record.retired is None:
        kind, rank = notice
        groups.retire(record, f"the supervisor reported that {_ledger.notice_text(kind, rank)}",
                      {"supervisor": True, "kind": kind, "rank": rank})


class BoundedWork:
    """A gloo work handle whose ``wait`` is bounded and explains its failure.

    The behaviour of the handle an operation returns in bounded mode. That handle's class is
    :func:`work_class`'s, which adds torch's ``Work`` as a base (C++ code, DDP's reducer, calls
    these methods through it); it can be made only once torch is imported.
    """

    def __init__(self, inner: Any, group: GroupRecord, entry: int, op: str,
                 limit: Deadline | None) -> None:
        super().__init__()
        self._inner = inner
        self._group = group
        self._entry = entry
        self._op = op
        self._limit = limit
        self._started = time.monotonic()
        self._handed: Any = None  # the future of ours handed to C++, if any
        self._peer_wait: PeerWait | None = None  # a send's or recv's wait, once begun

    def wait(self, timeout: timedelta | None = None) -> bool:
        inner = self._inner
        own = None
        if timeout is not None and timeout > timedelta(0):
            own = Deadline.after(timeout.total_seconds())
        if self._op in PEER_TO_PEER:
            return self._wait_for_peer(own)
        while True:
            try:
                return inner.wait(SLICE)
            except RuntimeError:
                if inner.is_completed():
                    # it may have finished just after this slice timed out: its own
                    # outcome decides, not the slice's timeout
                    try:
                        return inner.wait(SLICE)
                    except RuntimeError as final:
                        raise self._failure(final) from final
                self._raise_if_retired()
                if own is not None and own.passed():
                    raise self._failure(None, own) from None

    def _wait_for_peer(self, own: Deadline | None) -> bool:
        """A send's or recv's wait: gloo's runs once, for the whole deadline, on a thread
        of its own (see ``runtime.peer_wait``), and this one gives up at a notice."""
        if self._peer_wait is None:
            limit = own.sooner(self._limit) if own is not None else self._limit
            self._peer_wait = PeerWait(
                self._inner,
                None if limit is None else limit.wait_time(at_least=_MIN_TIMEOUT_S))
        waiting = self._peer_wait
        while not waiting.over(SLICE.total_seconds()):
            self._raise_if_retired()
        if waiting.error is not None:
            raise self._failure(waiting.error) from waiting.error
        return waiting.result

    def _raise_if_retired(self) -> None:
        group = self._group
        take_supervisor_notice(group)
        if group.retired is not None:
            if group.notice is not None:
                raise retire_and_explain(group, self._entry, self._op, self._started,
                                         self._limit, None, group.notice) from None
            raise GroupRetired(group.name, group.retired) from None

    def _failure(self, error: BaseException | None,
                 limit: Deadline | None = None) -> CollectiveError:
        if error is None and limit is not None:
            error = TimeoutError("timed out")
        return retire_and_explain(self._group, self._entry, self._op, self._started,
                                  limit or self._limit, error)

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def result(self) -> Any:
        return self._inner.result()

    def synchronize(self) -> None:
        self._inner.synchronize()

    def get_future(self) -> Any:
        patch_autograd_backward()
        current().handed_out.append(self)
        return self._inner.get_future()

    def releasable_future(self, value: Any = None) -> Any:
        """A future of ours (a Python one: for a DDP communication hook, not for C++
        code) that completes as the work does, with ``value`` (None: the work's own
        result), or fails as soon as the group retires (a peer's or the supervisor's
        notice), releasing DDP's backward waiting on it."""
        patch_autograd_backward()
        state = current()
        state.handed_out.append(self)
        self._handed = _relayed(self._inner.get_future(), value)
        if state.completions.on_sweep is None:  # the supervisor's notice: polled
            state.completions.on_sweep = _release_handed_out
            groups.on_notice_taken.append(_release_handed_out)  # a peer's: at once
        return self._handed

    def release_if_retired(self) -> None:
        """Fail the future handed to C++ if the group has retired meanwhile (a peer's or
        the supervisor's notice): C++ code waiting on it raises then."""
        handed = self._handed
        if handed is None or handed.done():
            return
        take_supervisor_notice(self._group)
        if self._group.retired is not None:
            _complete(handed, error=RuntimeError(f"rankguard: {self._group.retired}"))

    def explain_if_failed(self) -> CollectiveError | None:
        # the future, not the work: gloo fails the future first, and the C++ waiter can
        # raise before the work itself is marked completed
        future = self._inner.get_future()
        if not future.done():
            group = self._group
            if self._handed is not None and self._handed.done() and group.retired:
                if group.notice is not None:  # released by release_if_retired
                    return retire_and_explain(group, self._entry, self._op, self._started,
                                              self._limit, None, group.notice)
                return self._failure(None, Deadline.after(0.0))
            return None
        try:
            future.wait()  # done: returns at once, or raises gloo's error
        except RuntimeError as error:
            return self._failure(error)
        return None


@functools.cache
def work_class() -> type[BoundedWork]:
    """The class of a bounded work handle: :class:`BoundedWork` on torch's ``Work`` (torch
    must be imported first). Made once per process, at its first bounded operation, which
    patches ``backward()`` too (:func:`patch_autograd_backward`)."""
    import torch.distributed as dist

    patch_autograd_backward()
    return type("BoundedWork", (BoundedWork, dist.Work),
                {"__module__": __name__, "__doc__": BoundedWork.__doc__})


def _relayed(inner: Any, value: Any = None) -> Any:
    """A future of ours that completes as ``inner`` does, with ``value`` if given, else with
    ``inner``'s (or earlier, failed, by ``release_if_retired``). One Python callback: a hook
    that needs another value than ``inner``'s passes it here rather than chaining ``then``."""
    import torch

    ours = torch.futures.Future()

    def relay(done: Any) -> None:
        try:
            result = done.value()
        except Exception as error:  # noqa: BLE001 (gloo's failure, passed on)
            _complete(ours, error=error)
            return
        _complete(ours, value=result if value is None else value)

    inner.add_done_callback(relay)
    return ours


def _complete(future: Any, value: Any = None, error: BaseException | None = None) -> None:
    """Complete ``future`` unless it already is (the relay and a release may race)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except RuntimeError:
        pass  # completed by the other one first


def _release_handed_out() -> None:
    """On the completion sweeper's thread: release C++ waiters of retired groups."""
    for work in list(current().handed_out):
        work.release_if_retired()


_backward_patched = False  # patch_autograd_backward() ran in this process


def patch_autograd_backward() -> None:
    """Make ``backward()`` raise the rankguard error of a collective that C++ code (DDP's
    reducer) issued and that failed, chained to the RuntimeError that C++ raised.

    What it changes: it replaces ``torch.autograd.backward`` (which ``Tensor.backward`` calls),
    for the whole process and for the rest of its life, with a wrapper. The wrapper calls
    torch's; when that raises a RuntimeError while works of ours were handed to C++
    (``RankState.handed_out``), it raises the failure behind them (:func:`failure_behind`)
    instead, chained to torch's error; otherwise torch's error passes unchanged.

    When: at the process's first bounded operation (:func:`work_class`), and at the latest
    when a bounded work's future is handed out (``get_future``, ``releasable_future``); later
    calls do nothing. Not later: a ``backward()`` already running when the patch is made (the
    first one of a DDP whose bucket all-reduce is the process's first bounded operation) would
    call torch's own, and its failure would pass unexplained. A process that never runs a
    bounded operation keeps torch's function.
    """
    global _backward_patched
    if _backward_patched:
        return
    import torch.autograd

    _backward_patched = True
    original = torch.autograd.backward

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except RuntimeError as error:
            failure = failure_behind() if current().handed_out else None
            if failure is None:
                raise
            raise failure from error

    torch.autograd.backward = backward


def failure_behind() -> CollectiveError | None:
    """The collective failure that made C++ code (DDP's backward) raise, if any."""
    handed_out = current().handed_out
    while handed_out:
        work = handed_out.popleft()
        failure = work.explain_if_failed()
        if failure is not None:
            handed_out.clear()
            return failure
    return None
