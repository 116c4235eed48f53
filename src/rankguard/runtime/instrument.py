"""Zero-code-change instrumentation of torch.distributed.

``install()`` is called by the rank bootstrap as soon as ``torch.distributed`` is imported. It
registers a backend, ``rankguard_gloo``, whose process groups are :class:`InstrumentedGroup`:
a Python subclass of ``ProcessGroup`` that forwards every operation to a real gloo backend and
records it in the progress ledger. Because the whole process group is that object, every
collective reaches it: the ones called from Python (``dist.all_reduce``) and the ones
DistributedDataParallel issues from C++ during backward.

It then patches four functions of ``torch.distributed`` so that user scripts need no change,
wherever torch imported them by name (``DeviceMesh`` calls its own ``init_process_group``):

- ``init_process_group`` and ``new_group``: the ``gloo`` backend (named, or the default for CPU)
  becomes ``rankguard_gloo``. Under the launcher, ``init_method="env://"`` (the default) is
  served by a client of the launcher's store under this attempt's own namespace, so stale keys of
  an earlier attempt can never meet a later one. A store at any other address must answer
  within the run's hang timeout (see ``store_reachable``).
- ``get_backend`` reports ``gloo`` for those groups, as the script expects.
- ``split_group``: the groups it splits off are watched as soon as they exist.

NCCL groups are left as torch makes them (libraries reach for their ``ProcessGroupNCCL``): once
one exists, ``async_groups`` publishes their progress in the ledger from torch's Flight Recorder.
With ``RANKGUARD_GLOO=recorder`` gloo groups are left as they are too and watched the same way
(no bounded collectives then): how the test suite runs the NCCL path on CPU.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator

from ..records import ledger as _ledger
from ..inputs import options
from ..store import sealed, store_host
from ..deadline import Deadline
from ..errors import GroupRetired, UsageError
from . import async_deadline, async_groups, backend_connect, fr_progress, nccl_abort
from . import recorder_slots
from . import bounded as _bounded
from . import deadline_scope
from . import generations, groups, vacancies
from . import probe as _probe
from . import store_reachable
from .fr_progress import Recorder
from .state import WORLD, GroupRecord, current

BACKEND = "rankguard_gloo"

# The names torch.distributed calls on a group object, mapped to the gloo Backend method that
# implements each and to the ledger's name for it.
_OPS = {
    "allreduce": ("allreduce", "all_reduce"),
    "allreduce_coalesced": ("allreduce_coalesced", "all_reduce_coalesced"),
    "allgather": ("allgather", "all_gather"),
    "all_gather_single": ("_allgather_base", "all_gather_into_tensor"),
    "_allgather_base": ("_allgather_base", "all_gather_into_tensor"),
    "allgather_coalesced": ("allgather_coalesced", "all_gather_coalesced"),
    "all_gather_single_coalesced": ("allgather_into_tensor_coalesced", "all_gather_coalesced"),
    "allgather_into_tensor_coalesced": ("allgather_into_tensor_coalesced", "all_gather_coalesced"),
    "broadcast": ("broadcast", "broadcast"),
    "barrier": ("barrier", "barrier"),
    "reduce": ("reduce", "reduce"),
    "gather": ("gather", "gather"),
    "scatter": ("scatter", "scatter"),
    "reduce_scatter": ("reduce_scatter", "reduce_scatter"),
    "reduce_scatter_single": ("_reduce_scatter_base", "reduce_scatter_tensor"),
    "_reduce_scatter_base": ("_reduce_scatter_base", "reduce_scatter_tensor"),
    "reduce_scatter_single_coalesced": ("reduce_scatter_tensor_coalesced", "reduce_scatter_tensor"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor_coalesced", "reduce_scatter_tensor"),
    "alltoall": ("alltoall", "all_to_all"),
    "all_to_all_single": ("alltoall_base", "all_to_all_single"),
    "alltoall_base": ("alltoall_base", "all_to_all_single"),
    "send": ("send", "send"),
    "recv": ("recv", "recv"),
    "recv_anysource": ("recv_anysource", "recv_anysource"),
}


_installed = False  # install() ran in this process


@dataclass
class DefaultGroupForming:
    """``init_process_group`` is forming the default group on the thread that registered this.

    Attributes:
        entered: the ledger recorded init's entry, not its end yet (init records it done
            when it ends, unless the group's creator did once the group was formed).
    """

    entered: bool = False


class _Forming:
    """What ``init_process_group`` tells the group creator that torch calls inside it.

    torch calls a registered backend's creator (:func:`_create_group`) from inside its own
    ``init_process_group`` and ``new_group``, with torch's arguments only (the store, the
    ranks, the options): nothing of ours can ride down that call stack. So our
    ``init_process_group`` registers here, before it calls torch's, the default group it is
    forming, and the creator looks it up. Keyed by thread: a ``new_group`` that another thread
    calls meanwhile forms a sub-group, not the default one.
    """

    def __init__(self) -> None:
        self._by_thread: dict[int, DefaultGroupForming] = {}

    @contextlib.contextmanager
    def default_group(self) -> Iterator[DefaultGroupForming]:
        """Within the block, the calling thread forms the default group."""
        thread, forming = threading.get_ident(), DefaultGroupForming()
        self._by_thread[thread] = forming
        try:
            yield forming
        finally:
            del self._by_thread[thread]

    def on_this_thread(self) -> DefaultGroupForming | None:
        """The default group the calling thread is forming, or None (a sub-group)."""
        return self._by_thread.get(threading.get_ident())


_forming = _Forming()
_MIN_AGREEMENT_S = 0.001  # gloo's least timeout, for a secret's broadcast past its deadline


def _make_op(name: str, backend_method: str, op_name: str) -> Callable[..., Any]:
    code = _ledger.OP_CODES[op_name]
    state = current()
    record_of_id = state.groups.of_id
    tracker = state.completions  # never replaced: bootstrap only sets its lag
    issue = tracker.issue

    def op(self: Any, *args: Any, **kwargs: Any) -> Any:
        group = record_of_id(id(self))
        if not state.record_only:
            return full_path(group, args, kwargs)
        # The path of a job with no deadline, bound or injected fault: the record, then gloo.
        if group.retired is not None:
            raise GroupRetired(group.name, group.retired)
        slot = group.slot
        if slot is None:
            return getattr(group.backend, backend_method)(*args, **kwargs)
        return issue(slot, code, getattr(group.backend, backend_method), args, kwargs)

    def full_path(group: GroupRecord, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if state.bounded:
            _bounded.take_supervisor_notice(group)
        if group.retired is not None:
            raise GroupRetired(group.name, group.retired)
        slot = group.slot
        limit = deadline_scope.current()
        if limit is not None:
            _bounded.limit_options(args, kwargs, limit)
        start = getattr(group.backend, backend_method)
        if slot is None:
            entry, work = 0, start(*args, **kwargs)
        else:
            if group.is_world and state.injector is not None:
                # entered - 1 collectives so far, +1 for init
                state.injector.before_op(slot.entered)
            work = issue(slot, code, start, args, kwargs)
            entry = slot.entered  # this one's number: this thread is the slot's one writer
        if not state.bounded and limit is None:
            return work
        return _bounded.work_class()(work, group, entry, op_name, limit)

    op.__name__ = name
    op.__qualname__ = f"InstrumentedGroup.{name}"
    op.__doc__ = f"``{op_name}`` on the wrapped backend, recorded in the progress ledger."
    return op


def _make_blocking_op(name: str, op_name: str) -> Callable[..., Any]:
    """An operation that returns once it is over, without a work (``monitored_barrier``):
    entered, run, and recorded done however it ends."""
    code = _ledger.OP_CODES[op_name]
    state = current()

    def op(self: Any, *args: Any, **kwargs: Any) -> Any:
        group = state.groups.of(self)
        if group.retired is not None:
            raise GroupRetired(group.name, group.retired)
        slot = group.slot
        if slot is None:
            return getattr(group.backend, name)(*args, **kwargs)
        state.completions.enter(slot, code)
        try:
            return getattr(group.backend, name)(*args, **kwargs)
        finally:
            slot.done()

    op.__name__ = name
    op.__qualname__ = f"InstrumentedGroup.{name}"
    op.__doc__ = f"``{name}`` on the wrapped backend, recorded in the progress ledger."
    return op


def _group_class() -> type:
    """Build the ProcessGroup subclass (torch must be imported first)."""
    import torch
    from torch.distributed import ProcessGroup

    class InstrumentedGroup(ProcessGroup):
        """A process group that records every operation in the ledger, then runs it on gloo.
        What rankguard knows of it is in its record (``runtime.state.GroupRecord``)."""

        def __init__(self, backend: Any, options: Any) -> None:
            super().__init__(options.group_rank, options.group_size)
            self._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, backend)
            self._set_default_backend(ProcessGroup.BackendType.GLOO)

        def getBackendName(self) -> str:  # noqa: N802 (torch's name)
            return "gloo"

    for name, (backend_method, op_name) in _OPS.items():
        setattr(InstrumentedGroup, name, _make_op(name, backend_method, op_name))
    InstrumentedGroup.monitored_barrier = _make_blocking_op("monitored_barrier", "barrier")
    return InstrumentedGroup


def _create_group(options: Any, backend_options: Any) -> Any:
    from torch.distributed import ProcessGroupGloo

    state = current()
    forming = _forming.on_this_thread()
    is_world = forming is not None
    slot = None
    if state.ledger is not None:
        if forming is not None:
            slot = state.ledger.world()
            # The rank joins the rendezvous here (gloo connects to every peer), not earlier:
            # a rank stuck before this point is absent from init, not inside it.
            slot.enter(_ledger.OP_CODES["init_process_group"])
            forming.entered = True
        else:
            slot = state.ledger.add_group(options.group_id, list(options.global_ranks_in_group))
            if slot is None:
                async_groups.say_untracked(options.group_id)
    backend = ProcessGroupGloo(options.store, options.group_rank, options.group_size,
                               timeout=options.timeout)
    backend.options.global_ranks_in_group = list(options.global_ranks_in_group)
    backend.options.group_name = options.group_id
    if is_world and state.generation == 0 and not sealed.from_host():
        sealed.agree(backend, options.group_rank, options.group_size, _agreement_timeout(options))
    ranks = list(options.global_ranks_in_group) or list(range(options.group_size))  # world: []
    record = GroupRecord(name=WORLD if is_world else str(options.group_id), ranks=ranks,
                         rank=ranks[options.group_rank], is_world=is_world, slot=slot,
                         backend=backend)
    group = _group_class_cached()(backend, options)
    state.groups.add(group, record)
    if is_world:
        state.aborted = None  # a new default group: an earlier shutdown's abort is over
        state.left_out = None
    if forming is not None and forming.entered and slot is not None:
        # formed with every peer: what follows is this rank's own (a store connection for the
        # probes), which no peer waits for; slow on a loaded machine while the peers went on,
        # it read as a collective only this rank never completed (a hang blaming every rank)
        slot.done()
        forming.entered = False
    if is_world and state.bounded:  # a replacement probes where generation 0's ranks do
        start_probing(state.probe_store if state.probe_store is not None else options.store,
                      record.rank, options.group_size)
    return group


def _agreement_timeout(options: Any) -> float:
    """The bound of the secret's broadcast when the default group forms: the group's timeout,
    or the collective deadline in force if it is earlier."""
    timeout = options.timeout.total_seconds()
    limit = deadline_scope.current()
    if limit is None:
        return timeout
    return limit.within(timeout).wait_time(at_least=_MIN_AGREEMENT_S)


def start_probing(store: Any, rank: int, size: int) -> None:
    """Answer peers' probes in this generation (the state's ``generation``, of ``size`` ranks),
    and be able to ask
    them. The responder and asker of the first generation are kept for the later ones: their
    store connections were made once (see ``probe.Responder``)."""
    state = current()
    if generations.probe_as(rank, size):
        return
    if state.responder is not None:
        state.responder.close()
    else:
        atexit.register(_stop_probing)
    state.responder = _probe.Responder(store, rank, groups.describe, groups.on_notice,
                                       state.generation)
    state.asker = _probe.Asker(store)
    state.responder.follow(rank, state.generation, size)
    state.asker.generation = state.generation


def _stop_probing() -> None:
    """At exit: stop this rank's responder, and its peers' too where the store's server is
    in this process (it ends with the process)."""
    responder = current().responder
    if responder is None:
        return
    if store_host.hosts_server(responder.store):
        responder.release_peers()
    responder.close()


@functools.cache
def _group_class_cached() -> type:
    return _group_class()


def _translate(backend: Any) -> Any:
    """The instrumented backend where plain gloo would serve the group, else ``backend``.

    Mixed specs (``cpu:gloo,cuda:nccl``) stay as they are: a Python process group replaces the
    whole group, which would drop the NCCL half. So does gloo with ``RANKGUARD_GLOO=recorder``.
    """
    if options.gloo_mode() == "recorder":
        return backend
    if backend is None:
        return backend if _cuda_available() else BACKEND
    return BACKEND if str(backend).lower() == "gloo" else backend


def _watch_async_groups() -> None:
    """Once this rank has a group rankguard does not wrap (NCCL, or gloo in recorder mode),
    publish its progress in the ledger (``async_groups``)."""
    state = current()
    if state.ledger is None:
        return
    from torch.distributed import distributed_c10d as c10d

    recorders = []
    if nccl_abort.nccl_groups():
        recorders.append(Recorder.NCCL)
    if ((options.gloo_mode() == "recorder" and fr_progress.torch_groups())
            or recorder_slots.mixed_group_names()):  # gloo halves of mixed groups
        recorders.append(Recorder.CPU)
    for recorder in recorders:
        async_groups.watch(state.ledger, recorder, state.completions.lag,
                           async_deadline.deadlines, async_deadline.expire,
                           async_deadline.take_notice)
    if Recorder.NCCL in recorders and async_deadline.take_peer_notice not in \
            groups.on_unwrapped_notice:
        groups.on_unwrapped_notice.append(async_deadline.take_peer_notice)
    default = c10d._get_default_group() if c10d.is_initialized() else None
    if (recorders and state.bounded and default is not None
            and state.groups.of(default) is None):  # a default group we do not wrap
        start_probing(c10d._get_default_store(), c10d.get_rank(), c10d.get_world_size())


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _attempt_store(timeout: timedelta) -> Any:
    """A client of the launcher's store, under this attempt's namespace and this process's
    count of default groups formed there (the same on every rank): a default group formed
    again (``destroy_process_group``, then ``init_process_group``) reads its peers' new gloo
    addresses, never the old group's keys, whose addresses a slower peer may still hold open."""
    from torch.distributed import PrefixStore, TCPStore

    state = current()
    assert state.launcher_store is not None
    host, port = state.launcher_store
    store = TCPStore(host, int(port), is_master=False, timeout=timeout)
    state.world_formations += 1
    return PrefixStore(f"{state.namespace}world{state.world_formations}/", store)


def _launchers_store(init_method: Any, kwargs: dict[str, Any]) -> bool:
    """Whether this ``init_process_group`` meets its peers in the launcher's store. If it names
    another store, wait (bounded) until that one answers; raises UsageError if it does not."""
    state = current()
    if not state.namespace or state.launcher_store is None or kwargs.get("store") is not None:
        return False
    where = store_reachable.address(init_method)
    if where is None:
        return False
    if (where[0], str(where[1])) == state.launcher_store:
        return init_method in (None, "env://")
    limit = store_reachable.wait_limit(kwargs.get("timeout"))
    if limit is not None:
        store_reachable.check_store(init_method, where[0], where[1], os.environ.get("RANK", "?"),
                                    limit, state.launcher_store)
    return False


@dataclass
class _Joining:
    """A replacement's ``init_process_group``: it joins the survivors' newest generation where
    its rank's place is vacant (see ``vacancies``), and a later one should that one not
    connect (a member died after it arrived), all within ``vacancies.REPLACEMENT_WAITS`` times
    ``RANKGUARD_REPLACE_TIMEOUT`` (default ``vacancies.JOIN_TIMEOUT_S``)."""

    store: Any  # the base store, as init_process_group made or took it
    place: int
    kwargs: dict[str, Any]  # the script's arguments
    timeout: timedelta  # the group's, once formed
    limit: Deadline
    started: float

    @classmethod
    def of(cls, init_method: Any, kwargs: dict[str, Any]) -> "_Joining":
        from torch.distributed import distributed_c10d as c10d

        timeout = kwargs.get("timeout") or c10d.default_pg_timeout
        place = int(kwargs.get("rank", -1))
        store = kwargs.get("store")
        if store is None:  # init_process_group wraps a store it made itself, as here
            store, place, _ = next(c10d.rendezvous(init_method or "env://", place,
                                                   int(kwargs.get("world_size", -1)),
                                                   timeout=timeout))
            store = c10d.PrefixStore("default_pg", store)
        if place < 0:
            place = int(os.environ.get("RANK", "-1"))
        return cls(store, place, dict(kwargs), timeout, Deadline.after(
            vacancies.REPLACEMENT_WAITS * vacancies.join_timeout()), time.monotonic())

    def next_generation(self) -> dict[str, Any]:
        """The arguments that make ``init_process_group`` create the group of the newest
        generation with this place vacant, once every member arrived. Their timeout bounds the
        backend's connect (as regroup's does, ``generations.connect_bound``); the caller gives
        the group its own timeout after.

        Raises:
            CollectiveTimeout: no such generation formed with this process by the limit.
        """
        group_store, size, members_wait = generations.fill_vacancy(self.store, self.place,
                                                                   self.limit)
        connect = generations.connect_bound(members_wait, self.timeout)
        return {**self.kwargs, "store": group_store, "rank": self.place, "world_size": size,
                "timeout": timedelta(seconds=connect)}

    def can_retry(self) -> bool:
        """After a connect that failed: whether a later generation may still be joined (time
        is left, and no abandoned connect still runs in gloo, which would install its group
        over the next one's); if so, the failed one's group is given up."""
        if self.limit.passed() or backend_connect.still_connecting():
            return False
        groups.retire_all(f"generation {current().generation} did not connect")
        groups.discard_all()
        ledger = current().ledger
        if ledger is not None:
            ledger.world().reset()
        return True


# the torch.distributed functions that issue one collective each (``--inject ...,at=opN`` counts
# them on a default group rankguard does not wrap); the ``*_object`` ones are counted by the
# collectives they call
_COLLECTIVE_CALLS = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_to_all",
                     "all_to_all_single", "barrier", "broadcast", "gather", "reduce",
                     "reduce_scatter", "reduce_scatter_tensor", "scatter", "send", "recv",
                     "isend", "irecv")


def _count_unwrapped_collectives(dist: Any, c10d: Any) -> None:
    """For injected faults at an operation number (``at=opN``): count the collectives a script
    issues through torch.distributed's functions on a default group rankguard does not wrap
    (NCCL's; gloo's under ``RANKGUARD_GLOO=recorder``), which the wrapped group's own count
    cannot see. Only when such a fault is armed: nothing is patched otherwise. Collectives
    issued from C++ (DDP's) are not counted."""
    state = current()
    injector = state.injector
    if injector is None or not injector.has_op_faults:
        return
    issued = [0]

    def counted(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            group = kwargs.get("group")
            if c10d.is_initialized() and (group is None or group is c10d.GroupMember.WORLD) \
                    and state.groups.of(c10d._get_default_group()) is None:
                issued[0] += 1
                injector.before_op(issued[0])
            return original(*args, **kwargs)
        return call

    for name in _COLLECTIVE_CALLS:
        original = getattr(c10d, name, None)
        if original is not None:
            _replace(name, original, counted(original))


def _replace(name: str, original: Any, wrapped: Any) -> None:
    """Point every loaded module of torch.distributed whose ``name`` is ``original`` at
    ``wrapped``: the package and c10d, and the modules that imported the function by name
    before us (``device_mesh``, imported by torch.distributed itself, calls its own
    ``init_process_group`` and ``new_group``). Modules imported later take c10d's, ours."""
    for module_name, module in list(sys.modules.items()):
        if (module_name == "torch.distributed" or module_name.startswith("torch.distributed.")) \
                and getattr(module, name, None) is original:
            setattr(module, name, wrapped)


def install() -> None:
    """Register the instrumented backend and patch torch.distributed. Idempotent."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    global _installed
    if _installed or not dist.is_available():
        return
    state = current()
    dist.Backend.register_backend(BACKEND, _create_group, extended_api=True, devices=["cpu"])

    original_init = c10d.init_process_group
    original_new_group = c10d.new_group
    original_split_group = c10d.split_group
    original_get_backend = c10d.get_backend

    @functools.wraps(original_init)
    def init_process_group(backend: Any = None, init_method: Any = None, *args: Any,
                           **kwargs: Any) -> Any:
        world = state.ledger.world() if state.ledger is not None else None
        if state.injector is not None:
            state.injector.at_init()
        if _launchers_store(init_method, kwargs):
            timeout = kwargs.get("timeout") or c10d.default_pg_timeout
            kwargs["store"] = _attempt_store(timeout)
            kwargs.setdefault("rank", int(os.environ["RANK"]))
            kwargs.setdefault("world_size", int(os.environ["WORLD_SIZE"]))
            kwargs["timeout"] = timeout
            init_method = None
        group_timeout = kwargs.get("timeout")
        joining: _Joining | None = None
        if vacancies.replacing() and state.generation == 0:
            group_timeout = group_timeout or c10d.default_pg_timeout
            joining = _Joining.of(init_method, kwargs)
            init_method, kwargs = None, joining.next_generation()
            state.awaiting_state = True
        backend = _translate(backend)
        state.pg_timeout = group_timeout

        def form() -> Any:
            with _forming.default_group() as forming:
                if world is not None and backend != BACKEND:
                    world.enter(_ledger.OP_CODES["init_process_group"])  # not ours: the nearest
                    forming.entered = True
                try:
                    return original_init(backend, init_method, *args, **kwargs)
                finally:
                    if world is not None and forming.entered:
                        world.done()

        if joining is not None:  # a replacement: its connect is bounded, as a regroup's
            while True:
                connect = kwargs["timeout"].total_seconds()
                began = time.monotonic()
                try:
                    made = backend_connect.within(Deadline.after(connect),
                                                  f"place {kwargs['rank']}'s connect",
                                                  str(backend), form)
                    break
                except RuntimeError as error:
                    failed = generations.not_connected(error, connect, began, "join",
                                                       kwargs["rank"], joining.started)
                    if not joining.can_retry():
                        raise failed from error
                    # a member died between its arrival and the connect: the survivors form
                    # the next generation with this place vacant again (it answers no probe)
                    kwargs = joining.next_generation()
        else:
            made = form()
        if group_timeout is not None and kwargs.get("timeout") != group_timeout:
            c10d._set_pg_timeout(group_timeout)  # a replacement connected within a bound
        _watch_async_groups()
        return made

    @functools.wraps(original_new_group)
    def new_group(*args: Any, **kwargs: Any) -> Any:
        if state.awaiting_state:
            raise UsageError("dist.new_group()", "called by a replacement rank before it "
                             "received the state: the other ranks wait for it in the state's "
                             "exchange and will not make this group",
                             "make your process groups in a callback given to "
                             "loop.on_regroup(fn): StepLoop calls it on every rank when run() "
                             "starts and after each recovery, once the state arrived")
        if len(args) >= 3:
            args = (*args[:2], _translate(args[2]), *args[3:])
        elif kwargs.get("backend") is not None:
            kwargs["backend"] = _translate(kwargs["backend"])
        made = original_new_group(*args, **kwargs)
        _watch_async_groups()
        return made

    @functools.wraps(original_split_group)
    def split_group(*args: Any, **kwargs: Any) -> Any:
        made = original_split_group(*args, **kwargs)
        _watch_async_groups()
        return made

    @functools.wraps(original_get_backend)
    def get_backend(group: Any = None) -> Any:
        name = original_get_backend(group)
        return dist.Backend("gloo") if name == BACKEND else name

    _replace("init_process_group", original_init, init_process_group)
    _replace("new_group", original_new_group, new_group)
    _replace("split_group", original_split_group, split_group)
    _replace("get_backend", original_get_backend, get_backend)
    _count_unwrapped_collectives(dist, c10d)
    _installed = True

