"""Warm ranks of a pool: rank processes started ahead (not forked), that have imported torch and,
on a GPU, initialised CUDA and created their context on their device, each waiting to become a
rank of a replica (``serving.warm_worker`` is their side).

:class:`WarmSpares` keeps up to a count of them per device key (``cpu``, ``cuda:N``: a device as
``serving.placement`` writes it). :meth:`WarmSpares.take` gives a ready one as a
:class:`WarmStart`, a ``StartRank`` like ``replica.cold_start``: called with the rank's
environment, log and channel, it hands them to the warm process over its control socket, and
that process *is* the rank from then on: a child of the leader, its exit status its own. Should
the hand-off fail (the warm process died meanwhile), the rank starts cold instead.

Bounds: a warm rank must be ready within ``start_timeout`` of its start, or it is killed and
counts as failed (so does one whose warm-up raised, or that died); after :data:`WARM_TRIES`
failures in a row on one device, :meth:`WarmSpares.fill` starts no more there (its ranks start
cold). The hand-off is one send on a local socket (``HAND_S`` at most). An idle ready warm rank
waits without a deadline: it costs a process, nothing else. :meth:`WarmSpares.close` ends
them by a :class:`~rankguard.deadline.Deadline`. Warm ranks die with the thread that started
them (PR_SET_PDEATHSIG): call :meth:`WarmSpares.fill` from a thread that outlives them (the pool's
supervisor thread).
"""

from __future__ import annotations

import enum
import os
import pickle
import re
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..deadline import Deadline, check_seconds
from ..errors import UsageError, shown
from ..inputs.options import whole_number
from ..processes import proctree
from ..records import private_files
from ..supervisor import spawn
from . import leader_env
from .budgets import REAP_S
from .placement import CPU, DEVICE_ENV
from .replica import WORKER_MODULE, cold_start
from .warm_worker import (CONTROL_FD_ENV, MAX_MESSAGE, WARM_FLAG, WarmOp, WarmPart)
from .warm_worker import DEVICE_ENV as WARM_DEVICE_ENV

WARM_TRIES = 3  # warm ranks of one device that may fail in a row before none start there
HAND_S = 2.0  # how long handing a rank to a warm process may take (one local send: ms)
LOG_TAIL = 2000  # characters of a failed warm rank's output kept in its failure
TOKEN_VAR = "RANKGUARD_WARM_TOKEN"  # in each warm rank's environ, and in what it forks
_DEVICE = re.compile(r"cpu|cuda:(0|[1-9][0-9]*)", re.ASCII)


class WarmState(enum.StrEnum):
    """Where a warm rank stands."""

    WARMING = "warming"  # started, not ready yet
    READY = "ready"  # warmed up, waiting to become a rank
    TAKEN = "taken"  # given out by take(), not yet called


@dataclass(frozen=True)
class WarmCount:
    """The warm ranks of one device, for a journal or metrics line.

    Attributes:
        ready, warming: how many are in each state.
        failed: failures in a row (a ready warm rank resets it).
        failure: the last failure in words ("" if none).
        warmup_s: the seconds of the last warm-up that ended ready, by part (empty if none).
    """

    ready: int = 0
    warming: int = 0
    failed: int = 0
    failure: str = ""
    warmup_s: Mapping[WarmPart, float] = field(default_factory=dict)


@dataclass(eq=False)
class _Warm:
    device: str
    proc: subprocess.Popen[bytes]
    control: socket.socket
    log: str
    ready_by: Deadline
    state: WarmState = WarmState.WARMING
    parts: dict[WarmPart, float] = field(default_factory=dict)
    watcher: threading.Thread | None = None


@dataclass
class _Device:
    warm: list[_Warm] = field(default_factory=list)
    failed: int = 0
    failure: str = ""
    warmup_s: dict[WarmPart, float] = field(default_factory=dict)


def check_device(device: object) -> str:
    """``device`` if it is a device key (``cpu``, ``cuda:N``).

    Raises:
        UsageError: anything else.
    """
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise UsageError("WarmSpares(device)", f"{shown(device)} is not a device",
                         "give 'cpu' or 'cuda:N' (N a CUDA device index), as "
                         "serving.placement writes them")
    return device


class WarmStart:
    """A ready warm rank, given out by :meth:`WarmSpares.take`: a ``StartRank`` (call it once).

    Attributes:
        device: the device it warmed up on.
        pid: its process.
        parts: the seconds its warm-up took, by part.
        fallback: why the rank started cold instead, once called ("" while the warm process
            became the rank).
    """

    def __init__(self, owner: WarmSpares, warm: _Warm) -> None:
        self._owner = owner
        self._warm = warm
        self.device = warm.device
        self.pid = warm.proc.pid
        self.parts = dict(warm.parts)
        self.fallback = ""
        self._called = False

    @property
    def warmup_s(self) -> float:
        """The whole warm-up, in seconds."""
        return sum(self.parts.values())

    def __call__(self, env: dict[str, str], log: str, channel_fd: int) -> Any:
        """Make the warm process the rank whose environment is ``env`` (complete: it replaces
        the process's), its output going to ``log`` (appended, created 0600), its channel to
        the leader ``channel_fd``, its working folder the leader's; returns its
        ``subprocess.Popen``. When that fails (the warm process died, or the warm ranks were
        closed), the rank starts cold (:func:`~rankguard.serving.replica.cold_start`) and
        :attr:`fallback` says why.

        Raises:
            ValueError: ``env`` places the rank on another device than this warm rank's, or
                this was called before.
        """
        if self._called:
            raise ValueError("this warm rank was handed out already: take() another")
        self._called = True
        warm = self._warm
        claimed = self._owner._claim(warm)
        placed = env.get(DEVICE_ENV) or CPU
        if placed != self.device:
            if claimed:
                self._owner._end(warm)
            raise ValueError(f"a rank placed on {placed} was given a warm rank of "
                             f"{self.device}: take() one of the rank's device")
        if not claimed:
            self.fallback = "the warm ranks were closed"
            return cold_start(env, log, channel_fd)
        message = pickle.dumps({"op": WarmOp.BECOME, "env": dict(env), "cwd": os.getcwd()})
        try:
            with open(log, "ab", opener=private_files.opener) as out:
                warm.control.settimeout(HAND_S)
                socket.send_fds(warm.control, [message], [channel_fd, out.fileno()])
        except OSError as error:
            self.fallback = f"the warm rank (pid {self.pid}) could not take it: {error}"
            self._owner._end(warm)
            return cold_start(env, log, channel_fd)
        warm.control.close()
        _remove_if_empty(warm.log)
        return warm.proc


class WarmSpares:
    """Up to a count of warm ranks per device; see the module docstring.

    Args:
        env: the ranks' extra environment (the pool's ``env``): a warm rank starts with the
            leader's environment and this, the base of every rank's environment.
        log_dir: where each warm rank's output goes until it becomes a rank
            (``warm-<device>-<n>.log``, removed when empty).
        start_timeout: how long a warm rank may take to be ready (seconds, > 0).
        on_change: called, from a thread of its own and under no lock of this object's, when
            a warm rank became ready or failed. Must not wait for the warm ranks.

    Raises:
        UsageError: a ``start_timeout`` that is not a positive number of seconds.
    """

    def __init__(self, env: Mapping[str, str], log_dir: str, start_timeout: float,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self._env = dict(env)
        self._log_dir = log_dir
        self._start_timeout = check_seconds("WarmSpares(start_timeout)", start_timeout,
                                            text=False)
        self._on_change = on_change
        self._lock = threading.Lock()
        self._devices: dict[str, _Device] = {}
        self._started = 0
        self._closed = False
        self._token = secrets.token_hex(8)  # marks every warm rank, and what it forks

    # -- starting ---------------------------------------------------------------------------

    def fill(self, device: str, count: int) -> int:
        """Start warm ranks on ``device`` until it has ``count`` (warming, ready or taken and
        not yet called); does not wait for them. Returns how many it started: none once closed,
        or after ``WARM_TRIES`` failures in a row there.

        Raises:
            UsageError: ``device`` is not ``cpu`` or ``cuda:N``, or ``count`` is not a whole
                number >= 0.
            OSError: a process or socket could not be made (those started before stay).
        """
        check_device(device)
        whole_number("WarmSpares.fill(count)", count, 0)
        with self._lock:
            if self._closed:
                return 0
            slot = self._devices.setdefault(device, _Device())
            dead = self._prune(slot)
        self._died_idle(dead)
        with self._lock:
            missing = count - len(slot.warm) if slot.failed < WARM_TRIES else 0
        os.makedirs(self._log_dir, exist_ok=True)
        started = 0
        for _ in range(missing):
            warm = self._start(device)
            with self._lock:
                closed = self._closed
                if not closed:
                    slot.warm.append(warm)
            if closed:
                self._end(warm)
                break
            warm.watcher = threading.Thread(target=self._await_ready, args=(warm,), daemon=True,
                                            name=f"rankguard-warm-{warm.proc.pid}")
            warm.watcher.start()
            started += 1
        return started

    def _start(self, device: str) -> _Warm:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with self._lock:
            self._started += 1
            number = self._started
        log = os.path.join(self._log_dir, f"warm-{device.replace(':', '')}-{number}.log")
        env = {**os.environ, **leader_env.leader_context(), **self._env,
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               CONTROL_FD_ENV: str(theirs.fileno()), WARM_DEVICE_ENV: device,
               TOKEN_VAR: self._token}
        try:
            proc = spawn([sys.executable, "-m", WORKER_MODULE, WARM_FLAG], env, log=log,
                         pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return _Warm(device, proc, ours, log, Deadline.after(self._start_timeout))

    def _await_ready(self, warm: _Warm) -> None:
        """The warm rank's watcher: its ready message, failure, exit or lateness."""
        message: dict[str, Any] | None = None
        wait = warm.ready_by.wait_time()
        if wait > 0:
            warm.control.settimeout(wait)
            try:
                data = warm.control.recv(MAX_MESSAGE)
                message = pickle.loads(data) if data else None
                detail = "" if data else "exited during its warm-up"
            except TimeoutError:
                detail = f"was not ready within {self._start_timeout:g} s"
            except OSError as error:
                detail = f"could not be heard ({error})"
        else:
            detail = f"was not ready within {self._start_timeout:g} s"
        with self._lock:
            slot = self._devices[warm.device]
            if self._closed or warm not in slot.warm:
                return
            if message is not None and message.get("op") == WarmOp.READY:
                warm.state = WarmState.READY
                warm.parts = dict(message["parts"])
                slot.failed, slot.warmup_s = 0, dict(warm.parts)
            else:
                slot.warm.remove(warm)
        if warm.state != WarmState.READY:
            self._end(warm)
            if message is not None:  # its traceback says it all
                self._failed(warm, f"failed its warm-up: {str(message.get('error')).strip()}")
            else:
                self._failed(warm, detail, output=True)
        self._on_change()

    def _failed(self, warm: _Warm, detail: str, output: bool = False) -> None:
        """Count a failure of ``warm`` (ended already) on its device: ``detail``, then how it
        ended and (``output``) the end of its output."""
        detail = f"warm rank {warm.proc.pid} on {warm.device} {detail}"
        if output:
            if warm.proc.returncode is not None:
                detail += f" ({proctree.exit_detail(warm.proc.returncode)})"
            try:
                with open(warm.log, errors="replace") as f:
                    tail = f.read()[-LOG_TAIL:].strip()
            except OSError:
                tail = ""
            detail += f":\n{tail}" if tail else ""
        with self._lock:
            slot = self._devices[warm.device]
            slot.failed += 1
            slot.failure = detail

    # -- giving out -------------------------------------------------------------------------

    def take(self, device: str) -> WarmStart | None:
        """A warm rank of ``device`` that is ready (it reported its warm-up done and is still
        alive), as a ``StartRank`` to call once; None when there is none (also after
        :meth:`close`). It no longer counts as one of ``device``'s after it was called.

        Raises:
            UsageError: ``device`` is not ``cpu`` or ``cuda:N``.
        """
        check_device(device)
        with self._lock:
            slot = self._devices.get(device)
            if self._closed or slot is None:
                return None
            dead = self._prune(slot)
            warm = next((w for w in slot.warm if w.state == WarmState.READY), None)
            if warm is not None:
                warm.state = WarmState.TAKEN
        self._died_idle(dead)
        return WarmStart(self, warm) if warm is not None else None

    def _claim(self, warm: _Warm) -> bool:
        """Whether ``warm`` (taken) may become a rank now: it leaves this set if so."""
        with self._lock:
            slot = self._devices[warm.device]
            if self._closed or warm not in slot.warm or warm.state != WarmState.TAKEN:
                return False
            slot.warm.remove(warm)
            return True

    def _died_idle(self, dead: list[_Warm]) -> None:
        """End and count as failed the ready warm ranks found dead (by :meth:`_prune`)."""
        for warm in dead:
            self._end(warm)
            self._failed(warm, "exited while it waited to be needed", output=True)

    def _prune(self, slot: _Device) -> list[_Warm]:
        """Under the lock: drop the ready warm ranks of ``slot`` that have exited; returns
        them (to end and count, out of the lock)."""
        dead = [w for w in slot.warm if w.state == WarmState.READY and w.proc.poll() is not None]
        for warm in dead:
            slot.warm.remove(warm)
        return dead

    def pids(self) -> list[int]:
        """The processes of the warm ranks not handed out (warming, ready or taken)."""
        with self._lock:
            return [w.proc.pid for slot in self._devices.values() for w in slot.warm]

    def counts(self) -> dict[str, WarmCount]:
        """Each device's warm ranks, as now (taken ones not yet called count as ready)."""
        with self._lock:
            return {device: WarmCount(
                ready=sum(w.state != WarmState.WARMING and w.proc.poll() is None
                          for w in slot.warm),
                warming=sum(w.state == WarmState.WARMING for w in slot.warm),
                failed=slot.failed, failure=slot.failure, warmup_s=dict(slot.warmup_s))
                for device, slot in self._devices.items()}

    # -- ending -----------------------------------------------------------------------------

    def close(self, until: Deadline) -> None:
        """End every warm rank not handed out: a ready one is told it is not needed (its
        socket closes: it exits 0), one still warming is killed at once (it holds nothing);
        what is left at ``until`` is killed; all are reaped (``REAP_S`` more at most). A
        :class:`WarmStart` called afterwards starts its rank cold.

        Then it kills every process that still shows this set's token (``TOKEN_VAR``) in /proc:
        what a rank that was a warm rank forked without exec (its /proc environ is the warm
        rank's, without its replica's marker, so the replica's sweep misses it), and such a
        rank itself if it still runs: close the replicas whose ranks came from here first, as a
        pool closes its zygote last. Idempotent."""
        with self._lock:
            self._closed = True
            warms = [w for slot in self._devices.values() for w in slot.warm]
            for slot in self._devices.values():
                slot.warm.clear()
        for warm in warms:
            if warm.state == WarmState.WARMING:
                warm.proc.kill()
            try:
                warm.control.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        proctree.await_exits([w.proc.pid for w in warms], until)
        for warm in warms:
            self._end(warm)
        proctree.kill_all(proctree.with_env(TOKEN_VAR, self._token))

    def _end(self, warm: _Warm) -> None:
        """Kill ``warm``'s process if it runs, reap it (``REAP_S`` at most), close its socket
        once its watcher is done with it, and remove its log if empty."""
        if warm.proc.poll() is None:
            warm.proc.kill()
        try:
            warm.proc.wait(REAP_S)
        except subprocess.TimeoutExpired:
            pass  # unkillable (D state): the kernel reaps it with its parent
        watcher = warm.watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(REAP_S)
        warm.control.close()
        _remove_if_empty(warm.log)


def _remove_if_empty(path: str) -> None:
    try:
        if os.path.getsize(path) == 0:
            os.unlink(path)
    except OSError:
        pass
