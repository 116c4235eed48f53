"""Checks of the values people give rankguard, shared by ``rankguard run``, ``rankguard serve``
and the Python API: every bad value becomes a :class:`UsageError` that names the option or
argument and how to fix it. ``number`` reads text (a flag, a header); ``seconds`` checks a value
given in Python."""

from __future__ import annotations

import argparse
import math
import os

from .errors import UsageError


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are UsageErrors (one line, exit 2), not usage dumps."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(self.prog, message, f"see {self.prog} --help")


def number(option: str, text: str, kind: type, minimum: float, hint: str,
           maximum: float | None = None) -> float:
    """``text`` as a finite ``kind`` (int or float) of at least ``minimum`` (and at most
    ``maximum``, when given).

    Raises:
        UsageError: naming ``option``, with ``hint``.
    """
    try:
        value = kind(text)
    except ValueError:
        raise UsageError(option, f"{text!r} is not a{'n integer' if kind is int else ' number'}",
                         hint) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(option, f"{text!r} is not a finite number", hint)
    if value < minimum:
        raise UsageError(option, f"{text!r} is below {minimum:g}", hint)
    if maximum is not None and value > maximum:
        raise UsageError(option, f"{text!r} is above {maximum:g}", hint)
    return value


def seconds(what: str, value: object) -> float:
    """``value``, a duration given in Python, as float seconds: an int or a float, finite and
    above 0. A bool, a string, None, NaN, an infinity, 0 or less are refused.

    Raises:
        UsageError: naming ``what`` (e.g. ``Pool(timeout)``).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(what, f"expected a number of seconds, got {value!r}",
                         "give an int or a float, e.g. 5.0")
    if not math.isfinite(value) or value <= 0:
        raise UsageError(what, f"expected a finite number of seconds above 0, got {value!r}",
                         "e.g. 5.0")
    return float(value)


def writable_dir(option: str, path: str) -> str:
    """``path`` made absolute, created if missing, and checked to be writable."""
    path = os.path.abspath(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(option, f"cannot create {path!r}: {exc.strerror}",
                         "choose a folder you can write to") from None
    if not os.access(path, os.W_OK):
        raise UsageError(option, f"{path!r} is not writable", "choose a folder you can write to")
    return path


def writable_file(option: str, path: str) -> str:
    """``path`` made absolute, checked to name a file that can be appended to: not a folder,
    its folder created if missing and writable, the file writable if it exists already."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        raise UsageError(option, f"{path!r} is a folder",
                         f"give a file's path, e.g. {os.path.join(path, 'journal.jsonl')}")
    writable_dir(option, os.path.dirname(path))
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise UsageError(option, f"{path!r} is not writable", "choose a file you can write to")
    return path
