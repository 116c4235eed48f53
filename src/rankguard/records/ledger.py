"""The progress ledger: what each rank is doing, in shared memory, readable by its supervisor.

One small file per rank (in a private folder of the run under /dev/shm when it exists, see
:func:`make_dir`), mapped into memory by the rank, which
writes it, and by the supervisor, which reads it without locks or system calls. The rank records
for each process group it belongs to how many collectives it has entered and how many of them
completed, the kind of the last one and when. Comparing the ledgers of all ranks tells which
rank never reached the collective the others wait in (see ``launcher.monitor``).

Writes are plain stores into the mapping, a few hundred nanoseconds each. Readers may see a
record that is one update old; nothing depends on a consistent snapshot across fields but the
order within a slot's write (below).

Layout (little-endian):

- header, 64 bytes: magic, version, pid, flags, fault kind, fault-in-collective, exit code (of
  a rank leaving, see ``FAULT_EXITING``), fault time, start time, the ranks the rank's own fault
  blames (a bitmask of the ranks a
  ``rankguard.CollectiveError`` named as not arrived), and a notice from the supervisor that a
  peer failed (the only field the supervisor writes).
- ``MAX_GROUPS`` group slots of 128 bytes, two cache lines with one writer each:
  - the first is the group's identity (key, member bitmask, is-world, size) and what the thread
    that issues its operations writes: the kind of the last op entered, time of the last enter,
    time of the last completion it recorded, entered, and how many completions it recorded;
  - the second, the completions recorded by any other thread (the completion sweeper): time of
    the last, and how many; then, for an asynchronous group (NCCL, written by the rank's
    progress sampler, ``runtime.async_groups``), the last operation its device started and
    the slot's flags (``SLOT_ASYNC``).

  A slot's ``done`` is the sum of the two counts. With one writer per field no write needs a
  lock, and none can lose another's count. Each writer writes its fields in one store sequence,
  times before counts (``_SlotWriter``), so a reader that sees a new count also sees the time
  that came with it (on a machine that keeps stores in order, as x86 does); the reader reads the
  second line before the first, so it never sees more completions than entries.
- a ring of recent operations per slot (``ledger_ring``): each operation entered, with its
  times.
- the injected faults' trailer, written only in a rank where ``--inject`` armed a fault
  (``inject.perform``): the last ``rankguard.StepLoop`` step the rank began (plus one, 0: none),
  then one byte per spec of ``RANKGUARD_INJECT`` (``MAX_INJECTIONS``), set once that fault
  fired. Each byte has its own writer and is written once: no lock.
- the error record, written once by the rank as an exception reaches the top of its script
  (before its fault, ``LedgerWriter.record_error``): the exception's :class:`ErrorKind` and,
  for a kind the launcher acts on (``USAGE``), the first ``ERROR_TEXT_MAX`` bytes of its
  message (UTF-8). Its one writer writes the text first, then the kind.
- the refusal, written by the supervisor only, before the notice it comes with: that the failed
  peer will not be replaced, and why (``rank 1 will not be replaced: no restarts left ...``:
  ``rankguard run --recovery in-place`` refused to repair the fault, the attempt ends),
  ``REFUSAL_TEXT_MAX`` bytes at most (UTF-8) after its length (0: no refusal). A rank's
  ``rankguard.StepLoop`` then ends instead of waiting for a replacement.

Sequence numbers: in the world group, entry 1 is ``init_process_group`` and entry ``k + 1`` is
the ``k``-th collective, so ``seq`` as shown to people (``all_reduce #k``) is ``entered - 1``.
"""

from __future__ import annotations

import dataclasses
import enum
import fcntl
import mmap
import os
import shutil
import stat
import struct
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Iterable, Mapping

from . import ledger_ring as _ring
from ..errors import LedgerError

MAGIC = 0x52474C31  # "RGL1"
# The layout's version, written in each header: raise it with every change of the layout below
# (what changed goes in the commit message).
VERSION = 8
MAX_GROUPS = 64  # the world group and 63 sub-groups
# magic version pid flags fault in_coll exit_code t_fault t_start blamed
HEADER = struct.Struct("<IIqIIIiddQ8x")
_OFF_PID, _OFF_FLAGS, _OFF_FAULT, _OFF_T_FAULT, _OFF_T_START, _OFF_BLAMED = 8, 16, 20, 32, 40, 48
_OFF_EXIT_CODE = 28
SLOT = struct.Struct("<QQIII4xddQQ")  # a slot's first line: identity, issuing thread's part
_SWEPT = struct.Struct("<dQ")  # its second line: completions recorded by other threads
_OFF_SWEPT = 64
_ASYNC = struct.Struct("<qI")  # after _SWEPT: the last operation started on the device, flags
_OFF_ASYNC = _OFF_SWEPT + _SWEPT.size
SLOT_ASYNC = 1  # a slot flag: the group is asynchronous (its counts are torch's, see GroupProgress)
SLOT_HOST = 2  # with SLOT_ASYNC: its operations run on the host (gloo), none on a device
_KEY = struct.Struct("<Q")  # a slot's group key: 0 while no group has taken it
SLOT_SIZE = 128
_EVERY_KEY = struct.Struct("<" + f"Q{SLOT_SIZE - _KEY.size}x" * MAX_GROUPS)  # every slot's key
RING_OFFSET = HEADER.size + MAX_GROUPS * SLOT_SIZE
MAX_INJECTIONS = 64  # the ``--inject`` specs a run may give: one byte of the trailer each
_STEP_BEGUN = struct.Struct("<Q")  # the trailer: the last StepLoop step begun, plus one
_OFF_TRAILER = RING_OFFSET + _ring.size(MAX_GROUPS)
_OFF_FIRED = _OFF_TRAILER + _STEP_BEGUN.size
_ERROR = struct.Struct("<BxH")  # the error record: its kind, the length of its text
_OFF_ERROR = _OFF_FIRED + MAX_INJECTIONS
ERROR_TEXT_MAX = 252  # bytes of the message kept: a UsageError says what and how in one line
_REFUSAL = struct.Struct("<H")  # the refusal: the length of its text
_OFF_REFUSAL = _OFF_ERROR + _ERROR.size + ERROR_TEXT_MAX
REFUSAL_TEXT_MAX = 254  # bytes of the reason kept: replace_rules says it in one line
SIZE = _OFF_REFUSAL + _REFUSAL.size + REFUSAL_TEXT_MAX
_RECORD = _ring.RECORD_SIZE
WORLD_SLOT = 0

# header flag bits
FLAG_BOOTSTRAPPED = 1  # the rank's bootstrap is running
FLAG_STACKS_READY = 2  # the stack-dump signal handler is installed: safe to send it
FLAG_TERMINATING = 4  # the rank got SIGTERM and is tearing itself down
FLAG_BOUNDED = 8  # the rank's collectives are bounded: a supervisor's notice makes them raise
# the rank runs rankguard.StepLoop: it can regroup with a replacement of a failed peer
FLAG_STEP_LOOP = 16
FLAG_STEP_LOOP_ENDED = 32  # a rankguard.StepLoop's run() of the rank has ended (returned or raised)

# notices from the supervisor to the rank: a peer failed (kind, then the failed rank or -1)
_NOTICE = struct.Struct("<Ii")
_OFF_NOTICE = 56
NOTICE_NONE, NOTICE_DIED, NOTICE_HUNG = 0, 1, 2
# the round of several nodes ended elsewhere, for a reason that is no rank's (rank -1)
NOTICE_NODE_LOST, NOTICE_STORE_LOST, NOTICE_NODE_LEFT = 3, 4, 5
NOTICE_NAMES = {NOTICE_DIED: "died", NOTICE_HUNG: "hung", NOTICE_NODE_LOST: "node_lost",
                NOTICE_STORE_LOST: "store_lost", NOTICE_NODE_LEFT: "node_left"}
_NOTICE_WITHOUT_RANK = {"node_lost": "a node of the job was lost",
                        "store_lost": "the job's store was lost",
                        "node_left": "another node's agent was stopped"}


def notice_text(kind: str, rank: int) -> str:
    """What a notice says happened, for people: ``rank 3 hung``, ``the job's store was
    lost``, ``another rank died`` (``kind`` and ``rank`` as ``LedgerWriter.notice`` gives
    them)."""
    if kind in _NOTICE_WITHOUT_RANK:
        return _NOTICE_WITHOUT_RANK[kind]
    return f"{f'rank {rank}' if rank >= 0 else 'another rank'} {kind}"

# fault kinds recorded by the rank itself
FAULT_NONE = 0
FAULT_RAISED = 1
FAULT_TERMINATED = 2  # SIGTERM reached the rank; it is tearing itself down (runtime.eviction)
# The script ended (returned, or raised SystemExit) and the rank is leaving with the recorded
# exit code; its interpreter's teardown may take a while yet. The time is when it began to leave.
FAULT_EXITING = 3


class ErrorKind(enum.IntEnum):
    """What kind of exception reached the top of a rank's script (with ``FAULT_RAISED``, or
    with ``FAULT_EXITING`` for argparse's refusal of the script's arguments)."""

    OTHER = 0  # any exception (or none recorded)
    # a rankguard.UsageError, or argparse's refusal of the command line (SystemExit(2)): a
    # mistake of the script's, which every process running it makes again, so that neither a
    # replacement nor a restart can help
    USAGE = 1

# The kinds of operations, by the name the ledger shows to people.
OP_NAMES = (
    "none",
    "init_process_group",
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "broadcast",
    "barrier",
    "reduce",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "recv_anysource",
    "shutdown",  # rankguard.shutdown's barrier
)
OP_CODES = {name: code for code, name in enumerate(OP_NAMES)}



def op_name(code: int) -> str:
    """The name people see for operation ``code`` (``opN`` for one this version does not
    know, written by a newer one). Pure."""
    return OP_NAMES[code] if 0 <= code < len(OP_NAMES) else f"op{code}"


def op_label(op: str, seq: int, group: str = "world") -> str:
    """``all_reduce #57``, ``init_process_group``, ``barrier #3 on group ranks 0,2``; an
    operation whose kind is not known (``none``: a group watched through torch's Flight
    Recorder learns it once a rank waits in it) is ``collective #11``. Pure."""
    label = op if op == "init_process_group" else f"{op_shown(op)} #{seq}"
    return label if group == "world" else f"{label} on group {group}"


# appended to a mixed group's name for its gloo half's slot (``cpu:gloo,cuda:nccl``:
# runtime.recorder_slots); the default group's is ``world/gloo``
GLOO_HALF = "/gloo"
WORLD_GLOO_HALF = "world" + GLOO_HALF


def group_label(key: int, is_world: bool, members: Iterable[int]) -> str:
    """How people see a group the ledger knows by its key and members: ``world``,
    ``world/gloo`` (the gloo half of a mixed default group), or ``ranks 0,2``. Pure."""
    if is_world:
        return "world"
    if key == group_key(WORLD_GLOO_HALF):
        return WORLD_GLOO_HALF
    return "ranks " + ",".join(map(str, members))


def op_shown(op: str) -> str:
    """The operation's name as people see it: ``collective`` where its kind is not known yet
    (``none``). Pure."""
    return "collective" if op == OP_NAMES[0] else op


PATH_ENV = "RANKGUARD_LEDGER"  # the ledger file a supervisor made for the rank


def seq_of(entry: int, is_world: bool) -> int:
    """The sequence number people see for entry ``entry`` of a group (see the module doc)."""
    return entry - 1 if is_world else entry


def group_key(name: str) -> int:
    """A stable 64-bit key for a process group name, the same on every rank."""
    return (zlib.crc32(name.encode()) << 32) | zlib.crc32(name[::-1].encode())


def default_dir() -> str:
    """Where ledgers live: /dev/shm (memory) when it exists, else the temp folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def make_dir(run_id: str) -> str:
    """A new folder for the ledgers of one run, under :func:`default_dir`: private (0700) and
    named unpredictably, so nobody else can plant or read a file in it. Removing it is the
    whole cleanup: the launcher's guardian does, however the launcher ends; and should the
    guardian be killed too, the next run of the same user removes it (:func:`_sweep_dirs`).

    The calling process holds a lock on the folder for the rest of its life: a folder whose
    lock is free belongs to no live process.
    """
    _sweep_dirs()
    path = tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{run_id}-", dir=default_dir())
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    _held_dirs.append(fd)
    return path


_DIR_PREFIX = "rankguard-ledgers-"  # distinct from every other folder of ours in the temp folder
_SWEEP_AGE_S = 60.0  # younger folders may be about to be locked by the process making them
_held_dirs: list[int] = []


def _sweep_dirs() -> None:
    """Remove the ledger folders of this user that no live process holds (their launcher and
    its guardian were both killed)."""
    base = default_dir()
    try:
        names = [name for name in os.listdir(base) if name.startswith(_DIR_PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(base, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # not a folder (a stray file in the base folder), or gone
            continue
        try:
            info = os.fstat(fd)
            if (info.st_uid != os.geteuid() or info.st_mode & 0o077
                    or time.time() - info.st_mtime < _SWEEP_AGE_S):
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # locked: its launcher lives
            continue
        finally:
            os.close(fd)


def _initial(world_size: int) -> bytearray:
    buf = bytearray(SIZE)
    HEADER.pack_into(buf, 0, MAGIC, VERSION, 0, 0, FAULT_NONE, 0, 0, 0.0, 0.0, 0)
    members = (1 << world_size) - 1 if world_size <= 64 else 0
    SLOT.pack_into(buf, HEADER.size, group_key("world"), members, 1, world_size, 0, 0.0, 0.0, 0, 0)
    return buf


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def create(path: str, world_size: int) -> None:
    """Create a zeroed ledger file for one rank (mode 0600), with the world group in slot 0.

    The supervisor creates it before the rank starts, so it can always be read. Whatever was at
    ``path`` is replaced, never followed or written through: a symlink or a file planted there
    is unlinked first (or, when that is not allowed, the creation fails).

    Raises:
        LedgerError: the file cannot be created at ``path``.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:  # a ledger left at this path, or something planted there
            os.unlink(path)
            fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise LedgerError(f"cannot create ledger {path}: {exc.strerror}") from exc
    try:
        _write_all(fd, _initial(world_size))
    finally:
        os.close(fd)


def _map(path: str, writable: bool) -> mmap.mmap:
    try:
        # non-blocking: a FIFO at the name is refused below, not waited on
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW
                     | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise LedgerError(f"cannot open ledger {path}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise LedgerError(f"ledger {path} is not a regular file")
        if info.st_size != SIZE:
            raise LedgerError(f"ledger {path} has the wrong size (not written by this rankguard)")
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        mapping = mmap.mmap(fd, SIZE, access=access)
    finally:
        os.close(fd)
    if HEADER.unpack_from(mapping, 0)[0] != MAGIC:
        raise LedgerError(f"ledger {path} does not start with the rankguard magic number")
    return mapping


class _SlotWriter:
    """Writes one group slot. Its state lives here; every change is written to the mapping at
    once, each writer's fields in one store sequence (times, then counts).

    ``step`` and ``enter`` are called only by the thread that issues the group's operations,
    and write only its line, without a lock (it is the line's one writer). ``done`` may be
    called by any thread (the completion sweeper, or the issuing thread recording another
    group's completion): its count has a line of its own, and a lock among those callers.
    """

    __slots__ = ("_buf", "_offset", "_swept_offset", "_lock", "_kind", "_t_enter", "_t_done",
                 "_entered", "_done", "_t_swept", "_swept", "_index", "_ring_base", "_async_offset",
                 "_ring_mask", "_pack_record")

    def __init__(self, buf: mmap.mmap, index: int) -> None:
        offset = HEADER.size + index * SLOT_SIZE
        self._buf = buf
        self._index = index
        self._ring_base = RING_OFFSET + _ring.offset(index)
        self._ring_mask = _ring.capacity(index) - 1
        self._pack_record = _ring.RECORD.pack_into
        self._offset = offset + _OFF_STATE
        self._swept_offset = offset + _OFF_SWEPT
        self._async_offset = offset + _OFF_ASYNC
        self._lock = threading.Lock()
        (self._kind, self._t_enter, self._t_done, self._entered,
         self._done) = _STATE.unpack_from(buf, self._offset)
        self._t_swept, self._swept = _SWEPT.unpack_from(buf, self._swept_offset)

    def step(self, kind: int, finished: int) -> int:
        """Record that the rank entered an operation of ``kind`` and, in the same write, that
        ``finished`` more of the group's operations completed (the ones seen completed as this
        one began; their completion time is this one's entry). Returns the entry number.
        Only the issuing thread may call it."""
        now = time.monotonic()
        self._entered += 1
        if finished:
            self._done += finished
            self._t_done = now
        self._kind, self._t_enter = kind, now
        _STATE.pack_into(self._buf, self._offset, kind, now, self._t_done, self._entered,
                         self._done)
        entered = self._entered
        self._pack_record(self._buf, self._ring_base + (entered & self._ring_mask) * _RECORD, now,
                          entered, self._done + self._swept, kind)
        return self._entered

    def enter(self, kind: int) -> int:
        """Record that the rank entered an operation of ``kind``; returns the entry number."""
        return self.step(kind, 0)

    def done(self, wait: bool = True) -> bool:
        """Record that one more operation of this group completed (any thread). With
        ``wait=False``, only if no other thread is recording one at this moment; returns
        whether it was recorded."""
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            self._swept += 1
            self._t_swept = time.monotonic()
            _SWEPT.pack_into(self._buf, self._swept_offset, self._t_swept, self._swept)
        finally:
            self._lock.release()
        return True

    def publish(self, kind: int, enqueued: int, started: int, completed: int, t_enter: float,
                t_done: float, on_host: bool = False) -> None:
        """Write an asynchronous group's progress as torch counts it (see ``GroupProgress``):
        the kind of the operation it is in, the last operation enqueued, started on the device
        (-1: not known) and completed, when the first and last of those counts last moved, and
        whether its operations run on the host (gloo) rather than a device (NCCL).
        Only the group's one writer (the rank's progress sampler) may call it, and no other
        method of this slot may be used for the group."""
        self._kind, self._t_enter, self._t_done = kind, t_enter, t_done
        self._entered, self._done = enqueued, completed
        _ASYNC.pack_into(self._buf, self._async_offset, started,
                         SLOT_ASYNC | (SLOT_HOST if on_host else 0))
        _STATE.pack_into(self._buf, self._offset, kind, t_enter, t_done, enqueued, completed)

    def keep(self, records: Iterable[_ring.RingRecord]) -> None:
        """Write an asynchronous group's recent operations into its ring
        (``ledger_ring.write_async``). Only the group's one writer (the rank's progress
        sampler) may call it, as for :meth:`publish`."""
        for record in records:
            _ring.write_async(self._buf, self._ring_base, self._index, record)

    @property
    def entered(self) -> int:
        return self._entered

    @property
    def index(self) -> int:
        """The slot's place in the ledger (0: the world's)."""
        return self._index

    def reset(self) -> None:
        """Start counting again (a new generation of the group): no operation entered or done.
        The issuing thread calls it, once the group's completions are flushed."""
        with self._lock:
            self._entered = self._done = self._swept = 0
            _ring.clear(self._buf, self._ring_base, self._index)
            _ASYNC.pack_into(self._buf, self._async_offset, -1, 0)
            _SWEPT.pack_into(self._buf, self._swept_offset, self._t_swept, 0)
            _STATE.pack_into(self._buf, self._offset, self._kind, self._t_enter, self._t_done,
                             0, 0)

    def progress(self) -> tuple[int, int, str]:
        """(entered, done, name of the last operation entered), as written so far."""
        swept = _SWEPT.unpack_from(self._buf, self._swept_offset)[1]
        kind, _, _, entered, done = _STATE.unpack_from(self._buf, self._offset)
        return entered, done + swept, op_name(kind)


# The issuing thread's part of a slot, at slot offset 24: kind, padding, t_enter, t_done,
# entered, done (the tail of ``SLOT``).
_STATE = struct.Struct("<I4xddQQ")
_OFF_STATE = SLOT.size - _STATE.size


class LedgerWriter:
    """The rank's side of its ledger. Creating one maps the file the supervisor made."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._buf = _map(path, writable=True)
        self._slots: dict[int, _SlotWriter] = {}
        self._used = 1
        for index in range(1, MAX_GROUPS):
            if SLOT.unpack_from(self._buf, HEADER.size + index * SLOT_SIZE)[0]:
                self._used = index + 1
        self._pid = os.getpid()
        struct.pack_into("<q", self._buf, _OFF_PID, self._pid)
        struct.pack_into("<d", self._buf, _OFF_T_START, time.monotonic())

    @classmethod
    def private(cls, world_size: int = 1) -> LedgerWriter:
        """A ledger of this process's own, for ranks without a supervisor to read it: the file
        is removed as soon as it is mapped."""
        fd, path = tempfile.mkstemp(prefix="rankguard-ledger-", dir=default_dir())  # 0600
        try:
            _write_all(fd, _initial(world_size))
            return cls(path)
        finally:
            os.close(fd)
            os.unlink(path)

    def set_flag(self, flag: int) -> None:
        flags = struct.unpack_from("<I", self._buf, _OFF_FLAGS)[0]
        struct.pack_into("<I", self._buf, _OFF_FLAGS, flags | flag)

    def clear_flag(self, flag: int) -> None:
        flags = struct.unpack_from("<I", self._buf, _OFF_FLAGS)[0]
        struct.pack_into("<I", self._buf, _OFF_FLAGS, flags & ~flag)

    def clear_notice(self) -> None:
        """Forget the supervisor's notice: the group it was about is gone (``regroup``)."""
        _NOTICE.pack_into(self._buf, _OFF_NOTICE, NOTICE_NONE, -1)

    def record_fault(self, kind: int, in_collective: bool) -> None:
        """Record that the rank is failing (an exception reached the top), and when."""
        struct.pack_into("<d", self._buf, _OFF_T_FAULT, time.monotonic())
        struct.pack_into("<II", self._buf, _OFF_FAULT, kind, int(in_collective))

    def record_exit(self, code: int, in_collective: bool, error: ErrorKind = ErrorKind.OTHER,
                    text: str = "") -> None:
        """Record that the rank's script ended and it is leaving with exit code ``code``, and
        when (and, for an ``error`` other than ``OTHER``, why: ``text``); only the process
        that mapped the ledger (not a forked child), and only when no fault was recorded
        before (that one tells how the rank really ended)."""
        if os.getpid() != self._pid or self.recorded_fault() != FAULT_NONE:
            return
        if error != ErrorKind.OTHER:
            self.record_error(error, text)
        struct.pack_into("<i", self._buf, _OFF_EXIT_CODE, code)
        self.record_fault(FAULT_EXITING, in_collective)

    def record_error(self, kind: ErrorKind, text: str) -> None:
        """Record what kind of exception is ending the rank and its message (cut to
        ``ERROR_TEXT_MAX`` bytes, at a character's end); called before :meth:`record_fault`,
        so a reader that sees the fault sees its kind."""
        length = _put_text(self._buf, _OFF_ERROR + _ERROR.size, text, ERROR_TEXT_MAX)
        struct.pack_into("<H", self._buf, _OFF_ERROR + 2, length)
        struct.pack_into("<B", self._buf, _OFF_ERROR, int(kind))

    def recorded_fault(self) -> int:
        """The fault kind recorded so far (``FAULT_NONE`` if none)."""
        return int(struct.unpack_from("<I", self._buf, _OFF_FAULT)[0])

    def exit_code(self) -> int:
        """The exit code recorded with ``FAULT_EXITING`` (0 otherwise)."""
        return int(struct.unpack_from("<i", self._buf, _OFF_EXIT_CODE)[0])

    def record_blame(self, ranks: list[int]) -> None:
        """Record the ranks that the rank's fault blames (ranks 0 to 63)."""
        mask = 0
        for rank in ranks:
            if 0 <= rank < 64:
                mask |= 1 << rank
        struct.pack_into("<Q", self._buf, _OFF_BLAMED, mask)

    def record_injection(self, index: int) -> None:
        """Record that injected fault ``index`` (its place in ``RANKGUARD_INJECT``, below
        ``MAX_INJECTIONS``) fires now: written before the fault is performed, so a fault that
        kills the rank is recorded too."""
        self._buf[_OFF_FIRED + index] = 1

    def record_step(self, step: int) -> None:
        """Record that the rank begins ``rankguard.StepLoop`` step ``step`` (from 0)."""
        _STEP_BEGUN.pack_into(self._buf, _OFF_TRAILER, step + 1)

    def notice(self) -> tuple[str, int] | None:
        """The supervisor's notice that a peer failed: (``died`` or ``hung``, its rank)."""
        kind, rank = _NOTICE.unpack_from(self._buf, _OFF_NOTICE)
        return (NOTICE_NAMES.get(kind, "failed"), rank) if kind else None

    def refusal(self) -> str | None:
        """The supervisor's word that the failed peer will not be replaced, and why (the
        attempt ends), as it posted it with the notice; None when it posted none (a replacement
        may come). Kept once posted: the attempt ends whatever the rank does meanwhile
        (``clear_notice``)."""
        length = _REFUSAL.unpack_from(self._buf, _OFF_REFUSAL)[0]
        if not length:
            return None
        return _text_at(self._buf, _OFF_REFUSAL + _REFUSAL.size, length, REFUSAL_TEXT_MAX)

    def world(self) -> _SlotWriter:
        return self.slot(WORLD_SLOT)

    def slot(self, index: int) -> _SlotWriter:
        writer = self._slots.get(index)
        if writer is None:
            writer = self._slots[index] = _SlotWriter(self._buf, index)
        return writer

    def add_group(self, name: str, global_ranks: list[int]) -> _SlotWriter | None:
        """Give a sub-group its slot; None when all slots are taken (the group goes untracked)."""
        if self._used >= MAX_GROUPS:
            return None
        index = self._used
        self._used += 1
        self._pack_group(index, name, global_ranks)
        return self.slot(index)

    def reuse_group(self, slot: _SlotWriter, name: str, global_ranks: list[int]) -> _SlotWriter:
        """Give the sub-group slot ``slot``, whose group is gone, to the group ``name`` (one of
        the same name, made anew): its members, no operation entered or done, an empty ring.
        ``slot`` must not be used after."""
        slot.reset()
        self._pack_group(slot.index, name, global_ranks)
        writer = self._slots[slot.index] = _SlotWriter(self._buf, slot.index)
        return writer

    def _pack_group(self, index: int, name: str, global_ranks: list[int]) -> None:
        members = 0
        for rank in global_ranks:
            if rank < 64:
                members |= 1 << rank
        SLOT.pack_into(self._buf, HEADER.size + index * SLOT_SIZE, group_key(name), members, 0,
                       len(global_ranks), 0, 0.0, 0.0, 0, 0)

    def in_collective(self) -> bool:
        """Whether any operation this rank entered has not completed yet."""
        return any(s.entered > s.progress()[1] for s in self._slots.values())


@dataclass(frozen=True)
class GroupProgress:
    """One group of one rank, as its supervisor sees it: a group slot of the ledger, or an
    asynchronous group's progress (NCCL: the CPU returns at enqueue).

    For an ``asynchronous`` group, ``entered`` is the last operation the CPU enqueued,
    ``started`` the last its device started (-1: not known, timing off; 0: none yet),
    ``done`` the last completed, all numbered as torch's Flight Recorder numbers a group's
    collectives (from 1, no ``init_process_group`` entry); ``kind`` is the kind of the first
    operation not completed (the one the rank waits in) while there is one, else the last
    enqueued; ``t_enter`` is when ``entered`` last changed, ``t_done`` when ``done`` last
    changed (or, if it never did, when the group was first seen); ``on_host``: its operations
    run on the host (gloo watched through the recorder), so no device starts them.
    """

    key: int
    members: int
    is_world: bool
    size: int
    entered: int
    done: int
    kind: str
    t_enter: float
    t_done: float
    started: int = -1
    asynchronous: bool = False
    on_host: bool = False

    @property
    def waiting(self) -> bool:
        """The rank has entered an operation of this group that has not completed."""
        return self.entered > self.done

    @property
    def current(self) -> int:
        """The number of the operation the rank is in (or was in last): the first not
        completed of an asynchronous group while one is pending, else the last entered."""
        return self.done + 1 if self.asynchronous and self.waiting else self.entered

    @property
    def seq(self) -> int:
        """The sequence number people see for :attr:`current` (``all_reduce #57``)."""
        return self.seq_at(self.current)

    def seq_at(self, entry: int) -> int:
        """The sequence number people see for this group's operation ``entry`` (as
        ``entered`` and ``done`` count them)."""
        return entry if self.asynchronous else seq_of(entry, self.is_world)

    @property
    def stepped(self) -> bool:
        """The rank completed a collective of this group (the world group's
        ``init_process_group`` is not one)."""
        return self.done >= (2 if self.is_world and not self.asynchronous else 1)

    @property
    def last_event(self) -> float:
        return max(self.t_enter, self.t_done)

    def member_ranks(self, world_size: int) -> list[int]:
        if self.is_world:
            return list(range(world_size))
        return [r for r in range(min(world_size, 64)) if self.members >> r & 1]


@dataclass(frozen=True)
class RankProgress:
    """The whole ledger of one rank at one moment."""

    pid: int
    flags: int
    fault: int
    fault_in_collective: bool
    t_fault: float
    t_start: float
    groups: tuple[GroupProgress, ...]
    blamed: tuple[int, ...] = ()  # ranks that the rank's own fault names as not arrived
    exit_code: int = 0  # the code it is leaving with, when ``fault`` is FAULT_EXITING
    error: ErrorKind = ErrorKind.OTHER  # the kind of exception that reached the top, if any
    error_text: str = ""  # its message, for a kind other than OTHER

    @property
    def stacks_ready(self) -> bool:
        return bool(self.flags & FLAG_STACKS_READY)

    @property
    def terminating(self) -> bool:
        """The rank got SIGTERM and began its teardown (``runtime.eviction``)."""
        return bool(self.flags & FLAG_TERMINATING)


@dataclass(frozen=True)
class InjectionProgress:
    """What a rank's ledger says of its injected faults (see :meth:`LedgerReader.injections`).

    Attributes:
        fired: the places in ``RANKGUARD_INJECT`` of the faults that fired in this process.
        step: the last ``rankguard.StepLoop`` step it began (None: none, or no fault armed).
        op: the number of its last collective on the default group (0: none).
        bootstrapped: its bootstrap ran (a process that never ran it recorded nothing).
    """

    fired: frozenset[int]
    step: int | None
    op: int
    bootstrapped: bool


@dataclass(frozen=True)
class RecentOp:
    """One of a rank's recent operations (the ledger's ring), with its group's identity."""

    number: int  # in the rank's order of entry among those kept, from 1
    op: str  # all_reduce, barrier, ...
    seq: int  # its number in its group, as people see it (``all_reduce #57``)
    group_key: int
    members: int  # the group's ranks, a bitmask (ranks 0 to 63)
    is_world: bool
    t_enter: float  # monotonic, on the machine's clock
    t_done: float | None  # when it was seen completed (monotonic); None: it was not
    # an asynchronous group's operation: where it stood, when its device was seen starting it
    # (None: not seen, or not known), the bytes of its inputs (None: not known)
    state: _ring.AsyncState | None = None
    t_started: float | None = None
    nbytes: int | None = None


def behind(members: Iterable[int], entries: Mapping[int, GroupProgress],
           target: int | None = None) -> tuple[list[int], int]:
    """Who is behind in one group: the members that have not entered operation number
    ``target`` (by default the furthest any member entered), and that number.

    ``entries`` maps a rank to its slot for the group; a member without one has entered
    nothing. Entries are written by the rank's calling thread, so this is exact even for a rank
    that holds the GIL (completions are recorded by another thread and may lag). The launcher's
    hang monitor and the serving pool's verdicts both judge by this rule.
    """
    if target is None:
        target = max((g.entered for g in entries.values()), default=0)
    return [r for r in members if r not in entries or entries[r].entered < target], target


def post_notice(path: str, kind: int, failed_rank: int, refusal: str | None = None) -> None:
    """The supervisor tells the rank of ledger ``path`` that ``failed_rank`` (-1: unknown)
    died or hung; a rank waiting in a bounded collective then raises ``PeerFailed``. With
    ``refusal``: that no replacement comes, and why, in one sentence (cut to
    ``REFUSAL_TEXT_MAX`` bytes), written before the notice, so that a rank that sees the notice
    sees it too."""
    buf = _map(path, writable=True)
    try:
        if refusal:
            length = _put_text(buf, _OFF_REFUSAL + _REFUSAL.size, refusal, REFUSAL_TEXT_MAX)
            _REFUSAL.pack_into(buf, _OFF_REFUSAL, length)
        _NOTICE.pack_into(buf, _OFF_NOTICE, kind, failed_rank)
    finally:
        buf.close()


def _put_text(buf: mmap.mmap, start: int, text: str, limit: int) -> int:
    """Write ``text`` in UTF-8 at ``start``, cut to ``limit`` bytes at a character's end;
    returns how many bytes (the length its record keeps, written after the text)."""
    data = text.encode("utf-8", errors="replace")[:limit]
    data = data.decode("utf-8", errors="ignore").encode("utf-8")
    buf[start:start + len(data)] = data
    return len(data)


def _text_at(buf: mmap.mmap, start: int, length: int, limit: int) -> str:
    """The text :func:`_put_text` wrote at ``start`` (``length`` bytes, at most ``limit``)."""
    return bytes(buf[start:start + min(length, limit)]).decode("utf-8", errors="replace")


class LedgerReader:
    """The supervisor's read-only view of one rank's ledger."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._buf = _map(path, writable=False)

    def read(self) -> RankProgress:
        _, _, pid, flags, fault, fault_in_coll, exit_code, t_fault, t_start, blamed = \
            HEADER.unpack_from(self._buf, 0)
        groups = []
        for index in self._taken_slots():
            offset = HEADER.size + index * SLOT_SIZE
            # the second line first (module doc)
            t_swept, swept = _SWEPT.unpack_from(self._buf, offset + _OFF_SWEPT)
            started, slot_flags = _ASYNC.unpack_from(self._buf, offset + _OFF_ASYNC)
            key, members, is_world, size, kind, t_enter, t_done, entered, done = SLOT.unpack_from(
                self._buf, offset)
            asynchronous = bool(slot_flags & SLOT_ASYNC)
            groups.append(GroupProgress(key, members, bool(is_world), size, entered,
                                        done + swept, op_name(kind), t_enter,
                                        max(t_done, t_swept), started if asynchronous else -1,
                                        asynchronous,
                                        asynchronous and bool(slot_flags & SLOT_HOST)))
        error, text = self._error()
        return RankProgress(pid, flags, fault, bool(fault_in_coll), t_fault, t_start,
                            tuple(groups),
                            tuple(r for r in range(blamed.bit_length()) if blamed >> r & 1),
                            exit_code, error, text)

    def _error(self) -> tuple[ErrorKind, str]:
        """The error record: its kind (``OTHER`` for a value this rankguard does not know) and
        its text (read only for another kind: the launcher reads every ledger on every tick)."""
        code, length = _ERROR.unpack_from(self._buf, _OFF_ERROR)
        try:
            kind = ErrorKind(code)
        except ValueError:
            return ErrorKind.OTHER, ""
        if kind == ErrorKind.OTHER:
            return kind, ""
        return kind, _text_at(self._buf, _OFF_ERROR + _ERROR.size, length, ERROR_TEXT_MAX)

    def injections(self) -> InjectionProgress:
        """The rank's injected faults that fired, and how far it got: read when its attempt
        ends, or before a replacement takes its place (not on every tick)."""
        progress = self.read()
        begun = _STEP_BEGUN.unpack_from(self._buf, _OFF_TRAILER)[0]
        fired = self._buf[_OFF_FIRED:_OFF_FIRED + MAX_INJECTIONS]
        world = next((g for g in progress.groups if g.is_world), None)
        return InjectionProgress(
            frozenset(index for index, flag in enumerate(fired) if flag),
            begun - 1 if begun else None, max(world.seq, 0) if world is not None else 0,
            bool(progress.flags & FLAG_BOOTSTRAPPED))

    def _taken_slots(self) -> list[int]:
        """The slots a group has taken (a non-zero key), read in one pass: the launcher reads
        every ledger on every tick."""
        keys = _EVERY_KEY.unpack_from(self._buf, HEADER.size)
        return [index for index, key in enumerate(keys) if key]

    def recent(self) -> list[RecentOp]:
        """The rank's recent operations in every group, in the order it entered them (the
        latest ``ledger_ring.capacity`` of each group), numbered from 1 in that order."""
        found = []
        for index in range(MAX_GROUPS):
            offset = HEADER.size + index * SLOT_SIZE
            t_swept, swept = _SWEPT.unpack_from(self._buf, offset + _OFF_SWEPT)
            key, members, is_world, _, _, _, t_done, _, done = SLOT.unpack_from(self._buf, offset)
            if not key:
                continue
            asynchronous = bool(_ASYNC.unpack_from(self._buf, offset + _OFF_ASYNC)[1]
                                & SLOT_ASYNC)
            read = _ring.read_async if asynchronous else _ring.read
            for record in read(self._buf, RING_OFFSET + _ring.offset(index), index,
                               done + swept, max(t_done, t_swept)):
                seq = record.entry if asynchronous else seq_of(record.entry, bool(is_world))
                found.append(((record.t_enter, index, record.entry), RecentOp(
                    0, op_name(record.kind), seq, key, members, bool(is_world), record.t_enter,
                    record.t_done, record.state, record.t_started, record.nbytes)))
        found.sort(key=lambda pair: pair[0])
        return [dataclasses.replace(op, number=number)
                for number, (_, op) in enumerate(found, 1)]

    def close(self) -> None:
        self._buf.close()
