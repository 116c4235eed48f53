"""Command-line option checks shared by ``rankguard run`` and ``rankguard serve``: every bad
value becomes a :class:`UsageError` that names the option and how to fix it."""

from __future__ import annotations

import argparse
import math
import os

from .errors import UsageError


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are UsageErrors (one line, exit 2), not usage dumps."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(self.prog, message, f"see {self.prog} --help")


def number(option: str, text: str, kind: type, minimum: float, hint: str) -> float:
    """``text`` as a finite ``kind`` (int or float) of at least ``minimum``."""
    try:
        value = kind(text)
    except ValueError:
        raise UsageError(option, f"{text!r} is not a{'n integer' if kind is int else ' number'}",
                         hint) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(option, f"{text!r} is not a finite number", hint)
    if value < minimum:
        raise UsageError(option, f"{text!r} is below {minimum:g}", hint)
    return value


def writable_dir(option: str, path: str) -> str:
    """``path`` made absolute, created if missing (private to the user: 0700), and checked to
    be writable."""
    path = os.path.abspath(path)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise UsageError(option, f"cannot create {path!r}: {exc.strerror}",
                         "choose a folder you can write to") from None
    if not os.access(path, os.W_OK):
        raise UsageError(option, f"{path!r} is not writable", "choose a folder you can write to")
    return path
