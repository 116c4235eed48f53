"""Stacks on demand: a rank writes the Python stacks of all its threads when asked.

The request is ``SIGUSR1``, best sent to the rank's main thread (``proctree.signal_main_thread``):
``faulthandler`` answers it from a C-level signal handler, so the dump is written even while the
main thread is inside a C call (a gloo collective, a CUDA synchronize) or holds the GIL in a busy
loop, and no Python code of the rank has to run. Each dump is appended to the rank's stacks file.

That handler writes to a file descriptor opened when it is installed, so the file exists from
then on. The default one (no ``RANKGUARD_STACKS``) lives in the user's private folder
(``rankguard.private_files``) and is removed when the process ends without having dumped
anything (at exit, and by the SIGTERM teardown); the empty files of processes that were killed
are removed by the next process of the same user that installs it.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import re
from typing import IO

from ..records import private_files
from ..processes import stack_requests
from ..errors import UsageError, shown

STACK_SIGNAL = stack_requests.RANK_SIGNAL
PATH_ENV = "RANKGUARD_STACKS"
_DEFAULT_NAME = re.compile(r"stacks-(\d+)\.txt")

_file: IO[str] | None = None
_own_default: str | None = None  # the default file this process made (removed if left empty)


def _default(pid: int) -> str:
    return os.path.join(private_files.user_dir_path(), f"stacks-{pid}.txt")


def path_for(pid: int, environ: dict[str, str]) -> str:
    """Where the runtime of process ``pid`` (of this user), whose environment is ``environ``,
    writes its stacks: ``$RANKGUARD_STACKS`` (set by the launcher, the pytest plugin and
    pools), else ``$TMPDIR/rankguard-<uid>/stacks-<pid>.txt``."""
    return environ.get(PATH_ENV) or _default(pid)


def install(path: str | os.PathLike[str] | None = None) -> str:
    """Answer ``SIGUSR1`` with a dump of every thread's stack, appended to ``path``.

    ``path`` defaults to ``$RANKGUARD_STACKS`` (set by the launcher or the pytest plugin), else
    ``$TMPDIR/rankguard-<uid>/stacks-<pid>.txt``. The file is created 0600; a symlink in its
    place is refused. Calling it again moves the dumps to the new path. Returns the path.

    Raises:
        UsageError: ``path`` is not a path (an int would be taken as a file descriptor), the
            file cannot be opened, or the user's folder is not private.
    """
    global _file, _own_default
    if path is not None and not isinstance(path, (str, os.PathLike)):
        # an int would be taken as a file descriptor: the dumps would go to (and a later
        # install would close) whatever it is, stdout or a store's socket
        raise UsageError("stacks_file", f"expected a path, got {shown(path)}",
                         "give the file's path as a str, or leave it out")
    chosen = os.fspath(path) if path is not None else None
    chosen = chosen or os.environ.get(PATH_ENV)
    if not chosen:
        _sweep(private_files.user_dir("stacks_file"))
    path = chosen or _default(os.getpid())
    if _file is not None and _file.name == path:
        return path
    try:
        new = open(path, "a", opener=private_files.opener)  # noqa: SIM115 (kept open for life)
    except OSError as exc:
        raise UsageError("stacks_file", f"cannot open {path!r} for stack dumps: {exc.strerror}",
                         "give a file in a folder of your own (a symlink is refused)") from None
    faulthandler.register(STACK_SIGNAL, file=new, all_threads=True, chain=False)
    if _file is not None:
        _file.close()
    discard_if_empty()
    _file = new
    if not chosen:
        if _own_default is None:
            atexit.register(discard_if_empty)
        _own_default = path
    return path


def installed_path() -> str | None:
    """Where this process writes its stacks, or None if it does not answer requests."""
    return _file.name if _file is not None else None


def discard_if_empty() -> None:
    """Remove the default stacks file this process made, if nothing was dumped into it. Called
    at exit, and by the SIGTERM teardown before it ends the process."""
    global _own_default
    path, _own_default = _own_default, None
    if path is not None:
        _remove_if_empty(path)


def _remove_if_empty(path: str) -> None:
    try:
        if os.lstat(path).st_size == 0:
            os.unlink(path)
    except OSError:
        pass


def _sweep(folder: str) -> None:
    """Remove the empty default stacks files of processes that no longer exist (killed before
    they could remove their own)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        match = _DEFAULT_NAME.fullmatch(name)
        if match is None or int(match.group(1)) == os.getpid() or _alive(int(match.group(1))):
            continue
        _remove_if_empty(os.path.join(folder, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
