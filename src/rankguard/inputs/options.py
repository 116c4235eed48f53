"""Checks of the values people give rankguard, shared by ``rankguard run``, ``rankguard serve``
and the Python API: every bad value becomes a :class:`UsageError` that names the option or
argument and how to fix it. ``number`` reads text (a flag, a header); ``seconds`` checks a value
given in Python."""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import re
import stat
from typing import Mapping

from ..deadline import MAX_SECONDS, check_seconds
from ..errors import UsageError, shown
from . import nccl_env


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are UsageErrors (one line, exit 2), not usage dumps."""

    def error(self, message: str) -> None:  # type: ignore[override]
        option, colon, problem = message.partition(": ")
        if option.startswith("argument ") and colon:  # "argument --x: invalid choice: ..."
            raise UsageError(option.removeprefix("argument "), problem,
                             f"see {self.prog} --help")
        raise UsageError("command line", message, f"see {self.prog} --help")


# Plain decimal spellings only: Python's int() and float() also take "1_0", " 5", "١٢",
# "nan" and "inf", none of which a person means as a count or a number of seconds.
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


GLOO_ENV = "RANKGUARD_GLOO"  # how a rank's gloo groups are watched
GLOO_MODES = ("wrap", "recorder")


def gloo_mode(env: Mapping[str, str] | None = None) -> str:
    """How gloo groups are watched, from ``RANKGUARD_GLOO`` in ``env`` (default: this
    process's): ``wrap`` (the default: an instrumented group, bounded collectives) or
    ``recorder`` (left as torch makes them, read from torch's Flight Recorder as NCCL groups
    are; no bounded collectives).

    Raises:
        UsageError: it is set to something else.
    """
    mode = (os.environ if env is None else env).get(GLOO_ENV) or "wrap"
    if mode not in GLOO_MODES:
        raise UsageError(f"{GLOO_ENV}={mode!r}", "is not a way to watch gloo groups",
                         f"set it to {' or '.join(GLOO_MODES)}, or unset it")
    return mode


FR_BUFFER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # torch's, first wins


def check_flight_recorder(env: Mapping[str, str] | None = None) -> None:
    """Check the size of torch's Flight Recorder as the ranks will get it from ``env``
    (default: this process's): torch aborts a process whose size is not a whole number that
    fits a C int (it reads it with std::stoi), and ``RANKGUARD_GLOO=recorder`` watches gloo
    groups through the recorder, so it must be on.

    Raises:
        UsageError: the size is not a whole number, or it is 0 with ``RANKGUARD_GLOO=recorder``.
    """
    env = os.environ if env is None else env
    name = next((n for n in FR_BUFFER_ENV if env.get(n) is not None), None)
    if name is None:
        return
    value = env[name]
    if not _INTEGER.fullmatch(value.strip()) or not -(1 << 31) <= int(value) < 1 << 31:
        raise UsageError(f"{name}={value!r}", "is not a number of entries (torch aborts every "
                         "rank on it)", f"set it to 2000 (torch's default), 0 to turn torch's "
                         "Flight Recorder off, or unset it")
    if int(value) == 0 and gloo_mode(env) == "recorder":
        raise UsageError(f"{name}=0", f"turns off torch's Flight Recorder, through which "
                         f"{GLOO_ENV}=recorder watches gloo groups: nothing would be watched",
                         f"unset {name}, or {GLOO_ENV}")


def check_ranks_env(env: Mapping[str, str] | None = None) -> None:
    """Check the environment the ranks will get (default: this process's) for values torch
    refuses as they start or form their groups: its NCCL variables (``nccl_env.check``) and
    its Flight Recorder's size (:func:`check_flight_recorder`).

    Raises:
        UsageError: naming the variable and what torch takes.
    """
    env = os.environ if env is None else env
    nccl_env.check(env)
    check_flight_recorder(env)


MAX_LOCAL_RANKS = 1024  # rank processes one machine's supervisor starts at most: past it, a typo


def number(option: str, text: str, kind: type, minimum: float, hint: str,
           maximum: float | None = None) -> float:
    """``text`` as a ``kind`` (int or float) from ``minimum`` to ``maximum``.

    Only plain decimal spellings are taken (``10``, ``2.5``, ``1e3`` for a float). A float is a
    number of seconds, whose range is :func:`~rankguard.deadline.check_seconds`'s (zero only when
    ``minimum`` is 0, at most ``MAX_SECONDS``); ``maximum`` may lower the upper bound.

    Raises:
        UsageError: ``text`` is not such a number, or is out of range; names ``option``, with
            ``hint`` as the fix.
    """
    integer = kind is int
    if not (_INTEGER if integer else _DECIMAL).fullmatch(text):
        try:
            finite = math.isfinite(float(text))
        except ValueError:
            finite = True
        problem = "is not a finite number" if not finite else (
            "is not an integer" if integer else "is not a number")
        raise UsageError(option, f"{text!r} {problem}", hint)
    if not integer:
        return check_seconds(option, text, zero=minimum <= 0, least=minimum,
                             most=MAX_SECONDS if maximum is None else maximum, hint=hint)
    try:
        value = int(text)
    except ValueError:  # more digits than int() converts
        raise UsageError(option, f"{text[:20]!r}... is far too long", hint) from None
    if value < minimum:
        raise UsageError(option, f"{text!r} is below {minimum:g}", hint)
    if maximum is not None and value > maximum:
        raise UsageError(option, f"{text!r} is above {maximum:.10g}", hint)
    return value


def seconds(what: str, value: object) -> float:
    """``value``, a duration given in Python, as float seconds: an int or a float above 0, by
    the rule of :func:`~rankguard.deadline.check_seconds` (a string is refused: in Python it is
    a mistake).

    Raises:
        UsageError: naming ``what`` (e.g. ``Pool(timeout)``).
    """
    return check_seconds(what, value, text=False)


def whole_number(what: str, value: object, least: int, noun: str = "") -> int:
    """``value`` if it is an int (not a bool) of at least ``least``; ``noun`` names what it
    counts in the error (``CUDA device index``).

    Raises:
        UsageError: naming ``what``.
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        wanted = f"a {noun} (a whole number >= {least})" if noun else \
            f"a whole number >= {least}"
        raise UsageError(what, f"expected {wanted}, got {shown(value)}")
    return value


def writable_dir(option: str, path: str) -> str:
    """``path`` made absolute, created if missing (it and each parent it makes private to the
    user: 0700), and checked to be writable."""
    if not isinstance(path, (str, os.PathLike)):
        raise UsageError(option, f"expected a folder's path, got {shown(path)}")
    path = os.path.abspath(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(option, f"{path!r} is not a folder", "give a folder's path")
    try:
        for folder in missing_dirs(path):  # os.makedirs gives the parents the umask's mode
            with contextlib.suppress(FileExistsError):  # made meanwhile by another process
                os.mkdir(folder, 0o700)
    except OSError as exc:
        raise UsageError(option, f"cannot create {path!r}: {exc.strerror}",
                         "choose a folder you can write to") from None
    if not os.access(path, os.W_OK):
        raise UsageError(option, f"{path!r} is not writable", "choose a folder you can write to")
    return path


def missing_dirs(path: str) -> tuple[str, ...]:
    """The folders that creating the folder ``path`` would make: ``path`` and those of its
    parents that do not exist yet, outermost first (none if ``path`` exists)."""
    missing: list[str] = []
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return tuple(reversed(missing))


def remove_empty_dirs(dirs: tuple[str, ...]) -> None:
    """Remove those of the folders ``dirs`` that are empty, each after the ones after it
    (``dirs`` as :func:`missing_dirs` gives them, outermost first, or several such runs, each
    made after the one before): a folder that holds anything is kept, and so, then, is every
    folder above it."""
    for path in reversed(dirs):
        with contextlib.suppress(OSError):  # not empty (something else is there), or gone
            os.rmdir(path)


def writable_file(option: str, path: str) -> str:
    """``path`` made absolute: a file that can be opened for appending now, without blocking.

    Its folder is created if missing. A file that does not exist yet is created and removed
    again, so that whatever would refuse it later (a name too long, a read-only disk) is
    reported now.

    Raises:
        UsageError: ``path`` is a folder, a symbolic link, a FIFO nobody reads, or cannot be
            opened or created.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise UsageError(option, f"expected a file's path, got {shown(path)}")
    path = os.path.abspath(path)
    if os.path.isdir(path):
        raise UsageError(option, f"{path!r} is a folder",
                         f"give a file path, e.g. {os.path.join(path, 'journal.jsonl')}")
    writable_dir(option, os.path.dirname(path))
    existed = os.path.lexists(path)
    flags = (os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOFOLLOW
             | (0 if existed else os.O_CREAT | os.O_EXCL))
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        problem = ("is a FIFO that nobody reads" if exc.errno == errno.ENXIO
                   else "is a symbolic link (not followed: give the file's own path)"
                   if exc.errno == errno.ELOOP
                   else f"cannot be opened for writing: {exc.strerror}")
        raise UsageError(option, f"{path!r} {problem}", "give a file you can write to") from None
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):  # /dev/full, a terminal, a socket
            raise UsageError(option, f"{path!r} is not a regular file",
                             "give the path of a file, e.g. journal.jsonl")
        if stat.S_ISREG(mode):
            os.lseek(fd, 0, os.SEEK_END)  # what appending does first: fails on /proc files
    except OSError as exc:
        raise UsageError(option, f"{path!r} cannot be appended to: {exc.strerror}",
                         "give a file you can write to") from None
    finally:
        os.close(fd)
    if not existed:
        os.unlink(path)
    return path
