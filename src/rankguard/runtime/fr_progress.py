"""Each process group's progress as torch's Flight Recorder keeps it, read inside the rank.

torch records every collective of a group in C++, in a ring of recent entries (the Flight
Recorder), and keeps per group the sequence numbers of the last operation enqueued by the CPU,
started on the device (only with ``TORCH_NCCL_ENABLE_TIMING=1``) and completed. On an NCCL group
the CPU returns at enqueue, so these three tell apart a rank that never issued an operation, one
whose GPU never began it, and one that began it and waits for its peers. This module reads them
without replacing torch's group object, for any backend torch records:

- ``Recorder.NCCL``: NCCL groups, ``_dump_nccl_trace_json`` (CUDA builds);
- ``Recorder.CPU``: the recorder gloo groups use, ``_dump_fr_trace_json`` (every build; on a
  CUDA build it holds no NCCL entry).

Bounds and cost: :meth:`FlightRecorderReader.read` asks for no entries (the per-group status
only: 7 us median on torch 2.13 CPU with 2000 entries held; 5 us on NCCL, 2.11);
:meth:`FlightRecorderReader.entries` (and :meth:`~FlightRecorderReader.active`, the entries not
completed yet) is meant for a verdict, not every tick (about 1 ms with 50 pending on NCCL, JSON;
on gloo torch marks no entry completed, so it reads the whole ring: 23 ms median at 2000 entries
in JSON, 18 to 23 ms read from torch's pickle and parsed, on a loaded 2-core machine);
:meth:`FlightRecorderReader.write_dump` writes torch's full dump (15 ms on gloo at 2000
entries, 17 ms on NCCL; seconds with stack traces, off by default). None of them waits on the group, the
device or a peer: they read what the recorder holds under its own mutex.

Whether the recorder is on is decided from the environment as torch reads it (the buffer size,
``TORCH_FR_BUFFER_SIZE`` before the deprecated ``TORCH_NCCL_TRACE_BUFFER_SIZE``, default 2000
entries on torch 2.11 to 2.13), never by calling it: an off recorder answers like a process
with no group yet, which must not be taken for "nothing enqueued". torch reads the size once,
when its first group is made; a change to the environment after that is not seen by torch and
must not be made.

The numbers are torch's: ``collective_seq_id`` counts each group's collectives from 1 (no entry
for ``init_process_group``), and ``-1`` means none (``started``: none, or not known with timing
off). torch's per-group status is updated by its watchdog and lags the entries by up to about
0.2 s on NCCL. On gloo its completed count is the operation that finished last, which with
operations in flight at once may be an earlier one than the last completed: the entries tell
how far a group really got (:func:`completed_upto`).
"""

from __future__ import annotations

import enum
import json
import os
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

from ..errors import RankguardError
from .capture_mode import thread_local_for_this_thread

# torch's buffer size variables, the one that wins first (torch warns about the second)
BUFFER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DEFAULT_ENTRIES = 2000  # torch's default, 2.11 to 2.13, both recorders
TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"  # without it NCCL's "started" is not known
# The dump files' names: the prefix and the rank, as torch's analyser
# (python -m torch.distributed.flight_recorder.fr_trace DIR) finds them; distinct from the
# ``rank_`` of rankguard's own dumps (observe/flight_recorder.py) so both can be analysed.
DUMP_PREFIX = "torch_fr_rank_"

OpState = Literal["scheduled", "started", "completed"]


class Recorder(enum.Enum):
    """Which of torch's recorders: NCCL groups', or the one of the other backends (gloo)."""

    NCCL = "nccl"
    CPU = "cpu"


# the recorder -> its (JSON dump, pickle dump) bindings in torch._C._distributed_c10d
_BINDINGS = {Recorder.NCCL: ("_dump_nccl_trace_json", "_dump_nccl_trace"),
             Recorder.CPU: ("_dump_fr_trace_json", "_dump_fr_trace")}

# torch's profiling names of operations (after ``nccl:`` or ``gloo:``) -> the ledger's kinds
_KINDS = {"_allgather_base": "all_gather_into_tensor",
          "all_gather_into_tensor_coalesced": "all_gather_into_tensor",
          "_reduce_scatter_base": "reduce_scatter_tensor",
          "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
          "allreduce_coalesced": "all_reduce_coalesced", "_broadcast_oop": "broadcast",
          "_reduce_oop": "reduce", "all_reduce_barrier": "barrier"}


class FlightRecorderUnavailable(RankguardError):
    """torch's Flight Recorder cannot be read in this process.

    Attributes:
        recorder: the recorder asked for.
        problem: what is missing or off.
        hint: how to turn it on.
    """

    def __init__(self, recorder: Recorder, problem: str, hint: str) -> None:
        self.recorder, self.problem, self.hint = recorder, problem, hint
        super().__init__(f"torch's {recorder.value} Flight Recorder: {problem} ({hint})")


@dataclass(frozen=True)
class GroupCounts:
    """One group's last sequence numbers: enqueued by the CPU, started on the device (-1:
    none, or not known), completed (-1: none)."""

    enqueued: int
    started: int
    completed: int


@dataclass(frozen=True)
class GroupConfig:
    """A group as the recorder names it: torch's group name, its description
    (``default_pg``, or what ``new_group(group_desc=)`` said) and its ranks (global)."""

    name: str
    desc: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Progress:
    """What one read saw: each group's counts by torch's group id (``pg_id``), and the groups'
    configurations by torch's group name. ``names`` links the two for the groups whose entries
    the reader has seen (``pg_id`` -> name); the others' names are not known yet."""

    groups: Mapping[int, GroupCounts]
    configs: Mapping[str, GroupConfig]
    names: Mapping[int, str]

    def config(self, pg_id: int) -> GroupConfig | None:
        """The configuration of group ``pg_id``, if its name is known and torch lists it."""
        name = self.names.get(pg_id)
        return None if name is None else self.configs.get(name)


@dataclass(frozen=True)
class Entry:
    """One operation the recorder holds: its group (``pg_id`` and name), its number in the
    group, its kind (the ledger's name, ``all_reduce``), torch's state for it, whether it
    completed (NCCL marks it ``completed``; gloo leaves it ``scheduled`` and marks it
    ``retired``), when the CPU enqueued it, when its device was seen starting and completing it
    (ns on torch's wall clock; 0: not recorded, as on gloo or with timing off), and the bytes
    of its input tensors (None: a dtype this module does not know)."""

    pg_id: int
    group: str
    seq: int
    kind: str
    state: OpState
    created_ns: int
    completed: bool = False
    started_ns: int = 0
    completed_ns: int = 0
    nbytes: int | None = None


# bytes per element of the dtypes torch names in its entries (c10's ScalarType names)
DTYPE_BYTES = {"Bool": 1, "Byte": 1, "Char": 1, "QInt8": 1, "QUInt8": 1, "Float8_e5m2": 1,
               "Float8_e4m3fn": 1, "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1,
               "Float8_e8m0fnu": 1, "Short": 2, "Half": 2, "BFloat16": 2, "UInt16": 2,
               "Int": 4, "Float": 4, "QInt32": 4, "UInt32": 4, "ComplexHalf": 4, "Long": 8,
               "Double": 8, "UInt64": 8, "ComplexFloat": 8, "ComplexDouble": 16}


def _time_ns(value: Any) -> int:
    """torch's time of an entry: the JSON dump writes it as a string, 0 when not recorded; the
    pickle dump as an int, None when not recorded."""
    return int(value or 0)


def input_bytes(sizes: Any, dtypes: Any) -> int | None:
    """The bytes of an entry's input tensors, from its ``input_sizes`` (a shape per tensor) and
    ``input_dtypes``; None when they do not match or a dtype is not in ``DTYPE_BYTES``. Pure."""
    if not isinstance(sizes, (list, tuple)) or not isinstance(dtypes, (list, tuple)) or \
            len(sizes) != len(dtypes):
        return None
    total = 0
    for shape, dtype in zip(sizes, dtypes):
        width = DTYPE_BYTES.get(str(dtype))
        if width is None or not isinstance(shape, (list, tuple)):
            return None
        count = 1
        for extent in shape:
            count *= int(extent)
        total += count * width
    return total


def entry_of(raw: Mapping[str, Any]) -> Entry:
    """One entry of torch's dump (JSON or pickle: both spellings of its times) as an
    :class:`Entry`. Pure.

    Raises:
        KeyError, TypeError, ValueError: not an entry of torch's dump.
    """
    state = raw.get("state", "scheduled")
    return Entry(int(raw["pg_id"]), str((list(raw.get("process_group", ())) + [""])[0]),
                 int(raw["collective_seq_id"]), op_kind(str(raw.get("profiling_name", ""))),
                 state, _time_ns(raw.get("time_created_ns")),
                 bool(raw.get("retired")) or state == "completed",
                 _time_ns(raw.get("time_discovered_started_ns")),
                 _time_ns(raw.get("time_discovered_completed_ns")),
                 input_bytes(raw.get("input_sizes"), raw.get("input_dtypes")))


def completed_upto(entries: list[Entry], pg_id: int) -> int | None:
    """The last operation of group ``pg_id`` that ``entries`` (oldest first) show completed
    together with every one of the group before it: the first not completed, less one, or the
    last of the group when all are; None when the group has no entry. Pure.

    On gloo this, not torch's per-group ``last_completed_collective``, is how far the group
    got: torch's two gloo worker threads each write the operation they just finished into that
    count, so with operations in flight at once (``async_op=True``) it holds whichever finished
    last, which may be an earlier one than the last completed (torch 2.13). Each entry's
    ``retired`` flag is set when its own operation finishes."""
    last = None
    for entry in entries:
        if entry.pg_id != pg_id:
            continue
        if not entry.completed:
            return entry.seq - 1
        last = entry.seq
    return last


def completed_in_order(active: list[Entry], pg_id: int, enqueued: int) -> int:
    """How far NCCL group ``pg_id`` got, from its entries not completed (``active``, as
    :meth:`FlightRecorderReader.entries` gives them with ``only_active``) and torch's count of
    its enqueued operations: the last enqueued one that is not active. Pure.

    An NCCL group runs its operations in order on one stream, so one that completed means every
    one before it did. torch's own completed count does not: an operation captured in a CUDA
    graph is recorded but never completes, and torch 2.11's count stays before it for good
    (seen on an H100: enqueued 5, completed 3, after the eager #5 that followed a captured #4
    had completed), which would read as a hang as soon as the rank goes quiet. An entry the
    ring has dropped (more operations in flight than its size) counts as completed."""
    pending = {entry.seq for entry in active if entry.pg_id == pg_id and not entry.completed}
    upto = enqueued
    while upto in pending:
        upto -= 1
    return max(upto, 0)


def buffer_size(env: Mapping[str, str] | None = None) -> int:
    """The number of entries torch's recorders keep, read from ``env`` (default: this
    process's environment) as torch reads it; 0 means off.

    Raises:
        ValueError: a buffer size variable is set to something that is not an integer (torch
            itself refuses it).
    """
    env = os.environ if env is None else env
    for name in BUFFER_ENV:
        value = env.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} is not a number of entries "
                                 f"(set it to {DEFAULT_ENTRIES}, or 0 to turn the recorder off)"
                                 ) from None
    return DEFAULT_ENTRIES


def timing_on(env: Mapping[str, str] | None = None) -> bool:
    """Whether NCCL records when each operation starts on the device (``TORCH_NCCL_ENABLE_TIMING``
    set to a true value, as torch reads it)."""
    value = (os.environ if env is None else env).get(TIMING_ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "y")


def op_kind(profiling_name: str) -> str:
    """The ledger's kind of an operation torch names ``profiling_name``: ``nccl:all_reduce`` ->
    ``all_reduce``, ``nccl:send 0->1`` -> ``send``, ``nccl:_allgather_base`` ->
    ``all_gather_into_tensor``; a name the ledger does not know keeps torch's. Pure."""
    name = profiling_name.partition(":")[2] or profiling_name
    name = name.split(" ", 1)[0]
    return _KINDS.get(name, name)


def _ranks(text: Any) -> tuple[int, ...]:
    if isinstance(text, (list, tuple)):
        return tuple(int(r) for r in text)
    return tuple(int(r) for r in str(text).strip("[] ").split(",") if r.strip())


def torch_groups() -> dict[Any, str]:
    """This process's process groups and their names, as torch.distributed's own registry
    holds them now (a copy; empty where this torch keeps none, or torch.distributed was never
    imported)."""
    from torch.distributed import distributed_c10d as c10d

    return dict(getattr(getattr(c10d, "_world", None), "pg_names", None) or {})


def _python_groups() -> dict[str, dict[str, str]]:
    """This process's groups as the dump's ``pg_config`` lists them (name -> name, desc,
    ranks), from torch.distributed's own registry; empty where this torch keeps none."""
    from torch.distributed import distributed_c10d as c10d

    found = {}
    for group, name in torch_groups().items():
        try:
            ranks = c10d.get_process_group_ranks(group)
        except (RuntimeError, ValueError):  # destroyed meanwhile, or not a group of ours
            continue
        found[str(name)] = {"name": str(name), "desc": str(getattr(group, "group_desc", "")),
                            "ranks": str(list(ranks))}
    return found


class FlightRecorderReader:
    """Reads one of torch's recorders in this process (see the module doc).

    Every method may be called from any thread, while another thread is blocked in a
    collective or a device synchronisation (the recorder's own mutex guards its state; the
    calls were measured at 1 to 2 ms with the main thread blocked on NCCL).
    """

    def __init__(self, recorder: Recorder, env: Mapping[str, str] | None = None) -> None:
        """Check that ``recorder`` can be read here.

        Raises:
            FlightRecorderUnavailable: this torch has no such recorder (an NCCL one on a CPU
                build), or the environment turns it off or sets its size to something torch
                refuses.
        """
        self.recorder = recorder
        try:
            size = buffer_size(env)
        except ValueError as exc:
            raise FlightRecorderUnavailable(recorder, str(exc).split(" (")[0],
                                            f"set {BUFFER_ENV[0]}={DEFAULT_ENTRIES}") from None
        if size == 0:
            raise FlightRecorderUnavailable(
                recorder, "it is off (its buffer size is 0)",
                f"set {BUFFER_ENV[0]}={DEFAULT_ENTRIES} before the first process group is made")
        json_name, pickle_name = _BINDINGS[recorder]
        self._json = self._binding(json_name)
        self._pickle = self._binding(pickle_name)
        self._names: dict[int, str] = {}  # pg_id -> torch's group name, from entries seen

    def _binding(self, name: str) -> Callable[..., bytes]:
        import torch.distributed  # noqa: F401  (loads the bindings)
        from torch._C import _distributed_c10d as c10d

        found = getattr(c10d, name, None)
        if found is None:
            raise FlightRecorderUnavailable(
                self.recorder, f"this torch has no {name}",
                "NCCL groups need a CUDA build of torch" if self.recorder is Recorder.NCCL
                else "use torch 2.11 or later")
        return found

    def read(self) -> Progress:
        """Every group's counts and configuration, without entries (cheap: see the module
        doc)."""
        dump = json.loads(self._json(False, False))
        # the JSON dump writes the numbers as strings ("2100")
        groups = {int(pg_id): GroupCounts(int(s["last_enqueued_collective"]),
                                          int(s["last_started_collective"]),
                                          int(s["last_completed_collective"]))
                  for pg_id, s in dump.get("pg_status", {}).items()}
        return Progress(groups, self._configs(dump), dict(self._names))

    @staticmethod
    def _configs(dump: Mapping[str, Any]) -> dict[str, GroupConfig]:
        # gloo's groups are listed as one nameless group without ranks (torch 2.13): left out
        return {name: GroupConfig(str(c.get("name", name)), str(c.get("desc", "")),
                                  _ranks(c.get("ranks", "[]")))
                for name, c in dump.get("pg_config", {}).items() if name}

    def entries(self, only_active: bool) -> list[Entry]:
        """The entries the recorder holds, oldest first; with ``only_active``, those torch has
        not marked completed (on gloo that is every one: see the module doc for the cost).
        Learns the names of their groups for :meth:`read`."""
        self._may_query_events()
        found = self.entries_of(pickle.loads(self._pickle(True, False, only_active)))
        self._learn(found)
        return found

    def active(self) -> list[Entry]:
        """The operations not seen completed, oldest first (for a verdict: its cost is in the
        module doc). Learns the names of their groups for :meth:`read`."""
        return [entry for entry in self.entries(only_active=True) if not entry.completed]

    def _learn(self, entries: list[Entry]) -> None:
        self._names.update((entry.pg_id, entry.group) for entry in entries if entry.group)

    def group_names(self) -> dict[int, tuple[str, str]]:
        """Each group with an entry in the ring: ``pg_id`` -> (torch's group name, its
        description, ``default_pg`` for the default group). Reads every entry (see the module
        doc for the cost): for a group seen for the first time, not every tick."""
        self._may_query_events()
        dump = json.loads(self._json(True, False))
        found = {}
        for entry in dump.get("entries", ()):
            name, desc = (list(entry.get("process_group", ())) + ["", ""])[:2]
            if name:
                found[int(entry["pg_id"])] = (str(name), str(desc))
        self._names.update((pg_id, name) for pg_id, (name, _) in found.items())
        return found

    def dump(self, stack_traces: bool = False) -> dict[str, Any]:
        """torch's own full dump of this rank (every entry; the pickle format, about three
        times cheaper to read than the JSON one: 10 ms at 2000 gloo entries), as a dict.

        ``stack_traces``: with the Python stacks of every entry (seconds on NCCL: never on a
        hang's path)."""
        self._may_query_events()
        return pickle.loads(self._pickle(True, stack_traces, False))

    def _may_query_events(self) -> None:
        """Before a read of entries, which queries the CUDA events of those not completed: this
        thread's queries must not break a CUDA graph capture of another thread's
        (``capture_mode``)."""
        if self.recorder is Recorder.NCCL:
            thread_local_for_this_thread()

    @staticmethod
    def entries_of(dump: Mapping[str, Any]) -> list[Entry]:
        """The entries of a :meth:`dump`, oldest first."""
        return [entry_of(raw) for raw in dump.get("entries", ())]

    def write_dump(self, folder: str, rank: int, stack_traces: bool = False,
                   dump: dict[str, Any] | None = None) -> str:
        """Write torch's own full dump of this rank, ``folder/torch_fr_rank_<rank>``, in the
        pickle format ``python -m torch.distributed.flight_recorder.fr_trace folder`` reads
        (every rank's file in one folder); returns its path. The file is created 0600 and
        replaced atomically (a reader never sees half of it).

        ``stack_traces``: as for :meth:`dump`; ``dump``: one :meth:`dump` already read.

        Raises:
            OSError: the file cannot be written.
        """
        dump = self.dump(stack_traces) if dump is None else dict(dump)
        # torch lists gloo's groups as one nameless group without ranks (2.13), and the
        # analyser needs every group its entries name: take them from torch.distributed
        config = {name: c for name, c in dump.get("pg_config", {}).items() if name}
        dump["pg_config"] = {**_python_groups(), **config}
        path = os.path.join(folder, f"{DUMP_PREFIX}{rank}")
        partial = f"{path}.{os.getpid()}.part"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            with os.fdopen(fd, "wb") as out:
                pickle.dump(dump, out)
            os.replace(partial, path)
        except BaseException:
            try:
                os.unlink(partial)
            except OSError:
                pass
            raise
        return path
