"""Asking processes for their Python stacks: a signal to a process that answers it with a dump
(SIGUSR1 for rankguard's rank runtime, answered by its watcher thread; ``testing.processes.
STACK_SIGNAL`` for the pytest process and the children it forks, answered by faulthandler), then
waiting for the dump to land in its file.

A rank's watcher thread needs the GIL: a rank that has not answered after
:data:`FALLBACK_AFTER_S` (a C call holding the GIL) is asked again with
:data:`RANK_FALLBACK_SIGNAL`, which its faulthandler answers from the signal handler. A stopped
rank is asked with that one at once: continued, it dumps where it stopped before it runs on
(the watcher would answer a few milliseconds later, from wherever it got to by then).

Used by the launcher's escalation ladder and by the plugin's watchdog. Bounded: a process that
does not answer within the budget (gone, or stopped and never continued) is given up on.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

from . import proctree
from ..deadline import Deadline

DUMP_POLL_S = 0.005  # between looks at the sizes of the dump files
DUMP_QUIET_S = 0.02  # faulthandler writes a whole dump within its handler, in a few ms
# how long a target stopped again is waited for to be seen stopped (the kernel stops it when it
# is next scheduled: milliseconds, more on a loaded machine)
RESTOP_SETTLE_S = 2.0


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


RANK_SIGNAL = signal.SIGUSR1  # the rank runtime's (``runtime.stacks``): the launcher's contract
# its faulthandler's, for a rank whose watcher cannot take the GIL (real-time: SIGUSR2 is the
# programs' own, and threading libraries take the lowest real-time ones)
RANK_FALLBACK_SIGNAL = signal.SIGRTMAX - 3
FALLBACK_AFTER_S = 0.5  # without an answer to RANK_SIGNAL (it comes in ms when the GIL is free)


def request(pid: int, sig: int = RANK_SIGNAL) -> bool:
    """Send the request ``sig`` to ``pid``'s main thread (a stopped process dumps before running
    any further code), continuing it if it is stopped; False if it is gone."""
    try:
        proctree.signal_main_thread(pid, sig)
        os.kill(pid, signal.SIGCONT)
    except OSError:
        return False
    return True


def await_dumps(files: Mapping[Hashable, Iterable[str]], before: Mapping[str, int],
                deadline: Deadline, gone: Callable[[Hashable], bool] = lambda key: False) -> None:
    """Wait until each asker's files grew past their ``before`` sizes and then stayed quiet,
    its process is ``gone``, or ``deadline`` passed."""
    waiting = {key: list(paths) for key, paths in files.items()}
    last = {key: [before.get(p, 0) for p in paths] for key, paths in waiting.items()}
    grew_at: dict[Hashable, float] = {}
    while waiting and not deadline.passed():
        time.sleep(deadline.wait_time(DUMP_POLL_S))
        now = time.monotonic()
        for key, paths in list(waiting.items()):
            if gone(key):
                del waiting[key]
                continue
            sizes = [file_size(p) for p in paths]
            if sizes != last[key]:
                last[key], grew_at[key] = sizes, now
            elif key in grew_at and now - grew_at[key] >= DUMP_QUIET_S:
                del waiting[key]  # written, then quiet: the dump is complete


def ask(targets: Mapping[Hashable, tuple[int, Sequence[str]]], budget: float,
        gone: Callable[[Hashable], bool] = lambda key: False,
        sig: int = RANK_SIGNAL, keep_stopped: bool = False) -> dict[Hashable, str]:
    """Ask each target (key -> its pid and the files it dumps into) for its stacks with
    ``sig``, at once (ranks still silent after :data:`FALLBACK_AFTER_S`, again with
    :data:`RANK_FALLBACK_SIGNAL`), and wait for the dumps as :func:`await_dumps` does; key ->
    the text its files gained, for the targets that answered within ``budget`` seconds.

    A stopped target is continued so that it can dump; ``keep_stopped`` (a look at a job that
    must not change it) stops it again once the wait is over, so that it runs only for its
    dump and the few milliseconds after, and returns once it is seen stopped (or after
    :data:`RESTOP_SETTLE_S`): a caller that looks next sees it as it found it."""
    stopped = [pid for pid, _ in targets.values() if keep_stopped and proctree.is_stopped(pid)]
    try:
        return _ask(targets, budget, gone, sig)
    finally:
        _stop_again(stopped)


def _stop_again(pids: Sequence[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGSTOP)
        except OSError:
            pass  # gone meanwhile
    settled = Deadline.after(RESTOP_SETTLE_S)
    for pid in pids:
        while proctree.alive(pid) and not proctree.is_stopped(pid) and not settled.passed():
            time.sleep(DUMP_POLL_S)


def _ask(targets: Mapping[Hashable, tuple[int, Sequence[str]]], budget: float,
         gone: Callable[[Hashable], bool], sig: int) -> dict[Hashable, str]:
    before = {path: file_size(path) for _, paths in targets.values() for path in paths}
    asked = {key: paths for key, (pid, paths) in targets.items()
             if request(pid, _first_signal(pid, sig))}
    deadline = Deadline.after(budget)
    if sig == RANK_SIGNAL:
        await_dumps(asked, before, Deadline.after(min(FALLBACK_AFTER_S, budget / 2)), gone)
        for key, paths in asked.items():
            pid = targets[key][0]
            if not _grew(paths, before) and not gone(key) \
                    and proctree.catches(pid, RANK_FALLBACK_SIGNAL):
                request(pid, RANK_FALLBACK_SIGNAL)
    await_dumps(asked, before, deadline, gone)
    dumps = {}
    for key, paths in asked.items():
        texts = []
        for path in paths:
            if file_size(path) > before[path]:
                with open(path, errors="replace") as f:
                    f.seek(before[path])
                    texts.append(f.read())
        if texts:
            dumps[key] = "".join(texts)
    return dumps


def _first_signal(pid: int, sig: int) -> int:
    if sig == RANK_SIGNAL and proctree.is_stopped(pid) \
            and proctree.catches(pid, RANK_FALLBACK_SIGNAL):
        return RANK_FALLBACK_SIGNAL
    return sig


def _grew(paths: Iterable[str], before: Mapping[str, int]) -> bool:
    return any(file_size(path) > before.get(path, 0) for path in paths)
