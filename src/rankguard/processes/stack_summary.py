"""Stacks of many ranks, summed up by identical main-thread stack, so that the one that differs
stands out: ``ranks 0,1,3 (3): backward (torch/_tensor.py:623) <- main (train.py:62)`` and
``rank 2: perform (rankguard/inject/perform.py:41) <- main (train.py:62)``.

Reads ``faulthandler`` dumps (what a rank writes on SIGUSR1, ``runtime.stacks``); a stacks file
may hold several dumps, appended, and the last one counts. Pure functions: no process is asked
anything here.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import sysconfig
from dataclasses import dataclass

DUMPS_LIMIT = 4 << 20  # bytes of a stacks file read at most: its latest dumps
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):$")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # rankguard/
_LIBRARIES = tuple({os.path.abspath(p) for p in (sysconfig.get_paths()["stdlib"],
                                                  sysconfig.get_paths()["purelib"],
                                                  sysconfig.get_paths()["platlib"])})


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    @property
    def ours(self) -> bool:
        """Whether it is in rankguard's own code."""
        return os.path.abspath(self.file).startswith(_PACKAGE + os.sep)

    @property
    def user(self) -> bool:
        """Whether it is in the user's own code (not Python's, a library's or rankguard's)."""
        path = os.path.abspath(self.file)
        return not (self.file.startswith("<") or path.startswith(_PACKAGE)
                    or path.startswith(_LIBRARIES) or "site-packages" in path
                    or "dist-packages" in path)

    def short(self) -> str:
        return f"{self.function} ({_short_path(self.file)}:{self.line})"


@dataclass(frozen=True)
class SameStack:
    """Ranks whose main threads were in the same place."""

    ranks: tuple[int, ...]
    frames: tuple[Frame, ...]  # innermost first; empty: no dump from these ranks

    def summary(self, depth: int = 2) -> str:
        """Where they are, in one line: the innermost ``depth`` frames, then the innermost
        frame of the user's own code if it is further out."""
        if not self.frames:
            return "no stacks (it did not answer)"
        shown = self.frames[:depth]
        text = " <- ".join(f.short() for f in shown)
        user = next((f for f in self.frames if f.user), None)
        if user is not None and user not in shown:
            gap = self.frames.index(user) > depth
            text += (" <- ... <- " if gap else " <- ") + user.short()
        return text

    def label(self) -> str:
        if len(self.ranks) == 1:
            return f"rank {self.ranks[0]}"
        return f"ranks {rank_list(self.ranks)} ({len(self.ranks)})"


def _short_path(path: str) -> str:
    for root in (*_LIBRARIES, os.path.dirname(_PACKAGE)):
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root)
    return os.path.basename(path) if path.startswith(sys.prefix) else path


def rank_list(ranks: tuple[int, ...] | list[int]) -> str:
    """``0-6,9`` for 0,1,2,3,4,5,6,9 (runs of three or more as ranges)."""
    parts: list[str] = []
    ordered = sorted(ranks)
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        if end - start >= 2:
            parts.append(f"{ordered[start]}-{ordered[end]}")
        else:
            parts.extend(str(r) for r in ordered[start:end + 1])
        start = end + 1
    return ",".join(parts)


def _threads(dump: str) -> list[tuple[bool, list[Frame]]]:
    """Every thread of ``dump`` in its order: whether it is the signalled (current) one, and
    its frames, innermost first."""
    threads: list[tuple[bool, list[Frame]]] = []
    for line in dump.splitlines():
        head = _THREAD.match(line)
        if head:
            threads.append((head.group(1) == "Current thread", []))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1][1].append(Frame(frame["file"], int(frame["line"]), frame["func"]))
    return threads


def main_thread(dump: str) -> tuple[Frame, ...]:
    """The frames of the last dump's signalled (main) thread in ``dump``, innermost first;
    the last thread of the text (faulthandler lists the main thread, the oldest, last) when no
    thread is marked current, or when the current one is rankguard's own (a watcher thread
    took the request because the main thread blocks its signal)."""
    threads = _threads(dump)
    current = [frames for is_current, frames in threads if is_current]
    chosen = current[-1] if current else []
    if (not chosen or chosen[0].ours) and threads:
        chosen = threads[-1][1]
    return tuple(chosen)


def every_thread(dump: str) -> list[str]:
    """Where each thread of one dump is, a line each (:meth:`SameStack.summary`), the
    signalled (main) thread first, leaving out rankguard's own threads (those whose innermost
    frame is rankguard's: its watchers, not what the process waits for):
    ``main thread: _shutdown (threading.py:1540)``, ``thread 2: wait (threading.py:359) <- ...
    <- hold (job.py:12)``."""
    threads = sorted(_threads(dump), key=lambda thread: not thread[0])
    return [f"{'main thread' if current else f'thread {number}'}: "
            f"{SameStack((), tuple(frames)).summary()}"
            for number, (current, frames) in enumerate(threads, 1)
            if current or not (frames and frames[0].ours)]


def by_stack(dumps: dict[int, str], ranks: list[int] | None = None) -> list[SameStack]:
    """Ranks sorted by identical main-thread stack, the largest set first (then by lowest
    rank); ``ranks``: every rank expected, those without a dump form a set of their own."""
    stacks: dict[tuple[Frame, ...], list[int]] = {}
    for rank in sorted(set(dumps) | set(ranks or [])):
        stacks.setdefault(main_thread(dumps.get(rank, "")), []).append(rank)
    same = [SameStack(tuple(members), frames) for frames, members in stacks.items()]
    return sorted(same, key=lambda s: (not s.frames, -len(s.ranks), s.ranks[0]))


def describe(same: list[SameStack], indent: str = "") -> list[str]:
    """One line per stack: ``ranks 0-6 (7): all_reduce (...) <- train_step (train.py:88)``."""
    return [f"{indent}{s.label()}: {s.summary()}" for s in same]


def last_dump(path: str) -> str:
    """The text of a stacks file (all its dumps; :func:`main_thread` takes the last), or ""
    when it cannot be read. At most its last :data:`DUMPS_LIMIT` bytes, of a regular file
    only, never through a symbolic link: whoever can write the run's folder (a rank's own
    code) may have put a FIFO, a link to /dev/zero or to a secret at the name; reading is
    bounded in time and memory whatever is found there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ""
        start = max(0, info.st_size - DUMPS_LIMIT)
        return os.pread(fd, info.st_size - start, start).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)
