"""The launcher's terminal: its stdout and stderr, written best effort, never blocking.

Rank output is teed to the launcher's stdout and stderr, and the launcher writes its own lines
there (verdicts, the summary). Those are often pipes (``| tee``, ``| head``, a CI log reader),
and a reader that stalls or goes away must neither stall the launcher (its hang detector runs in
the same loop as the tee) nor crash it. So each stream is written by a daemon thread from a
bounded buffer:

- ``write`` only appends to the buffer, without blocking, in time proportional to its data;
  when the buffer already holds ``LIMIT`` bytes the reader is not keeping up, and the new data
  is dropped and counted;
- once the reader has closed its end (EPIPE, or any other write error) the stream is closed:
  everything after is dropped and counted;
- ``flush(deadline)`` waits for the buffer to drain until ``deadline`` at most.

The rank logs in the log dir keep everything; the terminal is only a view of them. The writer
thread may stay blocked in ``write(2)`` on a reader that never reads; it is a daemon thread and
holds no lock while blocked, so the launcher still exits on time.

A stream redirected to a regular file (``rankguard run ... > out.txt``) or to ``/dev/null`` has
no reader to wait for: it is written at once, in ``write``, as the rank logs are, and nothing is
dropped unless a write fails (a full disk: then the stream is closed as above). A buffer there
would only drop output when the writer thread lagged the ranks, not because of any reader.
"""

from __future__ import annotations

import collections
import os
import shutil
import stat
import threading

from ..deadline import Deadline

LIMIT = 1 << 20  # bytes waiting for a slow reader before new output is dropped


class Output:
    """One of the launcher's output file descriptors, written from a bounded buffer."""

    def __init__(self, fd: int, name: str, limit: int = LIMIT) -> None:
        self.fd = fd
        self.name = name
        self.limit = limit
        self.dropped = 0  # bytes never written: the reader was too slow or gone
        self.closed = False  # the reader went away (or the fd cannot be written)
        self._chunks: collections.deque[bytes] = collections.deque()
        self._queued = 0  # bytes in _chunks plus the chunk being written
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self.direct = _never_blocks(fd)  # written in ``write``, no buffer, no thread

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the reader, or drop it (counted) if the reader is behind or gone;
        to a file, write it now (dropped only if the write fails).

        Never blocks on a reader; safe from any thread, not from a signal handler.
        """
        if not data:
            return
        with self._cond:
            if self.closed or (not self.direct and self._queued + len(data) > self.limit):
                self.dropped += len(data)
                return
            if self.direct:  # under the lock: lines of several threads do not interleave
                unwritten = _write_all(self.fd, data)
                if unwritten:
                    self.closed = True
                    self.dropped += unwritten
                return
            self._chunks.append(data)
            self._queued += len(data)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"rankguard-{self.name}",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    @property
    def undelivered(self) -> int:
        """Bytes dropped, plus those still queued: what is lost if the launcher exits now."""
        with self._cond:
            return self.dropped + self._queued

    def flush(self, deadline: Deadline) -> bool:
        """Wait until ``deadline`` at most for everything queued to be written; True if it was
        (or the stream is closed and nothing more can be)."""
        with self._cond:
            while self._queued and not self.closed:
                if deadline.passed():
                    return False
                self._cond.wait(deadline.wait_time())
            return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._chunks:
                    self._cond.wait()
                chunk = self._chunks.popleft()
            unwritten = _write_all(self.fd, chunk)
            if unwritten:
                with self._cond:
                    self.closed = True
                    self.dropped += unwritten + sum(map(len, self._chunks))
                    self._chunks.clear()
                    self._queued = 0
                    self._cond.notify_all()
                return
            with self._cond:
                self._queued -= len(chunk)
                self._cond.notify_all()


def _write_all(fd: int, data: bytes) -> int:
    """Write all of ``data`` to ``fd``; the number of bytes left unwritten (0 unless a write
    failed: EPIPE, the reader closed its end; EBADF, no such output; ENOSPC...)."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        return len(view)
    return 0


_ERASE = b"\r\x1b[K"  # to the line's start, and clear it


def _is_terminal(fd: int) -> bool:
    """Whether ``fd`` is a terminal that can take the status line (not ``TERM=dumb``)."""
    try:
        return os.isatty(fd) and os.environ.get("TERM", "") not in ("", "dumb")
    except OSError:
        return False


def _same_file(fd: int, other: int) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.fstat(other))
    except OSError:
        return False


def _never_blocks(fd: int) -> bool:
    """Whether ``fd`` is a regular file or ``/dev/null``: writes there wait for no reader."""
    try:
        st = os.fstat(fd)
        return stat.S_ISREG(st.st_mode) or os.path.samestat(st, os.stat(os.devnull))
    except OSError:
        return False


class Terminal:
    """The launcher's stdout and stderr (see the module doc), and, where stderr is a terminal,
    a status line under the output (``status``).

    The status line is stderr's last line, without a newline: every other write (rank output,
    the launcher's own lines) first erases it, through the stream it goes to (the status line is
    drawn again at the next ``status``). Only the thread that runs the launcher's loop writes
    here, so the erasing and the output are in order within each stream.
    """

    def __init__(self, out_fd: int = 1, err_fd: int = 2, status: bool = False) -> None:
        self.out = Output(out_fd, "stdout")
        self.err = Output(err_fd, "stderr")
        self._status_on = status and _is_terminal(err_fd)
        self._status_shown = False
        # rank stdout erases the status line itself only when it goes to the same terminal
        # (in order with its own output); else through stderr
        self._erase_via_out = self._status_on and _same_file(out_fd, err_fd)

    def rank_out(self, data: bytes) -> None:
        """Rank output for stdout."""
        self._erase_status(self.out if self._erase_via_out else self.err)
        self.out.write(data)

    def rank_err(self, data: bytes) -> None:
        """Rank output for stderr."""
        self._erase_status(self.err)
        self.err.write(data)

    def status(self, text: str) -> None:
        """Show ``text`` as the status line (cut to the terminal's width); nothing where stderr
        is not a terminal or the status line is off."""
        if not self._status_on:
            return
        width = shutil.get_terminal_size((80, 24)).columns
        self.err.write(_ERASE + text[:max(width - 1, 10)].encode(errors="replace"))
        self._status_shown = True

    def end_status(self) -> None:
        """Erase the status line for good (before the summary)."""
        self._erase_status(self.err)
        self._status_on = False

    def _erase_status(self, stream: Output) -> None:
        if self._status_shown:
            self._status_shown = False
            stream.write(_ERASE)

    def flush(self, deadline: Deadline) -> bool:
        """Wait until ``deadline`` at most for both streams to be written out (their threads
        write at the same time); True if both were."""
        return all([self.out.flush(deadline), self.err.flush(deadline)])

    def say(self, line: str) -> None:
        """One line of the launcher's own to stderr, best effort."""
        self._erase_status(self.err)
        self.err.write(line.encode(errors="replace") + b"\n")

    def dropped(self) -> dict[str, int]:
        """Bytes each stream did not deliver so far, dropped or still queued for a reader that
        fell behind: ``{"stdout": n, "stderr": m}``."""
        return {o.name: o.undelivered for o in (self.out, self.err)}

    def dropped_line(self) -> str | None:
        """A line saying what the terminal lost, or None when nothing was lost."""
        lost = [(o, o.undelivered) for o in (self.out, self.err) if o.undelivered]
        if not lost:
            return None
        parts = ", ".join(f"{n} bytes of {o.name} ({_why(o)})" for o, n in lost)
        return f"terminal: dropped {parts}; the rank logs have everything"


def _why(output: Output) -> str:
    if output.direct:
        return "a write to the file it goes to failed"
    return "its reader closed it" if output.closed else "its reader fell behind"
