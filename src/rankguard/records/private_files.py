"""Where rankguard keeps files nobody else may read or plant: the user's own folder under the
temp folder, and files only their owner can open.

The temp folder is shared by every user. A fixed name in it (``/tmp/rankguard``) belongs to
whoever creates it first, who then controls, or can read, what the others write there. So each
user gets ``$TMPDIR/rankguard-<uid>``, created 0700 and refused when it is not exactly that (a
symlink, not a folder, owned by someone else, or writable by group or others). Logs, journals,
stack dumps and ledgers hold the ranks' output: they are created 0600 (:func:`opener`).

What rankguard writes later into a folder (a report, Flight Recorder dumps) goes into a folder
held open by descriptor once it passed the same rule (:func:`open_private`,
:func:`make_private`): a folder another user owns or can write, or a symlink planted where a
folder is expected, is refused rather than written through.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Sequence

from ..errors import UsageError


def user_dir_path(uid: int | None = None) -> str:
    """The path of the user's folder (``$TMPDIR/rankguard-<uid>``), without creating it."""
    return os.path.join(tempfile.gettempdir(),
                        f"rankguard-{os.geteuid() if uid is None else uid}")


def user_dir(what: str) -> str:
    """The user's private folder, created 0700 if missing (:func:`private_dir`).

    Args:
        what: the option or argument the folder is the default of, named in errors.

    Raises:
        UsageError: it exists but is a symlink or not a folder, belongs to another user, or is
            writable by group or others.
    """
    return private_dir(user_dir_path(), what)


def private_dir(path: str, what: str) -> str:
    """``path``, a folder created 0700 if missing, then checked as :func:`check_private`
    checks it: a symlink, a file, or a folder of someone else's found at the name (planted
    there first, in a folder others can write) is refused, never used.

    Raises:
        UsageError: it cannot be created, or breaks the rule.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UsageError(what, f"cannot create {path!r}: {exc.strerror}",
                         f"choose a folder of your own for {what}") from None
    check_private(path, what)
    return path


def check_private(path: str, what: str, instead: str = "") -> None:
    """Refuse ``path`` unless it is a real folder of this user that only this user can write.

    Args:
        what: the option or argument the folder is for, named in errors.
        instead: the way out but fixing the folder, for the hint (default: removing it, or
            choosing another folder for ``what``).

    Raises:
        UsageError: naming what is wrong with it and how to fix it.
    """
    _check(os.lstat(path), path, what, instead)


def check_own(path: str, what: str) -> None:
    """Refuse folder ``path``, one the user named to write into (``--log-dir``), unless it is a
    folder of this user that other users cannot write. Its group may (a team's shared folder,
    0775 or 2775): that is the rule of :func:`check_private` less the group. A symlink there is
    followed if this user made it; one of someone else's is refused.

    Raises:
        UsageError: naming what is wrong with it and how to fix it.
    """
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) and info.st_uid == os.geteuid():
        info = os.stat(path)
    _check(info, path, what, f"choose a folder of your own for {what}", writers=0o002)


def check_own_file(path: str, what: str) -> None:
    """Refuse ``path``, a file the user named to append to (``--journal``), if something
    another user could have planted is there: a symlink, a file of someone else's, a file with
    other names (hard links). Missing is fine: :func:`own_opener` creates it 0600.

    Raises:
        UsageError: naming what is there and how to fix it.
    """
    with contextlib.suppress(FileNotFoundError):
        problem = _file_problem(os.lstat(path))
        if problem:
            raise UsageError(what, f"{path!r} {problem}",
                             "remove it, or give a file of your own")


def open_private(path: str, what: str, instead: str = "", dir_fd: int | None = None,
                 shown: str = "") -> int:
    """A descriptor of folder ``path`` (relative to ``dir_fd`` when given), for writing files
    into it with ``dir_fd``: a folder of this user only this user can write (the rule of
    :func:`check_private`), opened without following a symlink at its last component, and
    checked on the descriptor itself, so the folder written into is the folder checked.

    Args:
        shown: the path named in errors (default: ``path``).

    Raises:
        UsageError: it cannot be opened, or breaks the rule; naming ``what`` and the fix.
    """
    shown = shown or path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError as exc:
        with contextlib.suppress(OSError):  # a symlink or not a folder: say which
            _check(os.lstat(path, dir_fd=dir_fd), shown, what, instead)
        raise UsageError(what, f"cannot open {shown!r}: {exc.strerror}",
                         instead or f"choose a folder of your own for {what}") from None
    try:
        _check(os.fstat(fd), shown, what, instead)
    except UsageError:
        os.close(fd)
        raise
    return fd


def make_private(base: str, parts: Sequence[str], what: str, instead: str = "") -> int:
    """A descriptor of folder ``base/parts...`` as :func:`open_private` gives it, each of
    ``parts`` made 0700 if missing. Each part is made and opened relative to the descriptor of
    the one above, never through a symlink, and must keep the rule too: a symlink or a folder
    of someone else planted at one is refused, not followed. ``base`` (followed, as the user
    named it) may be any folder when ``parts`` are given: only the folders at those names,
    made or found, must be private.

    Raises:
        UsageError: a folder cannot be made or opened, or breaks the rule.
    """
    if not parts:
        return open_private(base, what, instead)
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(what, f"cannot open {base!r}: {exc.strerror}",
                         instead or f"choose a folder of your own for {what}") from None
    path = base
    for part in parts:
        path = os.path.join(path, part)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            inner = open_private(part, what, instead, dir_fd=fd, shown=path)
        except OSError as exc:
            raise UsageError(what, f"cannot create {path!r}: {exc.strerror}",
                             instead or f"choose a folder of your own for {what}") from None
        finally:
            os.close(fd)
        fd = inner
    return fd


def _check(info: os.stat_result, path: str, what: str, instead: str,
           writers: int = 0o022) -> None:
    """The rule of :func:`check_private` (of :func:`check_own` with ``writers`` 0o002: the
    mode bits of those who must not write), on what ``lstat`` or ``fstat`` said of ``path``."""
    hint = instead or f"remove it, or choose a folder of your own for {what}"
    if stat.S_ISLNK(info.st_mode):
        raise UsageError(what, f"{path!r} is a symlink, not a folder of yours", hint)
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(what, f"{path!r} is not a folder", hint)
    if info.st_uid != os.geteuid():
        raise UsageError(what, f"{path!r} belongs to uid {info.st_uid}, not to you "
                               f"(uid {os.geteuid()})", hint)
    if info.st_mode & writers:
        fix = "chmod o-w" if writers == 0o002 else "chmod 700"
        raise UsageError(what, f"{path!r} can be written by other users "
                               f"(mode {stat.S_IMODE(info.st_mode):04o})",
                         f"{fix} {path}, or {hint}")


def opener(path: str, flags: int) -> int:
    """An ``opener`` for :func:`open`: a new file is created 0600, and a symlink at ``path`` is
    refused (``OSError`` ELOOP), never followed."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def own_opener(path: str, flags: int) -> int:
    """An ``opener`` for :func:`open`, for a file at a name someone else may have taken first
    (a journal the user put in ``/tmp``, ``internal_error.txt`` in a folder a group writes): as
    :func:`opener`, and what was opened must be a file of this user's with no other name,
    checked on the descriptor (so a file planted after any earlier check is refused too).
    ``"w"`` truncates it only once it passed.

    Raises:
        OSError: ``EPERM`` with what is wrong (a file of someone else's, hard links), ``ELOOP``
            for a symlink, or why it cannot be opened.
    """
    fd = os.open(path, (flags & ~os.O_TRUNC) | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        problem = _file_problem(os.fstat(fd))
        if problem:
            raise PermissionError(errno.EPERM, problem, path)
        if flags & os.O_TRUNC:
            os.ftruncate(fd, 0)
    except OSError:
        os.close(fd)
        raise
    return fd


def _file_problem(info: os.stat_result) -> str:
    """What makes a file, as ``lstat`` or ``fstat`` saw it, one rankguard must not write into
    (it may have been planted there by another user); "" if nothing."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link (not followed: give the file's own path)"
    if info.st_uid != os.geteuid():
        return f"belongs to uid {info.st_uid}, not to you (uid {os.geteuid()})"
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        return (f"has {info.st_nlink} names (hard links): writing it would write the others "
                "too")
    return ""


def replace_with(target: str, text: str) -> None:
    """Write ``text`` to ``target`` (0600) by a rename, so a reader never sees half of it.

    Raises:
        OSError: it could not be written.
    """
    staging = f"{target}.{os.getpid()}.tmp"
    with open(staging, "w", opener=opener) as out:
        out.write(text)
    os.replace(staging, target)


class NotRegular(ValueError):
    """A path that is not a regular file, or one larger than the reader takes."""


def read_regular(path: str, limit: int, follow: bool = True) -> bytes:
    """The bytes of regular file ``path``, at most ``limit`` of them. A FIFO or a device is
    refused at once, never waited on (it is opened non-blocking), as is a larger file: what a
    user's folder holds may have been put there by anyone.

    Args:
        follow: False: a symbolic link at ``path`` is refused (``OSError`` ELOOP), never read
            through (a file rankguard itself wrote there, which a link replaced).

    Raises:
        OSError: it cannot be opened or read.
        NotRegular: it is not a regular file, or is larger than ``limit`` bytes.
    """
    with _regular(path, follow) as (fd, size):
        if size > limit:
            raise NotRegular(f"{path} is larger than {limit} bytes")
        return _read_at(fd, 0, limit)


def read_ends(path: str, head: int, tail: int, follow: bool = True) -> tuple[bytes, bytes]:
    """The first ``head`` and the last ``tail`` bytes of regular file ``path``, in bounded time
    and memory whatever its size: a file of at most ``head + tail`` bytes is all in the first
    part (the second is then empty). Refuses what :func:`read_regular` refuses, but a large file.

    Raises:
        OSError: it cannot be opened or read.
        NotRegular: it is not a regular file.
    """
    with _regular(path, follow) as (fd, size):
        if size <= head + tail:
            return _read_at(fd, 0, head + tail), b""
        return _read_at(fd, 0, head), _read_at(fd, size - tail, tail)


@contextlib.contextmanager
def _regular(path: str, follow: bool):
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular(f"{path} is not a regular file")
        yield fd, info.st_size
    finally:
        os.close(fd)


def _read_at(fd: int, offset: int, count: int) -> bytes:
    """At most ``count`` bytes from ``offset`` (fewer where the file ends first)."""
    parts, got = [], 0
    while got < count:
        chunk = os.pread(fd, min(count - got, 1 << 24), offset + got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
