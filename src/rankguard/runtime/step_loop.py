"""``rankguard.StepLoop``: a training loop that survives a peer's fault without losing a step.

The loop owns the step counter and calls the user's step function once per step. When a step
fails because a peer did (a ``rankguard.CollectiveError``, ``GroupRetired``, or gloo's or NCCL's
report of a lost peer anywhere in the exception's chain, DDP's backward included), the loop:

1. **regroups** with every rank in its place (``regroup(keep_size=True)``): the failed ranks'
   places wait for replacement processes, which ``rankguard run --recovery in-place`` starts
   (see ``vacancies``);
2. **shares the state** (``peer_state.share``): the ranks agree on the step to resume at, the
   highest any rank completed, and the ranks behind it (the replacement, a rank whose step was
   cut short) receive the state of one that completed it;
3. **rebuilds** the wrappers that hold a process group (``ddp()``, and ``on_regroup``
   callbacks) on the new generation, and runs the step again.

A replacement process runs the same script: its ``init_process_group`` joins the generation
the survivors formed, and its loop begins at step 2 with no state.

What the user promises: a step changes the state only after its last collective (as a DDP step
does: backward's all-reduce, then ``optimizer.step()``), and the state the callables move is all
the state a step depends on (model, optimizer, scheduler, data position; random numbers seeded
from the step, not carried: a cut-short step drew from its rank's RNG before the fault). Then a
step that failed on some rank left that rank's state as it was before the step, and running it
again computes what the fault-free run computes. The gradients of ``ddp()``'s modules are
dropped before a failed step runs again (a replacement starts without any).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..records import ledger as _ledger
from ..records import recovery_file
from ..deadline import check_seconds
from ..errors import (CollectiveError, CollectiveTimeout, GroupRetired, UsageError, first_line,
                      in_chain)
from . import ddp_layout, failures, generations, peer_state, vacancies
from .state import current


_running: "StepLoop | None" = None  # the loop whose run() this process is in


@dataclass(frozen=True)
class Recovery:
    """One recovery of the loop, as this rank saw it.

    Attributes:
        generation: the generation formed.
        step: the step the ranks resumed at.
        replaced: the places a replacement process filled.
        source: the rank whose state the others loaded.
        nbytes: the size of the state sent (0 when no rank needed it).
        regroup_s: seconds forming the generation took (waiting for the replacement included).
        share_s: seconds agreeing on the step and moving the state took.
        cause: the fault that started it, in one line.
        error: the fault that ended it before the loop could resume, in one line ("" when it
            succeeded; then a later recovery took over).
    """

    generation: int
    step: int
    replaced: tuple[int, ...]
    source: int
    nbytes: int
    regroup_s: float
    share_s: float
    cause: str
    error: str = ""


class Rebuilt:
    """A module wrapped in ``DistributedDataParallel`` on the current generation: call it as
    the DDP module it holds (``module`` is that DDP). Made by :meth:`StepLoop.ddp`.

    Each rebuild keeps the **bucket layout** the previous DDP had rebuilt (DDP lays its
    buckets out again after its first backward, in the order the gradients became ready), or
    would have rebuilt in the step the fault cut short (``ddp_layout.predicted``). A fresh DDP
    would start from its initial layout instead, and since gloo's ring all-reduce adds up each
    element in an order that depends on where it sits in the bucket, the first step after a
    recovery would differ from the fault-free run in the last bits.
    """

    def __init__(self, module: Any, options: dict[str, Any]) -> None:
        self._inner_module = module
        self._options = options
        self._ddp: Any = None
        self.layout: ddp_layout.Layout | None = None  # the rebuilt one, once known
        self._ready: ddp_layout.ReadyOrder | None = None  # until the layout is known
        self._next: ddp_layout.Layout | None = None  # what this DDP's next forward lays out

    @property
    def module(self) -> Any:
        """The ``DistributedDataParallel`` of the current generation.

        Raises:
            UsageError: the loop has not started (the DDP is built when ``run()`` begins).
        """
        if self._ddp is None:
            raise UsageError("StepLoop.ddp()", "the DDP module is built when run() starts",
                             "call it from the step function")
        return self._ddp

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def note_layout(self, failed: bool) -> None:
        """After a step (``failed``: one a fault cut short): learn the layout the DDP rebuilt,
        once (a DDP built with a known layout keeps it). Before that, the first step with a
        backward predicts the layout the next forward makes; when that step fails, the step
        is run again by a new DDP, which must start from the predicted layout. (A failed
        step's partial order is never read: the recovery builds a new DDP, recorded anew.)"""
        if self.layout is not None or self._ddp is None:
            return
        self.layout = ddp_layout.rebuilt(self._ddp)
        if self.layout is None and failed:
            self.layout = self._next
        elif self.layout is None and self._ready is not None and self._ready.order:
            # None: DDP will not lay them out again
            self._next = ddp_layout.predicted(self._ddp, self._ready.order)
            self._stop_recording()
        if self.layout is not None:
            self._stop_recording()

    def _stop_recording(self) -> None:
        """Remove the order's hooks: they cost a call per parameter and backward."""
        if self._ready is not None:
            self._ready.close()
            self._ready = None

    def drop_gradients(self) -> None:
        """Forget the module's gradients (``grad = None``, as a replacement's start): a step
        cut short leaves in them what its backward had accumulated, which a step that adds to
        them (``optimizer.zero_grad()`` after ``optimizer.step()``, or micro-batches under
        ``no_sync()``) would add again when it runs once more."""
        for param in self._inner_module.parameters():
            param.grad = None

    def rebuild(self) -> None:
        """A new DDP on the current default group, laid out as the rebuilt layout if known."""
        self._ddp = None  # the old one's reducer goes before the new one registers its hooks
        self._stop_recording()
        self._next = None
        self._ddp = ddp_layout.build(self._inner_module, self._options, self.layout)
        if self.layout is None:
            self._ready = ddp_layout.ReadyOrder(self._ddp)


class StepLoop:
    """Run ``steps`` steps of a training loop; a peer's fault costs no step (see the module).

    Args:
        get_state: returns the state a step depends on (``torch.save``-able: tensors, numbers,
            strings, lists and dicts of them). Called on one healthy rank after a fault, and
            on every rank as ``run()`` starts, to check that what it returns can be sent (its
            tensors' data is not copied for that check).
        load_state: loads what ``get_state`` returned, on the ranks that lack it.
        regroup_timeout: seconds the survivors wait for a replacement to join (default: the
            ``RANKGUARD_REPLACE_TIMEOUT`` that ``rankguard run`` sets, else 60).
        share_timeout: seconds the state's transfer may take.
        max_recoveries: recoveries after which a fault is raised instead.

    Raises:
        UsageError: a bad argument.
    """

    def __init__(self, get_state: Callable[[], Any], load_state: Callable[[Any], None], *,
                 regroup_timeout: float | None = None, share_timeout: float = 60.0,
                 max_recoveries: int = 8) -> None:
        if not callable(get_state) or not callable(load_state):
            raise UsageError("StepLoop", "get_state and load_state must be callables")
        self._get_state, self._load_state = get_state, load_state
        self._regroup_timeout = check_seconds("StepLoop(regroup_timeout)", regroup_timeout,
                                              text=False) \
            if regroup_timeout is not None else vacancies.join_timeout()
        self._share_timeout = check_seconds("StepLoop(share_timeout)", share_timeout,
                                            text=False)
        if isinstance(max_recoveries, bool) or not isinstance(max_recoveries, int) \
                or max_recoveries < 0:
            raise UsageError("StepLoop(max_recoveries)",
                             f"expected a whole number >= 0, got {max_recoveries!r}")
        self._max_recoveries = max_recoveries
        self._step = peer_state.NO_STATE if vacancies.replacing() else 0
        # a replacement tells its launcher once it holds the state and its wrappers are rebuilt
        # (recovery_file): after the first resume that ends well, which may not be the one that
        # brought the state (a peer that fails during the rebuild ends that one)
        self._to_report = vacancies.replacing()
        self._rebuilds: list[Callable[[], None]] = []
        self._wrapped: list[Rebuilt] = []
        self._ran = False
        self.recoveries: list[Recovery] = []

    @classmethod
    def of(cls, stateful: dict[str, Any], **options: Any) -> "StepLoop":
        """A loop whose state is that of ``stateful``'s objects (modules, optimizers,
        schedulers: anything with ``state_dict()`` and ``load_state_dict()``), by name:
        ``StepLoop.of({"model": model, "optimizer": optimizer})``. ``options``: as for the
        constructor.

        Raises:
            UsageError: ``stateful`` is not a dict, or one of its objects is a class or has no
                ``state_dict``/``load_state_dict``.
        """
        if not isinstance(stateful, Mapping):
            raise UsageError("StepLoop.of()", "expected a dict of objects by name, got "
                             f"{type(stateful).__name__}",
                             'give {"model": model, "optimizer": optimizer}')
        for name, thing in stateful.items():
            if isinstance(thing, type):
                raise UsageError("StepLoop.of()", f"{name!r} is a class, not an object of it",
                                 "give the module or optimizer itself")
            if not callable(getattr(thing, "state_dict", None)) or \
                    not callable(getattr(thing, "load_state_dict", None)):
                raise UsageError("StepLoop.of()", f"{name!r} has no state_dict() and "
                                 "load_state_dict()", "give modules, optimizers, schedulers, "
                                 "or use StepLoop(get_state, load_state)")
        objects = dict(stateful)

        def get_state() -> dict[str, Any]:
            return {name: thing.state_dict() for name, thing in objects.items()}

        def load_state(state: dict[str, Any]) -> None:
            for name, thing in objects.items():
                thing.load_state_dict(state[name])

        return cls(get_state, load_state, **options)

    @property
    def step(self) -> int:
        """How many steps this rank has completed (``peer_state.NO_STATE`` before a
        replacement received its state)."""
        return self._step

    def ddp(self, module: Any, **options: Any) -> Rebuilt:
        """``module`` in ``DistributedDataParallel(module, **options)``, built when ``run()``
        starts and again on each new generation. Build the optimizer on ``module``'s
        parameters: they are the same across rebuilds.

        Raises:
            UsageError: ``module`` is not a ``torch.nn.Module``, or this loop wraps it already
                (two DDPs on one module would each all-reduce its gradients).
        """
        import torch

        if not isinstance(module, torch.nn.Module):
            raise UsageError("StepLoop.ddp()", "expected a torch.nn.Module, got "
                             f"{type(module).__name__}", "give the model itself")
        if any(wrapped._inner_module is module for wrapped in self._wrapped):
            raise UsageError("StepLoop.ddp()", "this loop wraps that module already",
                             "call ddp() once per module and keep what it returns")
        wrapped = Rebuilt(module, options)
        self._wrapped.append(wrapped)
        self._rebuilds.append(wrapped.rebuild)
        return wrapped

    def on_regroup(self, rebuild: Callable[[], None]) -> None:
        """Call ``rebuild()`` when ``run()`` starts and on each new generation, after the state
        arrived: make the process groups and wrappers of your own there."""
        self._rebuilds.append(rebuild)

    def run(self, step_fn: Callable[[int], None], steps: int) -> None:
        """Call ``step_fn(step)`` for each step from the current one up to ``steps``.

        Raises:
            UsageError: ``step_fn`` is not callable, ``steps`` is not a whole number >= 0, no
                process group exists,
                ``run()`` was called before on this loop, another loop's ``run()`` is in
                progress (a loop inside a step), or ``get_state()`` returns what a peer could
                not load (checked before the first step).
            rankguard.CollectiveError: recovery failed (no replacement joined in time, the
                launcher refused to replace the failed rank: ``PeerFailed`` ``rank 1 will not
                be replaced: <why>``, a fault during the transfer, more than
                ``max_recoveries`` faults).
            Exception: whatever ``step_fn`` raised that was not a peer's fault.
        """
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise UsageError("StepLoop.run(steps)", f"expected a whole number >= 0, got {steps!r}")
        if not callable(step_fn):
            raise UsageError("StepLoop.run(step_fn)", "expected a function of the step number, "
                             f"got {type(step_fn).__name__}", "pass the step function first")
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise UsageError("StepLoop.run()", "there is no process group to run the loop on",
                             "call torch.distributed.init_process_group() first")
        if self._ran:
            raise UsageError("StepLoop.run()", "is called once per loop (a replacement "
                             "resumes inside the run its peers are in)",
                             "pass the total number of steps to one run()")
        global _running
        if _running is not None:
            raise UsageError("StepLoop.run()", "another StepLoop is running in this process "
                             "(a loop inside a loop's step cannot recover: its peers' fault "
                             "ends the outer step)", "run one StepLoop at a time")
        self._ran = True
        _running = self
        ledger = current().ledger
        if ledger is not None:
            ledger.set_flag(_ledger.FLAG_STEP_LOOP)
        try:
            self._run(step_fn, steps)
        finally:
            _running = None
            if ledger is not None:
                ledger.clear_flag(_ledger.FLAG_STEP_LOOP)
                ledger.set_flag(_ledger.FLAG_STEP_LOOP_ENDED)

    def _run(self, step_fn: Callable[[int], None], steps: int) -> None:
        # each recovery runs after the except block that caught its fault: an error of the
        # user's get_state or load_state would otherwise carry the peer's fault as its
        # __context__ and be taken for one (peer_fault follows the chain)
        fault = None
        joined = self._step == peer_state.NO_STATE  # a replacement, sent a state a peer checked
        try:
            self._resume()
        except Exception as error:  # noqa: BLE001 (a peer's fault is handled, others raised)
            fault = peer_fault(error)
            if fault is None:
                raise
        if fault is not None:
            self._recover(fault)
        if not joined:  # found at the start, not at the first fault, when it cannot recover
            peer_state.check_sendable(self._state_with_layouts())
        injector = current().injector
        while self._step < steps:
            fault = None
            try:
                if injector is not None:
                    injector.before_step(self._step)
                step_fn(self._step)
            except Exception as error:  # noqa: BLE001 (a peer's fault is handled, others raised)
                fault = peer_fault(error)
                if fault is None or len(self.recoveries) >= self._max_recoveries:
                    raise
            for wrapped in self._wrapped:
                wrapped.note_layout(failed=fault is not None)
            if fault is not None:
                self._recover(fault)
                continue
            self._step += 1

    def _state_with_layouts(self) -> dict[str, Any]:
        return {"state": self._get_state(),
                "layouts": [wrapped.layout for wrapped in self._wrapped]}

    def _load_with_layouts(self, payload: dict[str, Any]) -> None:
        self._load_state(payload["state"])
        for wrapped, layout in zip(self._wrapped, payload["layouts"]):
            wrapped.layout = layout

    def _resume(self, generation: int = 0, replaced: tuple[int, ...] = (),
                regroup_s: float = 0.0, cause: str = "") -> None:
        """Agree on the step, move the state to the ranks behind, rebuild the wrappers."""
        shared = peer_state.share(self._step, self._state_with_layouts,
                                  self._load_with_layouts, timeout=self._share_timeout)
        self._step = shared.step
        for rebuild in self._rebuilds:
            rebuild()
        if self._to_report:
            recovery_file.write(shared, current().generation)
            self._to_report = False
        if cause:
            self.recoveries.append(Recovery(generation, shared.step, replaced, shared.source,
                                            shared.nbytes, regroup_s, shared.took, cause))

    def _recover(self, fault: BaseException) -> None:
        """Form a generation with replacements for the failed ranks and resume in it; again
        after a fault during that (a replacement that died while joining, a second fault),
        until ``max_recoveries``. Without a launcher that starts replacements, a regroup that
        timed out for want of members ends the loop at once (no later one could form); so does
        the launcher's word that it will not replace a failed rank (``vacancies.refusal``:
        the regroup raises ``PeerFailed`` naming it as soon as the word comes).

        Raises:
            RankguardError: the last fault, once the recoveries are spent (or gloo's
                RuntimeError, when that was it).
        """
        while len(self.recoveries) < self._max_recoveries:
            started = time.monotonic()
            try:
                # GroupRetired from regroup: the others left this rank out; it cannot rejoin
                generation = generations.regroup(timeout=self._regroup_timeout, keep_size=True)
            except CollectiveError as again:
                fault = self._failed(started, fault, again)
                if isinstance(again, CollectiveTimeout) and again.missing \
                        and not vacancies.replacements_started():
                    raise  # nobody replaces the members that did not come: no retry can form
                if vacancies.refusal() is not None:
                    raise  # the launcher said it replaces nobody: the attempt ends
                continue
            again = None
            for wrapped in self._wrapped:
                wrapped.drop_gradients()
            try:
                self._resume(generation.number, tuple(generation.replaced),
                             time.monotonic() - started, first_line(fault))
                return
            except Exception as error:  # noqa: BLE001 (a peer's fault is handled, others raised)
                again = peer_fault(error)
                if again is None:
                    raise
            fault = self._failed(started, fault, again)
        raise fault

    def _failed(self, started: float, fault: BaseException, again: BaseException
                ) -> BaseException:
        """Record a recovery that ``again`` ended; returns the fault to recover from next."""
        self.recoveries.append(Recovery(current().generation, self._step, (), -1, 0,
                                        time.monotonic() - started, 0.0, first_line(fault),
                                        first_line(again)))
        return again


def peer_fault(error: BaseException | None) -> BaseException | None:
    """The peer's fault in ``error``'s chain of causes (a ``CollectiveError``, a
    ``GroupRetired``, gloo's error for a connection a peer closed, which a send raises at
    once, or NCCL's for a communicator aborted after a peer's fault), or None when ``error`` is
    not one."""
    return in_chain(error, lambda e: isinstance(e, (CollectiveError, GroupRetired))
                    or failures.is_backend_failure(e))
