"""Stacks on demand: a rank writes the Python stacks of all its threads when asked.

The request is ``SIGUSR1``, best sent to the rank's main thread (``proctree.signal_main_thread``).
The runtime's watcher thread answers it (``signal_watch``): it takes the GIL and appends the stacks
to the rank's stacks file in ``faulthandler``'s format, the main thread as the current one. The
answer comes within milliseconds while the main thread is inside a C call that releases the GIL (a
gloo collective, a CUDA synchronize) or runs Python (the GIL changes hands every 5 ms), and when a
C call that holds the GIL returns. It is never written from the signal handler: ``faulthandler``
did that, and on Python 3.11 and 3.12 a request that landed while the main thread entered a
Python function from C (which importing torch does all the time) killed the rank with SIGSEGV.

A rank whose GIL stays held (a C loop that never releases it: the watcher cannot run) is asked
again, after :data:`stack_requests.FALLBACK_AFTER_S` without an answer, with
:data:`FALLBACK_SIGNAL`, to which ``faulthandler`` answers from the signal handler: safe there,
since a thread that holds the GIL in one C call is not entering a Python function. A stopped
rank is asked with that signal at once, so that it dumps where it stopped.

From the interpreter's exit on (``atexit``), requests are ignored: a rank that is ending answers no
more, and is not killed by a request that lands after Python restored the signal's default
action (which ends the process).

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
import signal
import sys
import threading
from types import FrameType
from typing import IO

from ..records import private_files
from ..processes import stack_requests
from ..errors import UsageError, shown
from . import signal_watch

STACK_SIGNAL = stack_requests.RANK_SIGNAL
FALLBACK_SIGNAL = stack_requests.RANK_FALLBACK_SIGNAL
PATH_ENV = "RANKGUARD_STACKS"
_DEFAULT_NAME = re.compile(r"stacks-(\d+)\.txt")
MAX_DEPTH = 100  # frames shown per thread, as faulthandler
MAX_TEXT = 500  # characters of a file or function name, as faulthandler

_file: IO[str] | None = None
_own_default: str | None = None  # the default file this process made (removed if left empty)
_lock = threading.Lock()  # the file, against a dump while install() moves it


def _default(pid: int) -> str:
    return os.path.join(private_files.user_dir_path(), f"stacks-{pid}.txt")


def path_for(pid: int, environ: dict[str, str]) -> str:
    """Where the runtime of process ``pid`` (of this user), whose environment is ``environ``,
    writes its stacks: ``$RANKGUARD_STACKS`` (set by the launcher, the pytest plugin and
    pools), else ``$TMPDIR/rankguard-<uid>/stacks-<pid>.txt``."""
    return environ.get(PATH_ENV) or _default(pid)


def install(path: str | os.PathLike[str] | None = None) -> str:
    """Answer ``SIGUSR1`` with a dump of every thread's stack, appended to ``path``. Main thread
    only.

    ``path`` defaults to ``$RANKGUARD_STACKS`` (set by the launcher or the pytest plugin), else
    ``$TMPDIR/rankguard-<uid>/stacks-<pid>.txt``. The file is created 0600; a symlink in its
    place is refused. Calling it again moves the dumps to the new path. Returns the path.

    Raises:
        UsageError: ``path`` is not a path (an int would be taken as a file descriptor), the
            file cannot be opened, the user's folder is not private, or this is not the main
            thread.
    """
    global _file, _own_default
    if path is not None and not isinstance(path, (str, os.PathLike)):
        # an int would be taken as a file descriptor: the dumps would go to (and a later
        # install would close) whatever it is, stdout or a store's socket
        raise UsageError("stacks_file", f"expected a path, got {shown(path)}",
                         "give the file's path as a str, or leave it out")
    signal_watch.require_main_thread()
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
    with _lock:
        # faulthandler keeps the file's descriptor: it is pointed at the new file before the
        # old one is closed
        faulthandler.register(FALLBACK_SIGNAL, file=new, all_threads=True, chain=False)
        if _file is not None:
            _file.close()
        _file = new
    discard_if_empty()
    if signal.getsignal(STACK_SIGNAL) is not _on_request:
        signal.signal(STACK_SIGNAL, _on_request)
        signal.siginterrupt(STACK_SIGNAL, False)  # a syscall it lands in resumes (faulthandler)
        signal_watch.on(STACK_SIGNAL, _answer)
        atexit.register(_stop_answering)
    if not chosen:
        if _own_default is None:
            atexit.register(discard_if_empty)
        _own_default = path
    return path


def _on_request(signum: int, frame: FrameType | None) -> None:
    """The main thread's part of a request: nothing (the watcher answers it)."""


def _answer() -> None:
    """The watcher's part: append the dump, unless the program took the signal over."""
    if signal.getsignal(STACK_SIGNAL) is not _on_request:
        return
    text = dump_text()
    with _lock:
        if _file is not None:
            _file.write(text)
            _file.flush()


def _stop_answering() -> None:
    if signal.getsignal(STACK_SIGNAL) is _on_request:
        signal.signal(STACK_SIGNAL, signal.SIG_IGN)
    if faulthandler.unregister(FALLBACK_SIGNAL):  # restores the default action: ending
        signal.signal(FALLBACK_SIGNAL, signal.SIG_IGN)


def dump_text() -> str:
    """Every Python thread's stack but the caller's, as ``faulthandler`` writes them (most recent
    call first, at most :data:`MAX_DEPTH` frames), the main thread last, as the current one."""
    frames = sys._current_frames()
    main = threading.main_thread().ident
    others = [ident for ident in frames if ident not in (main, threading.get_ident())]
    blocks = [_thread_text("Thread", ident, frames[ident]) for ident in others]
    if main in frames:
        blocks.append(_thread_text("Current thread", main, frames[main]))
    return "\n".join(blocks)


def _thread_text(head: str, ident: int, frame: FrameType | None) -> str:
    lines = [f"{head} 0x{ident:016x} (most recent call first):\n"]
    depth = 0
    while frame is not None:
        if depth == MAX_DEPTH:
            lines.append("  ...\n")
            break
        code = frame.f_code
        lines.append(f'  File "{code.co_filename[:MAX_TEXT]}", line {frame.f_lineno or 0} '
                     f"in {code.co_name[:MAX_TEXT]}\n")
        frame, depth = frame.f_back, depth + 1
    return "".join(lines)


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
