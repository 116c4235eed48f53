"""A DDP bucket's all-reduce on an NCCL group, handed on only once it is known good.

With ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` (what rankguard sets: its verdicts and aborts decide,
not torch's watchdog, which kills the rank) an NCCL collective whose peer died ends on the GPU
with the local buffer as it was, and nothing raises where the script reads it: on an H100 a
survivor all-reduced 1.0 where 2.0 was due, and a DDP step of ``StepLoop`` completed on the
survivor's own gradients (docs/nccl-plan.md, GPU run 3). torch's default mode would have killed
the rank instead, and ``StepLoop`` recovers only from an error.

So the communication hook of ``StepLoop.ddp()`` (``ddp_layout.releasable_mean``) hands DDP a
future of ours for each bucket on an NCCL group (not while a CUDA graph is captured: nothing
may wait then): a side stream waits for the all-reduce (the computing stream does not, so
backward still overlaps it) and records an event; one daemon thread waits for those events in
order and then completes each future with the bucket, or fails it, as :func:`refusal` decides:
torch holds an error for the work (its result, or the group's error: :func:`work_error`), or
rankguard aborted the communicator (the supervisor's notice, a deadline), which marks no work
failed. DDP's backward then raises, with NCCL's words in the error
(``failures.is_nccl_failure``), and ``StepLoop`` recovers before the optimizer runs.

What it costs: backward's end waits on the CPU for the last bucket's all-reduce (the
optimizer's kernels are enqueued after it rather than queued behind it), and a thread wakes
once per bucket. Not yet run on a GPU (2026-11-28): ``tests/gpu/test_nccl_in_place.py`` (bit for
bit after a SIGKILL) and ``bench/in_place_bench.py --device cuda`` (its step time) prove it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from dataclasses import dataclass
from typing import Any

from . import nccl_abort
from .capture_mode import thread_local_for_this_thread

ABORTED = "NCCL communicator was aborted"  # failures.is_nccl_failure reads these words


def refusal(work_error: str | None, aborted_because: str | None, rank: int) -> str | None:
    """Why an all-reduce that ended on the GPU must not be used (None: its result may be):
    ``work_error``, the error torch's NCCL group holds for it (NCCL's remote or system error);
    ``aborted_because``, why rankguard aborted the communicator, if it did (``nccl_abort``):
    an aborted collective ends with its buffer as it was, and no error. Pure."""
    if aborted_because is not None:
        return f"{ABORTED} on rank {rank} ({aborted_because}): a collective it ran is unusable"
    if work_error:
        return work_error
    return None


# what is said of an all-reduce torch holds an error for (its own text is not in reach)
UNNAMED_ERROR = ("NCCL error: the communicator reported an error for this all-reduce "
                 "(ncclRemoteError or ncclSystemError: a peer exited or a connection closed)")


def work_error(work: Any, backend: Any) -> str | None:
    """:data:`UNNAMED_ERROR` when torch holds an error for ``work`` (an all-reduce of NCCL
    group ``backend`` whose GPU work has ended), else None; None too when this torch cannot
    tell (then only an abort refuses the result: a healthy all-reduce is never refused for an
    API's sake).

    ``is_completed()`` first: it has torch ask NCCL for the communicator's error and mark the
    work's result (``get_future_result()``: SUCCESS, TIMEOUT, COMM_ERROR); the group's own
    error (``get_error()``), which torch's watchdog sets on its next pass, backs it up.
    ``Work.exception()`` and ``is_success()`` cannot serve on torch 2.11: the first raises
    TypeError for every work, the second NotImplementedError for NCCL's (review of torch's
    source, 2026-11-28)."""
    try:
        work.is_completed()
    except Exception:  # noqa: BLE001 (this torch cannot tell)
        return None
    for read in (lambda: _result_is_bad(work.get_future_result()),
                 lambda: _is_error(backend.get_error())):
        try:
            if read():
                return UNNAMED_ERROR
        except Exception:  # noqa: BLE001 (an API this torch lacks: the next one, or nothing)
            continue
    return None


def _result_is_bad(result: Any) -> bool:
    """Whether a work's result future (``Work.get_future_result()``) says it failed; not yet
    marked is not a failure."""
    return bool(result.done()) and int(result.value()) != 0  # WorkResult.SUCCESS


def _is_error(error: Any) -> bool:
    """Whether an NCCL group's ``get_error()`` (an ``ErrorType``) is not SUCCESS."""
    return int(error) != 0


class _Refused:
    """The value the checker gives a bucket's inner future it refuses: the future handed to
    DDP raises with ``why`` (:func:`_handed_on`)."""

    def __init__(self, why: str) -> None:
        self.why = why


def _handed_on(done: Any) -> Any:
    """The bucket, or the refusal raised: a failure DDP's C++ code sees as one
    (``Future.set_exception`` completes the C++ future with the exception as its value, and
    DDP then fails to read it as a tensor: "Unable to cast ... to Tensor")."""
    value = done.value()
    if isinstance(value, _Refused):
        raise RuntimeError(value.why)
    return value


@dataclass
class _Pending:
    work: Any
    backend: Any
    side: Any  # the stream that waited for the all-reduce
    done: Any  # the CUDA event recorded on it after the all-reduce
    future: Any
    value: Any


class ResultChecker:
    """Completes the futures of NCCL all-reduces once their GPU work ended, in order, on one
    daemon thread (``rankguard-nccl-results``), started with it (at the first use:
    :func:`checked_future`)."""

    def __init__(self, rank: int) -> None:
        self._rank = rank
        self._queue: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="rankguard-nccl-results", daemon=True).start()
        self._side: dict[Any, Any] = {}  # device -> the stream that waits for its all-reduces

    def checked_future(self, work: Any, backend: Any, value: Any) -> Any:
        """A future that completes with ``value`` once ``work`` (an all-reduce of NCCL group
        ``backend``) ended well on the GPU, or fails with why not (:func:`refusal`)."""
        import torch

        device = value.device
        side = self._side.get(device)
        if side is None:
            side = self._side.setdefault(device, torch.cuda.Stream(device))
        with torch.cuda.stream(side):
            work.wait()  # the side stream waits for the all-reduce, not the computing one
            done = torch.cuda.Event(blocking=True)  # its waiter sleeps rather than spins
            done.record(side)
        # a future completed with CUDA tensors must name their device (torch refuses them
        # otherwise: "not among the expected device(s)")
        inner = torch.futures.Future(devices=[device])
        self._queue.put(_Pending(work, backend, side, done, inner, value))
        return inner.then(_handed_on)

    def _run(self) -> None:
        import torch

        thread_local_for_this_thread()  # its event waits must never break a graph capture
        while True:
            pending = self._queue.get()
            try:
                pending.done.synchronize()  # an all-reduce that never ends: the abort ends it
            except Exception as failure:  # noqa: BLE001 (a CUDA error: the result is unusable)
                why: str | None = f"{type(failure).__name__}: {failure}"
            else:
                why = refusal(work_error(pending.work, pending.backend),
                              nccl_abort.why_aborted(pending.backend), self._rank)
            try:  # on the side stream: DDP's wait then depends on nothing else
                with torch.cuda.stream(pending.side):
                    pending.future.set_result(pending.value if why is None else _Refused(why))
            except Exception as failure:  # noqa: BLE001 (this thread serves every bucket after)
                with contextlib.suppress(Exception):
                    pending.future.set_exception(RuntimeError(
                        f"rankguard could not hand on an NCCL all-reduce's result: {failure}"))


_checker: ResultChecker | None = None
_checker_lock = threading.Lock()


def checked_future(work: Any, backend: Any, value: Any, rank: int) -> Any:
    """:meth:`ResultChecker.checked_future` of this process's checker."""
    global _checker
    with _checker_lock:
        if _checker is None:
            _checker = ResultChecker(rank)
    return _checker.checked_future(work, backend, value)
