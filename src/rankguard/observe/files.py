"""Reading what a run left (its journal, its ranks' recent operations) and writing what the
commands make (a report, dumps) as a user's files may be: damaged, hostile, or not files at all.

- ``events`` reads a regular file only (a FIFO or a device is refused, never waited on), at
  most its first and last few MiB; bytes that are not UTF-8 are replaced. It keeps a
  journal's lines that are events as rankguard writes them: an object with a known-looking
  ``event``, a finite ``ts``, whole numbers (or null) where rankguard writes whole numbers,
  and whole numbers where rankguard always writes one (``REQUIRED``: a ``rank_start``'s
  attempt, rank and pid); anything else is skipped, so every later rule may rely on those
  types.
- ``write_new`` writes a file only where a regular file (or nothing) is: not through a symbolic
  link, not into a FIFO; the content is made before the file is touched. Callers write into a
  folder of the user's own, opened and checked first (``private_files.open_private``): never
  into one another user owns or can write, where a file of theirs could be waiting.
- ``printable`` makes text from a run safe to print on a terminal (no control characters).

Every failure is a ``UsageError`` naming the path and the fix.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import sys
from typing import Any

from ..records import private_files
from ..errors import UsageError

# bytes of a journal read at most, from its start (its run_start) and its end (the latest
# attempt): parsing ~20 us a line here, a 1 GB journal took minutes and 8 GB of memory
JOURNAL_HEAD = 1 << 20
JOURNAL_TAIL = 16 << 20
# fields rankguard writes as whole numbers (or null)
WHOLE = ("attempt", "rank", "pid", "round", "group_rank", "group_world_size", "base_rank",
         "world_size", "nproc", "exit_code", "max_restarts", "attempts", "seq")
# the fields an event of these kinds always has, whole numbers (never null) that the commands
# index by: the attempt and its ranks
REQUIRED = {"attempt_start": ("attempt",), "attempt_end": ("attempt",),
            "rank_start": ("attempt", "rank", "pid"), "rank_exit": ("attempt", "rank")}
_LARGEST = 1 << 53
_CUT: set[str] = set()  # the journals read in part, said on stderr


def events(path: str) -> list[dict[str, Any]]:
    """A journal's events that look as rankguard writes them (see the module doc). Of a
    journal larger than ``JOURNAL_HEAD + JOURNAL_TAIL`` bytes, its first ``JOURNAL_HEAD`` and
    last ``JOURNAL_TAIL`` only, in bounded time and memory: the events between are left out,
    and one line on stderr says so.

    Raises:
        UsageError: the file cannot be read, or is not a regular file.
    """
    try:
        head, tail = private_files.read_ends(path, JOURNAL_HEAD, JOURNAL_TAIL)
    except OSError as exc:
        raise UsageError("RUN", f"cannot read {path}: {exc.strerror}") from None
    except private_files.NotRegular as exc:
        raise UsageError("RUN", str(exc), "give the file rankguard wrote") from None
    lines = _text(head).splitlines()
    if tail:
        # the part lines that each window was cut through are not events
        lines = lines[:None if head.endswith(b"\n") else -1] + _text(tail).splitlines()[1:]
    if tail and path not in _CUT:  # said once, not at each refresh of rankguard status
        _CUT.add(path)
        print(printable(f"rankguard: {path} is larger than {(JOURNAL_HEAD + JOURNAL_TAIL) >> 20}"
                        f" MiB: read its first {JOURNAL_HEAD >> 20} MiB and its last "
                        f"{JOURNAL_TAIL >> 20} MiB only (the events between are left out)"),
              file=sys.stderr)
    found = []
    for line in lines:
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if _is_event(event):
            found.append(event)
    return found


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _is_event(event: Any) -> bool:
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        return False
    ts = event.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return False
    if not isinstance(event.get("run_id", ""), str):
        return False
    if any(event.get(name) is None for name in REQUIRED.get(event["event"], ())):
        return False
    return all(_whole_or_null(event[name]) for name in WHOLE if name in event)


def _whole_or_null(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool)
                             and -_LARGEST < value < _LARGEST)


def finite(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def write_new(path: str, what: str, data: bytes, folder_fd: int | None = None) -> None:
    """Write ``data`` to ``path`` (created 0600, or a regular file replaced in place).

    Args:
        folder_fd: the folder's descriptor (``private_files.open_private``): the file is
            opened by its name relative to it, so it lands in the folder that was checked.

    Raises:
        UsageError: ``path`` is empty, a symbolic link, not a regular file, or cannot be
            written (a full disk: then it is removed, not left half written); naming
            ``what`` (the option) and the fix.
    """
    if not path:
        raise UsageError(what, "is empty", "give a file name")
    name = path if folder_fd is None else os.path.basename(path)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o600, dir_fd=folder_fd)
    except OSError as exc:
        try:
            mode = os.lstat(name, dir_fd=folder_fd).st_mode
        except OSError:
            mode = None
        if mode is not None and stat.S_ISLNK(mode):
            problem = f"cannot write {path}: it is a symbolic link"
        elif mode is not None and not stat.S_ISREG(mode):
            problem = f"{path} is not a regular file"
        else:
            problem = f"cannot write {path}: {exc.strerror}"
        raise UsageError(what, problem, "give another file") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UsageError(what, f"{path} is not a regular file", "give another file")
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        with contextlib.suppress(OSError):  # no half-written file left (a full disk)
            os.unlink(name, dir_fd=folder_fd)
        raise UsageError(what, f"cannot write {path}: {exc.strerror}",
                         "give another file") from None
    finally:
        os.close(fd)


def write_private(path: str, what: str, data: bytes) -> None:
    """``write_new`` into ``path``'s folder, which must be the user's own, that only they can
    write, and not a symlink (``private_files.open_private``).

    Raises:
        UsageError: as ``write_new``, or the folder is not such a folder.
    """
    if not path:
        raise UsageError(what, "is empty", "give a file name")
    folder = private_files.open_private(os.path.dirname(os.path.abspath(path)), what,
                                        "give another file")
    try:
        write_new(path, what, data, folder)
    finally:
        os.close(folder)


def printable(text: str) -> str:
    """``text`` without control characters (a run id, a cause), for a terminal."""
    return "".join(c if c.isprintable() else "?" for c in text)


def printable_lines(text: str) -> str:
    """``text``, each of its lines ``printable``."""
    return "\n".join(printable(line) for line in text.split("\n"))
