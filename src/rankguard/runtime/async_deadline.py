"""Bounded collectives on groups rankguard does not wrap (NCCL's), with no code change.

The main thread of an NCCL rank only enqueues its collectives; it waits for them later, in
``torch.cuda.synchronize()``, ``work.wait()``, ``tensor.item()``, wherever the script reads a
result. So the deadline is kept by the rank's sampler thread (``async_groups``), which sees
each group's first operation not completed and since when: once it has waited the job's
``--collective-timeout`` (``rankguard.init(collective_timeout=)``), or the main thread's
``rankguard.deadline()`` block has passed while it is pending, :func:`expire` runs on that
thread, in this order:

1. the verdict first (an abort makes every pending operation read completed): the peers are
   asked where they are in the group (``runtime.probe``, in bounded mode), and those that had
   not enqueued the operation are named in a :class:`~rankguard.CollectiveTimeout`;
2. the error is made pending in the main thread, before the abort: the main thread raises it
   as soon as it runs Python again, which is when the abort releases it from its wait (or at
   once, if it was not waiting), and never runs on past the failed collective. It is the
   rank's ``last_failure``, so ``rankguard.regroup()`` leaves out the ranks it names (and
   waits for the abort to end before it destroys the group: :func:`wait_for_abort`), and an
   uncaught one ends the rank with the launcher blaming them;
3. the group's communicator is aborted (``nccl_abort``); if the abort does not return within
   ``COLLECTIVE_ABORT_S`` (it has been reported to hang on some NCCL versions) the rank records
   the error in its ledger, says it, and exits with code 1 (the kill fallback: the launcher
   blames the ranks the error names).

The supervisor's notice that a peer died or hung (``rankguard run`` posts it to ranks in bounded
mode, and waits ``--grace`` for them to end on their own) is taken the same way
(:func:`take_notice`): every NCCL communicator of the rank is aborted, so its process leaves the
GPU at once, and a rank waiting in a collective raises :class:`~rankguard.PeerFailed` there.

Gloo groups under ``RANKGUARD_GLOO=recorder`` are bounded the same way, without the abort
(gloo has none): the error is raised once the main thread runs Python again.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Iterable

from ..records import ledger as _ledger
from ..errors import CollectiveError, CollectiveTimeout, PeerFailed
from ..margins import ANSWER_WINDOW_S
from . import async_groups, fr_progress, nccl_abort
from . import deadline_scope
from .async_groups import Overdue
from .bounded import not_there
from .fr_progress import Recorder
from .groups import notice_text
from .state import WORLD, current

COLLECTIVE_ABORT_S = 10.0  # NCCL's abort of a stuck group: 0.5 to 2.9 s measured (nccl_abort)


def deadlines() -> tuple[float | None, float | None]:
    """The deadlines in force for the sampler (``async_groups.Deadlines``): the job-wide
    seconds per operation, and the instant of the main thread's ``deadline()`` block."""
    limit = deadline_scope.main_thread_limit()
    return deadline_scope.default(), None if limit is None else limit.at


def expire(op: Overdue) -> None:
    """The operation ``op`` passed its deadline: name the missing ranks, abort its group and
    raise the error in the main thread (module doc). Runs on the sampler's thread."""
    error = _explain(op)
    state = current()
    state.last_failure = error
    if op.recorder is not Recorder.NCCL:
        _keep_alive(group for group, _ in _named(op.group, [(g, None) for g in fr_progress.torch_groups()]))
        raise_in_main_thread(error)
        return
    _raise_and_abort(error, _named(op.group, nccl_abort.nccl_groups()), "the group", str(error))


def take_notice(notice: tuple[str, int], waiting: Overdue | None) -> None:
    """The supervisor posted ``notice`` (``died`` or ``hung``, and the rank; see
    ``ledger.notice``): in bounded mode, abort every NCCL communicator of this rank and, if it
    waits in ``waiting``, raise :class:`~rankguard.PeerFailed` there (module doc). Runs on the
    sampler's thread."""
    state = current()
    if not state.bounded:
        return  # the SIGTERM that follows the notice tears the rank down
    kind, failed = notice
    error = None
    if waiting is not None:
        rank = int(os.environ.get("RANK", "0"))
        error = PeerFailed(f"was abandoned: the supervisor reported that "
                           f"{_ledger.notice_text(kind, failed)}", op=waiting.op,
                           seq=waiting.seq, group=waiting.group, rank=rank,
                           missing=[failed] if failed >= 0 else [], waited=waiting.waited_s)
        state.last_failure = error
    if waiting is None or waiting.recorder is Recorder.NCCL:
        _raise_and_abort(error, nccl_abort.nccl_groups(), "the communicators",
                         f"the supervisor reported that {_ledger.notice_text(kind, failed)}")
    elif error is not None:
        _keep_alive(fr_progress.torch_groups())
        raise_in_main_thread(error)


def take_peer_notice(name: str, notice: dict[str, Any]) -> None:
    """A peer reports (``runtime.probe``) that it gave up on the group ``name`` (it raised
    outside a collective, or a collective of its failed), or this rank itself did (``by`` is
    its own rank: ``groups.abandon_world``): in bounded mode, abort that group's NCCL
    communicator, on a thread of its own (the probe's thread answers the peer at once), and,
    for a peer's notice, if this rank waits in an operation of the group, raise
    :class:`~rankguard.PeerFailed` there. A wait on the GPU for a peer that will never enqueue
    its part ends within the abort (0.5 to 2.9 s measured), not at a deadline; later
    collectives of the group fail at once (``internal.world_retired`` says why)."""
    state = current()
    found = nccl_abort.not_aborted(_named(name, nccl_abort.nccl_groups()))
    if not state.bounded or not found:
        return
    sampler = async_groups.sampler()
    own = notice.get("by") == int(os.environ.get("RANK", "-1"))
    waiting = sampler.waiting_in(name) if sampler is not None and not own else None
    error = None
    if waiting is not None:
        by = notice.get("by")
        error = PeerFailed(f"was abandoned: {notice_text(notice)}", op=waiting.op,
                           seq=waiting.seq, group=name, rank=int(os.environ.get("RANK", "0")),
                           missing=[by] if isinstance(by, int) else [], waited=waiting.waited_s)
        state.last_failure = error
    _no_abort_under_way.clear()  # before the answer: the peer's regroup waits for the abort
    threading.Thread(target=_raise_and_abort, args=(error, found, "the group",
                                                    notice_text(notice)),
                     name="rankguard-peer-notice-abort", daemon=True).start()


def _keep_alive(groups: Iterable[Any]) -> None:
    """Never destroy ``groups`` (gloo's, which cannot be aborted): a collective of theirs stays
    stuck, and destroying one at exit would join its worker thread for the group's timeout (as
    ``groups.retire`` does for wrapped groups)."""
    for group in groups:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))


def _raise_and_abort(error: CollectiveError | None, groups: list[tuple[Any, Any]],
                     what: str, reason: str) -> None:
    """Make ``error`` pending in the main thread, then abort ``groups`` (bounded; the kill
    fallback if the abort hangs); ``reason``: why, as later uses of the groups are told."""
    _no_abort_under_way.clear()
    try:
        async_groups.keep_torch_dump()  # before the abort marks every operation completed
        if error is not None:
            raise_in_main_thread(error)
        aborted = nccl_abort.abort(groups, COLLECTIVE_ABORT_S, reason)
        if not aborted.finished and error is not None:
            _give_up(error, f"NCCL's abort of {what} did not return within "
                            f"{COLLECTIVE_ABORT_S:g} s")
    finally:
        _no_abort_under_way.set()


_no_abort_under_way = threading.Event()  # no abort of expire() is under way
_no_abort_under_way.set()


def wait_for_abort(seconds: float) -> bool:
    """Wait, at most ``seconds``, until no abort of :func:`expire` is under way (the main thread
    may catch its error while the abort still runs: the group must not be destroyed under it);
    whether none is."""
    return _no_abort_under_way.wait(max(seconds, 0.0))


def _explain(op: Overdue) -> CollectiveTimeout:
    """The error for ``op``, naming the peers that had not enqueued it (asked, when this rank
    can ask them: bounded mode)."""
    rank = int(os.environ.get("RANK", "0"))
    members = op.ranks or tuple(range(int(os.environ.get("WORLD_SIZE", "1"))))
    peers = [r for r in members if r != rank]
    asker = current().asker
    answers = asker.ask(op.group, peers, window=ANSWER_WINDOW_S) if asker is not None else {}
    missing, states = [], {}
    for peer in peers if answers else []:
        answer = answers.get(peer)
        if (gone := not_there(answer)) is not None:
            missing.append(peer)
            states[peer] = gone
        elif int(answer.get("entered", 0)) < op.seq:
            missing.append(peer)
            states[peer] = (f"had enqueued collectives up to #{answer['entered']}"
                            if answer.get("entered")
                            else "had not enqueued any collective of the group")
    block = deadline_scope.main_thread_limit()
    limit = deadline_scope.default() if block is None or block.seconds is None else block.seconds
    budget = f" of {limit:g} s" if limit is not None else ""
    return CollectiveTimeout(f"passed its deadline{budget}", op=_ledger.op_shown(op.op),
                             seq=op.seq, group=op.group, rank=rank, missing=missing,
                             waited=op.waited_s, peers=states)


def _named(name: str, found: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Of ``found`` (group, backend) pairs, those of the group called ``name`` (``world``:
    the default group)."""
    from torch.distributed import distributed_c10d as c10d

    names = fr_progress.torch_groups()
    default = c10d._get_default_group() if c10d.is_initialized() else None
    return [(group, backend) for group, backend in found
            if (group is default if name == WORLD else names.get(group) == name)]


def _give_up(error: CollectiveError, why: str) -> None:
    """The kill fallback: record ``error`` as this rank's fault, blaming the ranks it names,
    say it, and exit 1 at once."""
    ledger = current().ledger
    if ledger is not None:
        ledger.record_blame(error.missing)
        ledger.record_fault(_ledger.FAULT_RAISED, True)
    try:
        os.write(2, f"rankguard: {error} {why}: exiting 1\n".encode())
    finally:
        os._exit(1)


def raise_in_main_thread(error: BaseException) -> None:
    """Have the main thread raise ``error`` as soon as it runs Python again (at once, if it
    is running it). What it raises is an instance of a subclass of ``type(error)`` made here
    with the same message and attributes: Python raises a class there, not an instance."""
    base = type(error)

    def __init__(self: BaseException) -> None:
        BaseException.__init__(self, *error.args)
        self.__dict__.update(error.__dict__)

    carrier = type(base.__name__, (base,), {"__init__": __init__, "__module__": base.__module__,
                                            "__qualname__": base.__qualname__})
    ident = threading.main_thread().ident
    if ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                                   ctypes.py_object(carrier))
