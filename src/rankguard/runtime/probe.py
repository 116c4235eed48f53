"""Asking the peers of a failed collective where they are.

When a collective fails or times out, the rank that saw it wants to name the ranks that had not
arrived. Every rank of a generation runs a small **responder** thread that blocks on a queue in
the generation's store (its own client connection, so it never holds up the main thread's store
calls) and answers each request with its own progress in the asked group: how many operations
it entered and completed, the last one, and whether it retired the group. The answer comes from
the rank's counters, which only its main thread advances, so it reports progress, not liveness:
a rank whose main thread is frozen answers that it is behind, and a stopped, dead or GIL-holding
rank does not answer at all.

The asking rank pushes a request to each peer's queue and waits in the store for the answers
for at most ``ANSWER_WINDOW_S``. The whole ask runs through ``store_calls``: it returns
within the window (plus ``THREAD_SLACK_S``) even when the store's server is stopped or frozen
(the stalled connection is then dropped, and the next ask makes a new one). A request may carry a
**notice** that the group failed: the responder then retires the group locally, which wakes a
main thread waiting in a collective that will never complete because the failure was elsewhere
(in a ring, only the neighbours of a dead rank see its connection close).

Every request and answer is sealed with the run's secret (``rankguard.sealed``) for the queue
or key it is written to: a request, notice or answer that another process wrote into the store
is dropped, never acted on.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from datetime import timedelta
from typing import Any, Callable

from ..store import sealed
from ..deadline import Deadline
from ..errors import first_line
from ..margins import ANSWER_WINDOW_S
from ..store import store_calls
from ..store.store_calls import StoreStalled, within

# for the ask's own thread to start, and to read the answers once the window ended, on a loaded
# machine (0.1 s was cut short under CI's load: the answers that came went unread)
THREAD_SLACK_S = 0.3
GONE_POLL_S = 0.02  # how often an ask looks for answers, and whether a peer is known dead
_IDLE_WAIT = timedelta(hours=1)  # a responder's wait for the next request; then it waits again
_ASK_TIMEOUT = timedelta(seconds=2)

Describe = Callable[[str], "dict[str, Any] | None"]
OnNotice = Callable[[str, "dict[str, Any]"], None]
_request_ids = itertools.count(1)


def _queue(rank: int, generation: int) -> str:
    return f"rankguard/probe/g{generation}/{rank}"


def _answer_key(request: str, rank: int) -> str:
    return f"rankguard/answer/{request}/{rank}"


def clone_client(store: Any, timeout: timedelta) -> Any | None:
    """A new client connection to ``store``'s server with its own timeout, or None for a store
    that cannot be cloned (HashStore, FileStore: peers cannot be asked then)."""
    try:
        client = store.clone()
        client.set_timeout(timeout)
        client.queue_push  # noqa: B018 (needs the queue API)
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    return client


class Responder:
    """Answers the probes addressed to this rank until ``close()``; one per process, made with
    the first generation's store and kept for the later ones (:meth:`follow`): each new
    client connection costs a reverse DNS lookup in torch, which stalls for 5 s when the
    resolver does not answer (1 connect in about 25 here)."""

    def __init__(self, store: Any, rank: int, describe: Describe, on_notice: OnNotice,
                 generation: int = 0) -> None:
        self._rank = rank
        self._size = 0  # the generation's, once known (follow)
        self.store = store
        self._generation = generation  # a replacement's first is a later one
        self._waiting_on = _queue(rank, generation)  # the thread's queue, for follow/close
        self._describe = describe
        self._on_notice = on_notice
        self._client = clone_client(store, _IDLE_WAIT)
        self._closer = clone_client(store, _ASK_TIMEOUT)
        self._closed = False
        self._thread: threading.Thread | None = None
        if self._client is not None and self._closer is not None:
            self._thread = threading.Thread(target=self._serve, name="rankguard-responder",
                                            daemon=True)
            self._thread.start()

    @property
    def serving(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._closed

    def follow(self, rank: int, generation: int, size: int) -> None:
        """Answer as ``rank`` of ``generation`` (of ``size`` ranks) from now on."""
        self._rank, self._generation, self._size = rank, generation, size
        self._tell_thread({"wake": True})  # it waits on the old queue

    def _tell_thread(self, message: dict[str, Any]) -> None:
        queue = self._waiting_on
        try:
            self._closer.queue_push(queue, sealed.seal(queue, json.dumps(message)))
        except Exception:  # noqa: BLE001 (the store is gone: so is the thread's wait)
            pass

    def _serve(self) -> None:
        client = self._client
        while not self._closed:
            queue = self._waiting_on = _queue(self._rank, self._generation)
            try:
                text = sealed.unseal(queue, client.queue_pop(queue, True))
            except Exception as error:  # noqa: BLE001 (idle timeout, or the store is gone)
                # a closed connection needs no check (which would log one more C++ warning)
                if type(error).__name__ == "DistNetworkError" or self._store_gone():
                    return
                continue
            if text is None:
                continue  # not from a rank of this run
            message = json.loads(text)
            if message.get("stop"):
                return
            if message.get("wake"):
                continue
            group = message.get("group", "")
            answer = self._describe(group)
            if message.get("notice"):
                self._on_notice(group, message["notice"])
            key = _answer_key(message["id"], self._rank)
            try:
                client.set(key, sealed.seal(key, json.dumps(answer)))
            except Exception:  # noqa: BLE001 (the asker's store went away: nobody to answer)
                return

    def _store_gone(self) -> bool:
        try:
            self._closer.check(["rankguard/alive"])
        except Exception:  # noqa: BLE001
            return True
        return False

    def close(self, timeout: float = 1.0) -> None:
        """Stop answering and wait up to ``timeout`` s for the thread to end.

        Called at interpreter exit too: a daemon thread still inside a torch call when the
        interpreter finalizes is ended by a forced unwind that aborts the process. Does not
        wait when a store call was already abandoned (``store_calls``): the stop
        cannot reach a thread blocked on a stalled store, and it stays blocked there. A thread
        that already ended (stopped by the store's host, see :meth:`release_peers`) is not
        told: its store may be gone, and a write to it logs a C++ warning.
        """
        if self._closed:
            return
        self._closed = True
        if self._thread is not None and self._thread.is_alive():
            self._tell_thread({"stop": True})
            self._thread.join(0 if store_calls.abandoned() else timeout)

    def release_peers(self) -> None:
        """Stop the responders of the other ranks of this generation.

        For the process that hosts the store's server, as it exits: its peers' responders
        are blocked on that server, and each would otherwise print torch's C++ warning and
        stack dump when it goes, however cleanly the job ended. Bounded by the store
        client's timeout per push (a server in this process answers at once).
        """
        for peer in range(self._size):
            if peer != self._rank:
                queue = _queue(peer, self._generation)
                try:
                    self._closer.queue_push(queue, sealed.seal(queue, json.dumps({"stop": True})))
                except Exception:  # noqa: BLE001 (the server is gone already: nothing waits)
                    return


class Asker:
    """Asks peers where they are; made with the first generation, used when something fails.
    ``generation``: the one whose peers it asks."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._client = clone_client(store, _ASK_TIMEOUT)
        self._cloneable = self._client is not None
        self.generation = 0
        self.last_problem = ""  # why the last ask could not reach the peers ("": it could)

    @property
    def available(self) -> bool:
        return self._cloneable

    def ask(self, group: str, peers: list[int], notice: dict[str, Any] | None = None,
            window: float = ANSWER_WINDOW_S, gone: Callable[[int], bool] | None = None
            ) -> dict[int, dict[str, Any] | None]:
        """Each peer's answer about ``group`` (None: no answer within ``window`` seconds, or
        ``gone(peer)``: it is known to be dead, and not waited for); with ``notice``, also tell
        them that the group failed. Returns within ``window`` (+ ``THREAD_SLACK_S``), whatever
        state the store is in.

        Returns an empty dict when the peers cannot be asked (no cloneable store, or its server
        is unreachable or stalled: ``last_problem`` then says which).
        """
        self.last_problem = ""
        if not self._cloneable or not peers:
            return {}
        answers: dict[int, dict[str, Any] | None] = {peer: None for peer in peers}
        client = self._client
        pushed = threading.Event()
        limit = Deadline.after(window)

        def ask() -> None:
            nonlocal client
            if client is None:  # the last one stalled: a new connection
                client = clone_client(self._store, _ASK_TIMEOUT)
            if client is not None:
                self._ask(client, group, peers, notice, limit, answers, pushed, gone)

        try:
            within(limit.later(THREAD_SLACK_S), "asking the peers", ask)
        except StoreStalled:
            self._client = None  # stuck in a call: never used again
            self.last_problem = ("the job's store did not answer (its server, often in rank 0's "
                                 "process, is stopped, frozen or overloaded)")
            return {}
        except Exception as error:  # noqa: BLE001 (the store's server is dead)
            if not pushed.is_set():
                self.last_problem = f"the job's store failed ({first_line(error)})"
                return {}
        self._client = client
        return answers

    def _ask(self, client: Any, group: str, peers: list[int], notice: dict[str, Any] | None,
             deadline: Deadline, answers: dict[int, dict[str, Any] | None],
             pushed: threading.Event, gone: Callable[[int], bool] | None) -> None:
        """Push the request to every peer, then fill ``answers`` as they come, until every peer
        answered or is ``gone``, or ``deadline`` passed. ``pushed`` is set once every request
        is out."""
        request = f"{os.getpid()}-{next(_request_ids)}"
        body = json.dumps({"id": request, "group": group, "notice": notice})
        for peer in peers:
            queue = _queue(peer, self.generation)
            client.queue_push(queue, sealed.seal(queue, body))
        pushed.set()
        waiting = {peer: _answer_key(request, peer) for peer in peers}
        while waiting:
            if gone is None:
                try:  # returns once every awaited answer is in, or raises at the deadline
                    client.wait(list(waiting.values()),
                                timedelta(seconds=deadline.wait_time(at_least=0.001)))
                except Exception:  # noqa: BLE001 (timed out: take the answers that came)
                    pass
            for peer, key in list(waiting.items()):
                if not client.check([key]):
                    continue
                text = sealed.unseal(key, client.get(key))
                if text is None:  # forged: make room for the peer's own answer
                    client.delete_key(key)
                    continue
                answers[peer] = json.loads(text)
                del waiting[peer]
            for peer in [peer for peer in waiting if gone is not None and gone(peer)]:
                del waiting[peer]
            if deadline.passed():
                break
            if gone is not None and waiting:
                # polled, not waited for in the store: a store wait that times out leaves
                # the connection out of step with its replies
                time.sleep(deadline.wait_time(GONE_POLL_S))

