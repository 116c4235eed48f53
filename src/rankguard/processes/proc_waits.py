"""What a process tree is doing, read from /proc without touching it: each thread's state and
the kind of its wait, what the descriptors it waits on lead to, and the CPU time of the whole
tree.

The hang rules need positive evidence before they call a rank frozen (``launcher/progress``
decides; this module only reads). A thread blocked in a system call tells what it waits for:
``/proc/PID/task/TID/syscall`` gives the call and its arguments, and from them the descriptors
it waits on (the first argument of ``read``/``recv``, the ``pollfd`` array or ``fd_set`` of
``poll``/``select`` read through ``/proc/PID/mem``, the targets of an epoll instance in its
``fdinfo``) and how long it means to wait (``poll``'s timeout, ``nanosleep``'s or a futex's
``timespec``). Each descriptor is then placed: a pipe or socket shared with a live descendant
(its own child: a download, a preprocessing tool), one to another process of the job (the
store, a peer rank), one held by the process alone (a wake-up pipe, an eventfd), or anything
else (a socket to another host or to a server outside the job, a file on a slow filesystem, a
terminal).

Bounds: one sample reads a few small files per thread of the tree; descriptors and sockets are
resolved only for threads blocked on descriptors, and the owners of a local socket's peer only
when such a thread exists (one listing of the job's descriptors, cached for the sample). A file
that cannot be read (the process is gone, or no permission) yields an unknown wait, which the
rules never take as evidence of a freeze.
"""

from __future__ import annotations

import enum
import os
import platform
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Iterable

from . import proctree

_TICKS = os.sysconf("SC_CLK_TCK")
# More descriptors than this in one poll or select are not resolved (a wait on that many is
# an event loop's, and an event loop is no evidence either way).
_MAX_FDS = 64


class Call(enum.Enum):
    """The kind of system call a blocked thread is in."""

    NONE = "none"  # running, or between calls (a page fault)
    # read, recv, write, send, poll, select, accept, connect on descriptors; a file lock wait
    FDS = "fds"
    EPOLL = "epoll"  # epoll_wait: an event loop (its descriptors are in ``fds``)
    CHILD = "child"  # wait4, waitid: waits for a child process to end
    FILE = "file"  # open blocked on a file: a FIFO with no writer yet, NFS, FUSE
    SLEEP = "sleep"  # nanosleep, clock_nanosleep, pause, sigsuspend, sigtimedwait
    FUTEX = "futex"  # a lock, a condition, a semaphore, a join: waits for another thread
    OTHER = "other"  # any other call
    UNKNOWN = "unknown"  # the call could not be read


class Fd(enum.Enum):
    """Where a descriptor a thread waits on leads."""

    CHILD = "child"  # shared with a live descendant of the process (a pipe or socket to it)
    JOB = "job"  # to another process of the job (a rank, the launcher, its store)
    OWN = "own"  # held by the process alone (a wake-up pipe, an eventfd, a listening socket)
    OUTSIDE = "outside"  # a socket to anything else, a file, a terminal
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ThreadWait:
    """One thread, as one sample saw it."""

    tid: int
    state: str  # /proc's one-letter state: R, S, D, T, t, Z...
    call: Call = Call.NONE
    fds: tuple[Fd, ...] = ()
    # seconds until a timed wait ends on its own (None: no timeout, or not known)
    ends_in: float | None = None
    # voluntary + involuntary context switches so far: read for the main thread only (the one
    # whose polls the hang rules look for), 0 for the others
    switches: int = 0
    what: str = ""  # for people: "socket to 10.0.0.5:443", "child 4717 (sleep)"


@dataclass(frozen=True)
class TreeSample:
    """A process and its descendants at one moment."""

    cpu_s: float  # CPU time of the tree: live processes, and the children they reaped
    threads: tuple[ThreadWait, ...]  # the process's own threads, its main thread first
    children: tuple[int, ...] = ()  # live descendants
    disk_wait: tuple[int, ...] = ()  # descendants in uninterruptible (disk) wait
    stopped: bool = False  # the process is stopped (SIGSTOP) or traced
    stopped_children: tuple[int, ...] = ()  # descendants stopped (SIGSTOP) or traced

    @property
    def main(self) -> ThreadWait:
        return self.threads[0]


@dataclass
class JobPeers:
    """The processes of the job a sample is judged within: a descriptor to one of them is
    inside the job. ``roots``: process trees that make up the job on this machine (the launcher,
    whose tree holds its store and every rank); ``hosts``: other machines of the job (another
    node's ranks, a store on another host)."""

    roots: tuple[int, ...] = field(default_factory=lambda: (os.getpid(),))
    hosts: frozenset[str] = frozenset()


_SYSCALLS = {
    "x86_64": {
        Call.FDS: {0: "read", 17: "pread64", 19: "readv", 45: "recvfrom", 47: "recvmsg",
                   299: "recvmmsg", 1: "write", 20: "writev", 44: "sendto", 46: "sendmsg",
                   43: "accept", 288: "accept4", 42: "connect", 7: "poll", 271: "ppoll",
                   23: "select", 270: "pselect6", 73: "flock", 72: "fcntl"},
        Call.FILE: {2: "open", 257: "openat", 437: "openat2"},
        Call.EPOLL: {232: "epoll_wait", 281: "epoll_pwait", 441: "epoll_pwait2"},
        Call.CHILD: {61: "wait4", 247: "waitid"},
        Call.SLEEP: {35: "nanosleep", 230: "clock_nanosleep", 34: "pause",
                     130: "rt_sigsuspend", 128: "rt_sigtimedwait"},
        Call.FUTEX: {202: "futex", 449: "futex_waitv"},
    },
    "aarch64": {
        Call.FDS: {63: "read", 67: "pread64", 65: "readv", 207: "recvfrom", 212: "recvmsg",
                   243: "recvmmsg", 64: "write", 66: "writev", 206: "sendto", 211: "sendmsg",
                   202: "accept", 242: "accept4", 203: "connect", 73: "ppoll", 72: "pselect6",
                   32: "flock", 25: "fcntl"},
        Call.FILE: {56: "openat", 437: "openat2"},
        Call.EPOLL: {22: "epoll_pwait", 441: "epoll_pwait2"},
        Call.CHILD: {260: "wait4", 95: "waitid"},
        Call.SLEEP: {101: "nanosleep", 115: "clock_nanosleep", 133: "rt_sigsuspend",
                     137: "rt_sigtimedwait"},
        Call.FUTEX: {98: "futex", 449: "futex_waitv"},
    },
}
_NAMES: dict[int, tuple[Call, str]] = {
    number: (call, name)
    for call, names in _SYSCALLS.get(platform.machine(), {}).items()
    for number, name in names.items()}


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tasks:
        text = _read(f"/proc/{pid}/task/{tid}/children")
        found += [int(c) for c in text.split()] if text else []
    return found


_HAS_CHILDREN_LISTS = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def tree(pid: int) -> list[int]:
    """``pid`` and every live descendant (from the kernel's children lists, or a walk of
    /proc where the kernel keeps none)."""
    if not _HAS_CHILDREN_LISTS:
        return [pid, *proctree.descendants(pid)]
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += _children(current)
    return found


class _Mem:
    """Reads a process's memory through /proc/PID/mem (the arguments a call points to)."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._fd: int | None = None

    def read(self, address: int, size: int) -> bytes | None:
        if address == 0 or size <= 0:
            return None
        try:
            if self._fd is None:
                self._fd = os.open(f"/proc/{self._pid}/mem", os.O_RDONLY)
            data = os.pread(self._fd, size, address)
        except OSError:
            return None
        return data if len(data) == size else None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


def _timespec_s(data: bytes | None) -> float | None:
    if data is None:
        return None
    sec, nsec = struct.unpack("qq", data)
    return sec + nsec / 1e9


_FUTEX_WAIT_BITSET, _FUTEX_CMD, _FUTEX_CLOCK_REALTIME = 9, 127, 256


def _ends_in(name: str, args: list[int], mem: _Mem) -> float | None:
    """Seconds until the timed wait of call ``name`` ends (None: no timeout or unknown)."""
    if name in ("poll", "epoll_wait", "epoll_pwait"):
        index = 2 if name == "poll" else 3
        ms = args[index] if args[index] < 2**31 else args[index] - 2**64
        return None if ms < 0 else ms / 1000
    if name in ("ppoll", "pselect6", "epoll_pwait2"):
        return _timespec_s(mem.read(args[2 if name == "ppoll" else 4 if name == "pselect6"
                                         else 3], 16))
    if name == "select":  # a timeval: seconds and microseconds
        data = mem.read(args[4], 16)
        if data is None:
            return None
        sec, usec = struct.unpack("qq", data)
        return sec + usec / 1e6
    if name == "nanosleep":
        return _timespec_s(mem.read(args[0], 16))
    if name == "clock_nanosleep":
        value = _timespec_s(mem.read(args[2], 16))
        if value is None or not args[1] & 1:  # TIMER_ABSTIME
            return value
        return value - time.clock_gettime(args[0])
    if name == "futex":
        value = _timespec_s(mem.read(args[3], 16))
        if value is None or args[1] & _FUTEX_CMD != _FUTEX_WAIT_BITSET:
            return value
        clock = time.CLOCK_REALTIME if args[1] & _FUTEX_CLOCK_REALTIME else time.CLOCK_MONOTONIC
        return value - time.clock_gettime(clock)
    return None


def _waited_fds(pid: int, name: str, args: list[int], mem: _Mem) -> list[int]:
    """The descriptors call ``name`` waits on."""
    if name in ("poll", "ppoll"):
        count = min(args[1], _MAX_FDS)
        data = mem.read(args[0], 8 * count)
        if data is None:
            return []
        return [fd for fd, _, _ in struct.iter_unpack("ihh", data) if fd >= 0]
    if name in ("select", "pselect6"):
        count = min(args[0], 1024)
        size = (count + 63) // 64 * 8
        fds: list[int] = []
        for pointer in (args[1], args[2]):
            data = mem.read(pointer, size)
            if data is not None:
                bits = int.from_bytes(data, "little")
                fds += [fd for fd in range(count) if bits >> fd & 1]
        return fds[:_MAX_FDS]
    if name.startswith("epoll"):
        text = _read(f"/proc/{pid}/fdinfo/{args[0]}") or ""
        return [int(line.split()[1]) for line in text.splitlines()
                if line.startswith("tfd:")][:_MAX_FDS]
    return [args[0]]


def _socket_table(pid: int) -> dict[int, tuple[tuple[str, int], tuple[str, int], str]]:
    """inode -> (local, remote, state) of the TCP sockets of ``pid``'s network namespace."""
    table = {}
    for kind, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        text = _read(f"/proc/{pid}/net/{kind}") or ""
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) < 10:
                continue
            table[int(parts[9])] = (_address(parts[1], family), _address(parts[2], family),
                                    parts[3])
    return table


def _address(text: str, family: int) -> tuple[str, int]:
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    # /proc prints each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = socket.inet_ntop(family, raw)
    if address.startswith("::ffff:"):
        address = address[7:]
    return address, int(port, 16)


_ESTABLISHED, _LISTEN = "01", "0A"


class _Resolver:
    """Places a process's descriptors (see ``Fd``), with what it learns cached for one sample."""

    def __init__(self, pid: int, descendants: Iterable[int], peers: JobPeers,
                 known: dict[str, tuple[Fd, str]]) -> None:
        self._pid = pid
        self._descendants = set(descendants)
        self._peers = peers
        self._known = known
        self._sockets: dict[int, tuple[tuple[str, int], tuple[str, int], str]] | None = None
        self._owners: dict[str, set[int]] | None = None  # in the job's trees
        self._own: dict[str, set[int]] | None = None  # in the process's own tree

    def place(self, fd: int) -> tuple[Fd, str]:
        try:
            target = os.readlink(f"/proc/{self._pid}/fd/{fd}")
        except OSError:
            return Fd.UNKNOWN, ""
        if target.startswith("pipe:"):
            # a child's or not: whether another process of the job holds it changes nothing
            # (inside the job either way), and finding out would list every rank's descriptors
            return self._by_owner(target, "pipe", wide=False)
        if target.startswith("socket:"):
            if target not in self._known:  # a connection's peer never changes
                self._known[target] = self._socket(target)
            return self._known[target]
        if target.startswith("anon_inode:"):
            return Fd.OWN, target
        return Fd.OUTSIDE, target  # a file, a device, a terminal

    def _by_owner(self, target: str, what: str, wide: bool) -> tuple[Fd, str]:
        owners = self._owners_of(target, wide) - {self._pid}
        children = owners & self._descendants
        if children:
            child = min(children)
            return Fd.CHILD, f"{what} from child {child} ({_comm(child)})"
        if owners:
            return Fd.JOB, f"{what} to the job's process {min(owners)}"
        return Fd.OWN, f"its own {what}" if wide else what

    def _socket(self, target: str) -> tuple[Fd, str]:
        if self._sockets is None:
            self._sockets = _socket_table(self._pid)
        inode = int(target[8:-1])
        entry = self._sockets.get(inode)
        if entry is None:
            return Fd.UNKNOWN, "a socket that is not TCP"
        local, remote, state = entry
        if state == _LISTEN:
            return Fd.OWN, f"a listening socket on port {local[1]}"
        mirror = next((f"socket:[{other}]" for other, (l2, r2, _) in self._sockets.items()
                       if l2 == remote and r2 == local and other != 0), None)
        if mirror is None and self._is_local(remote[0]):
            # connected, not accepted yet: the listener's owner is at the other end
            mirror = next((f"socket:[{other}]" for other, (l2, _, s2) in self._sockets.items()
                           if s2 == _LISTEN and l2[1] == remote[1]
                           and l2[0] in (remote[0], "0.0.0.0", "::")), None)
        where = f"{remote[0]}:{remote[1]}"
        if mirror is None:  # the peer is on another machine
            if remote[0] in self._peers.hosts:
                return Fd.JOB, f"socket to {where} (a node of the job)"
            if remote in self._roots_remotes():
                return Fd.JOB, f"socket to {where} (the job's store)"
            return Fd.OUTSIDE, f"socket to {where}"
        kind, _ = self._by_owner(mirror, "socket", wide=True)
        if kind is Fd.OWN:  # no process of the job holds the other end
            return Fd.OUTSIDE, f"socket to {where}"
        return kind, f"socket to {where}" + (" (its child)" if kind is Fd.CHILD else "")

    def _is_local(self, address: str) -> bool:
        """``address`` is this machine's (loopback, or the local end of one of its sockets)."""
        assert self._sockets is not None
        return (address.startswith("127.") or address == "::1"
                or any(local[0] == address for local, _, _ in self._sockets.values()))

    def _roots_remotes(self) -> set[tuple[str, int]]:
        """Where the job's roots themselves (the agent) are connected on other machines: the
        job's store on another node (never a rank's connections: ranks that all download
        from one server would make it look like the job's)."""
        assert self._sockets is not None
        found = set()
        for root in self._peers.roots:
            for link in _descriptors(root):
                entry = self._sockets.get(int(link[8:-1])) if link.startswith("socket:") else None
                if entry is not None and entry[2] == _ESTABLISHED:
                    found.add(entry[1])
        return found

    def _owners_of(self, target: str, wide: bool) -> set[int]:
        """Who holds ``target``: in the process's own tree, or (``wide``) anywhere in the
        job's too."""
        if self._own is None:
            self._own = _holders([self._pid, *self._descendants])
        owners = self._own.get(target, set())
        if owners - {self._pid} or not wide:
            return owners
        if self._owners is None:
            self._owners = _holders([pid for root in self._peers.roots for pid in tree(root)])
        return owners | self._owners.get(target, set())


def _holders(pids: list[int]) -> dict[str, set[int]]:
    """Each pipe and socket of ``pids`` -> the pids that hold it."""
    found: dict[str, set[int]] = {}
    for pid in pids:
        for link in _descriptors(pid):
            found.setdefault(link, set()).add(pid)
    return found


def _descriptors(pid: int) -> list[str]:
    """What ``pid``'s pipes and sockets are (``pipe:[INODE]``, ``socket:[INODE]``)."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    found = []
    for name in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if link.startswith(("pipe:", "socket:")):
            found.append(link)
    return found


def _comm(pid: int) -> str:
    return (_read(f"/proc/{pid}/comm") or "?").strip()


def _switches(pid: int, tid: str) -> int:
    text = _read(f"/proc/{pid}/task/{tid}/status") or ""
    return sum(int(line.split()[1]) for line in text.splitlines()
               if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))


def _thread(pid: int, tid: str, state: str, resolver: _Resolver, mem: _Mem,
            children: list[int], resolve: frozenset[Call], main: bool) -> ThreadWait:
    """One thread's wait; the descriptors of its call are placed if the call is in
    ``resolve``, its context switches counted if it is the ``main`` thread."""
    base = f"/proc/{pid}/task/{tid}"
    switches = _switches(pid, tid) if main else 0
    if state != "S":
        return ThreadWait(int(tid), state, Call.NONE, switches=switches)
    text = _read(f"{base}/syscall")
    if text is None:
        return ThreadWait(int(tid), state, Call.UNKNOWN, switches=switches)
    parts = text.split()
    if not parts or parts[0] in ("running", "-1"):
        return ThreadWait(int(tid), state, Call.NONE, switches=switches)
    number, args = int(parts[0]), [int(a, 16) for a in parts[1:7]]
    call, name = _NAMES.get(number, (Call.OTHER, f"syscall {number}"))
    ends_in = _ends_in(name, args, mem)
    if call is Call.CHILD:
        what = (f"waits for child {children[0]} ({_comm(children[0])})" if children
                else "waits for a child")
        return ThreadWait(int(tid), state, call, (), ends_in, switches, what)
    if call is Call.FILE:
        raw = mem.read(args[0 if name == "open" else 1], 256) or b""
        path = raw.split(b"\0", 1)[0].decode(errors="replace") or "a file"
        return ThreadWait(int(tid), state, call, (), ends_in, switches, f"{name} of {path}")
    if call in resolve:
        placed = [resolver.place(fd) for fd in _waited_fds(pid, name, args, mem)]
        worst = (next((what for kind, what in placed if kind is Fd.CHILD), None)
                 or next((what for kind, what in placed if kind in (Fd.OUTSIDE, Fd.UNKNOWN)),
                         None)
                 or next((what for _, what in placed if what), ""))
        return ThreadWait(int(tid), state, call, tuple(kind for kind, _ in placed), ends_in,
                          switches, f"{name} on {worst}" if worst else name)
    return ThreadWait(int(tid), state, call, (), ends_in, switches, name)


_MAIN_RESOLVES = frozenset({Call.FDS, Call.EPOLL})


def sample(pid: int, peers: JobPeers | None = None,
           known: dict[str, tuple[Fd, str]] | None = None) -> TreeSample | None:
    """What process ``pid`` and its descendants are doing now; None if it is gone.

    The descriptors the main thread waits on are always placed; another thread's only when
    the main thread waits for a thread (a futex), and never an event loop's (``epoll``): what
    the hang rules can use, and placing a socket reads the namespace's socket tables (about
    15 ms with a few hundred sockets). ``known``: sockets placed by earlier samples of this
    process, kept by the caller (a connection's peer never changes).

    Reads only /proc; the process is not signalled, stopped or traced."""
    stat = proctree.stat_fields(pid)
    if stat is None:
        return None
    members = tree(pid)
    descendants = members[1:]
    cpu = 0.0
    disk, stopped = [], []
    for member in members:
        fields = stat if member == pid else proctree.stat_fields(member)
        if fields is None:
            continue
        cpu += sum(int(value) for value in fields[11:15]) / _TICKS  # utime stime cutime cstime
        if member != pid and fields[0] == "D":
            disk.append(member)
        if member != pid and fields[0] in ("T", "t"):
            stopped.append(member)
    resolver = _Resolver(pid, descendants, peers or JobPeers(), {} if known is None else known)
    mem = _Mem(pid)
    threads = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=lambda t: (int(t) != pid, int(t)))
    except OSError:
        return None
    try:
        for tid in tids:
            fields = proctree.stat_fields(pid, tid)
            if fields is None:
                continue
            if not threads:
                resolve = _MAIN_RESOLVES
            else:
                resolve = frozenset({Call.FDS}) if threads[0].call is Call.FUTEX else frozenset()
            threads.append(_thread(pid, tid, fields[0], resolver, mem, descendants, resolve,
                                   main=not threads))
    finally:
        mem.close()
    if not threads:
        return None
    return TreeSample(cpu, tuple(threads), tuple(descendants), tuple(disk),
                      threads[0].state in ("T", "t"), tuple(stopped))
