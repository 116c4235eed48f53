"""The HTTP face of ``rankguard serve``: a Starlette application in front of a Pool.

Starlette (routing, JSON, lifespan) under uvicorn (the ASGI server, with its graceful SIGTERM
handling) are small, well-kept and standard for Python ASGI; the pool's blocking calls run in
Starlette's thread pool, so the event loop never waits on a rank.

Routes:

- ``POST /run``: the JSON body (an object) is the request. Its raw bytes go to every rank,
  which parses them and runs the service's ``validate``, then ``handle``
  (``serving.request_body``: the server does no work per byte of a body, so that its event
  loop answers every request by its deadline). The deadline (the service's timeout, or
  ``X-Request-Timeout``) starts when the body has been read whole and covers everything
  after: the wait for a replica, the parse, the run; the request is answered within it plus
  about 0.1 s. The head and the body each have the service's timeout to arrive (408).
  200 ``{"result", "took_s"}`` (``took_s``: from the body read to the answer); 400 malformed
  or too deeply nested JSON, or an ``X-Request-Timeout`` that is not a number of seconds from
  the pool's ``min_call_s`` to the service's timeout; 413 a body over ``max_body`` bytes
  (refused from its Content-Length before it is read, or as soon as a streamed body passes
  the limit); 503 ``TooManyRequestBytes`` a body that would make the bodies held at once pass
  ``max_inflight_bytes`` (from its Content-Length before it is read, or as it streams; with
  ``Retry-After``; see ``serving.inflight_bytes``); 422 a body that is not an object, holds
  NaN or an infinity, or that ``validate`` refused (a refused body holds a replica while its
  ranks parse it, and is no rank's fault); 408 a body that did not arrive within the
  service's timeout; 500 ``ValidateFailed`` ``validate`` raised another error (a bug of the
  service's, with its ``error_type``), or a rank failed the request (``{"error": {"type",
  "rank", "cause", "detail", "victims", "error_type"}}``; ``error_type``: the class name of
  the exception a rank raised, else null); 500 ``ServiceNotSendable`` the service's
  functions cannot be pickled to the ranks; 503 the pool is healing, starting, busy or
  failing to start (with ``Retry-After``), or closed (``PoolClosed``: also every request
  still running when the server's ``--grace`` after SIGTERM ends, answered then, with a
  reason saying so).
- ``GET /healthz``: 200 ``{"state": "ready", ...}``; 503 while ``starting``, ``healing``,
  ``failed`` or ``closed``.
- ``GET /livez`` (Kubernetes' liveness probe): 200 ``{"live": true, "state": ...}`` whenever
  the server answers, healing and starting included: restarting it would not help.
- ``GET /readyz`` (the readiness probe): 200 when a replica can take a request now (ready, not
  running one); else 503 with ``Retry-After`` and the reason (``busy``, or the pool's state).
  Both carry ``placement``: each healthy replica's ``group`` and its ranks' ``devices``.
- ``GET /metrics``: Prometheus text format, by the Prometheus client library (see
  ``serving.metrics``).
- Any other path: 404 ``NotFound``; a method a route does not take: 405
  ``MethodNotAllowed`` with ``Allow``; both JSON ``{"error": {"type", "detail"}}``.

Every response is counted by route and status code, as the client gets it (a middleware sees
each one the application sends). A client that closes its connection before its answer (while
it sends the body, or while its request waits or runs) is counted apart
(``client_disconnects``) and not logged: it gets no response. A request whose client left
while it waited for a replica gives up its place at once (outcome ``abandoned``); one already
running on the ranks runs on, since its ranks are mid-collective.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..deadline import Deadline
from ..errors import PoolClosed, PoolUnavailable, RequestFailed, UnavailableState, UsageError
from ..inputs.options import number
from . import metrics, request_body
from .budgets import CUT_CLOSE_S
from .head_deadline import Turned
from .inflight_bytes import INFLIGHT_BODIES, BodyBytes, InflightBytes
from .metrics import CallOutcome
from .pool import Abandon, Pool
from .pool_state import PoolState
from .service import Service

TIMEOUT_HEADER = "x-request-timeout"
ROUTES = ("/run", "/healthz", "/livez", "/readyz", "/metrics")  # others count as "other"
_NOT_READY_RETRY_S = 1  # /readyz's Retry-After: a probe's own period is about this
_SPARE_THREADS = 8  # worker threads beyond the pool's calls (probes run on the event loop)
_DROPPED = "rankguard.dropped"  # in a request's scope: its client left mid-body
_BYTES_RETRY_S = 1  # Retry-After of a body that did not fit: others are answered in that time


class _TooLarge(Exception):
    """The request's body passed the limit."""


class _TooManyBytes(Exception):
    """The request's body does not fit in the bytes the server holds at once."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class _ShuttingDown(Exception):
    """The server's grace after SIGTERM ended before the request did."""


class _Server:
    """The application's state: the service, its pool (made at start-up), response counts."""

    def __init__(self, service: Service, max_body: int, max_inflight_bytes: int,
                 connections: Turned, pool_options: dict[str, Any]) -> None:
        self.service = service
        self.max_body = max_body
        self.inflight = InflightBytes(max_inflight_bytes)
        self.pool_options = pool_options
        self.pool: Pool | None = None
        self.codes: Counter[tuple[str, int]] = Counter()  # (route, status) -> responses
        self.client_disconnects = 0
        self.stats = metrics.ServeMetrics(lambda: self.pool, lambda: dict(self.codes),
                                          lambda: self.client_disconnects,
                                          lambda: self.inflight.held, connections)
        self._ended = asyncio.Event()  # the grace after SIGTERM is over: requests end now
        self._end_reason = ""

    def end_requests(self, when: str) -> None:
        """From the event loop, when the server's grace after SIGTERM is over (``when`` says
        how, e.g. "its grace of 10 s after SIGTERM ended"): every request still reading its
        body or running on the ranks is answered 503 now (the ranks are stopped by the pool's
        close that follows), so that none is cancelled unanswered. Only the first call acts."""
        if self._ended.is_set():
            return
        self._end_reason = f"the server is shutting down: the request was still running when {when}"
        self._ended.set()

    async def _unless_ended(self, task: asyncio.Future[Any]) -> Any:
        """``task``'s result, unless the requests are ended first (``end_requests``): then
        ``task`` is cancelled and _ShuttingDown raised."""
        ended = asyncio.ensure_future(self._ended.wait())
        try:
            await asyncio.wait({task, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
        if not task.done():
            task.cancel()
            raise _ShuttingDown
        return task.result()

    def answer(self, status: int, body: Any, headers: dict[str, str] | None = None
               ) -> JSONResponse:
        return JSONResponse(body, status_code=status, headers=headers)

    def error(self, status: int, kind: str, detail: str, *, unread_body: bool = False,
              **fields: Any) -> JSONResponse:
        """The JSON error answer; ``unread_body``: the rest of the request's body is never
        read, so the connection is closed after it."""
        headers = {"Connection": "close"} if unread_body else {}
        if "retry_after" in fields:
            headers["Retry-After"] = str(max(1, math.ceil(fields["retry_after"])))
        return self.answer(status, {"error": {"type": kind, "detail": detail, **fields}},
                           headers)

    async def _body(self, request: Request, held: BodyBytes) -> bytes:
        """The request's body, read only while it stays within ``max_body`` bytes and its
        bytes fit in what the server holds at once (taken into ``held`` as they arrive).

        Raises:
            _TooLarge: its Content-Length says more (nothing is read), or, streamed, it passed
                the limit (nothing more is read).
            _TooManyBytes: its declared Content-Length does not fit in what is left (nothing is
                read), or, as they arrive, its bytes do not (nothing more is read).
        """
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            raise _TooLarge
        if declared.isdigit() and not self.inflight.fits(int(declared)):
            raise _TooManyBytes(int(declared))  # taken as it arrives, not ahead
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body:
                raise _TooLarge
            if not held.cover(size):
                raise _TooManyBytes(size)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _outcome(self, request: Request, body: bytes, deadline: Deadline
                       ) -> tuple[Any, BaseException | None]:
        """``(result, None)`` or ``(None, error)`` of the pool's call, run in a worker thread;
        raises _ShuttingDown when the requests are ended first. The call then goes on until
        the pool's close ends it, and its error must not escape the abandoned task (it would
        be logged as never retrieved): hence the pair. A client that closes its connection
        meanwhile is counted, and its call gives up its place in the pool's queue (a call
        already on the ranks runs on)."""
        assert self.pool is not None
        pool = self.pool
        abandon = Abandon()

        def call() -> tuple[Any, BaseException | None]:
            try:
                return pool.run(request_body.serve, body, self.service.handle,
                                self.service.validate, deadline=deadline, abandon=abandon), None
            except Exception as error:  # noqa: BLE001 (answered by the caller)
                return None, error

        watcher = asyncio.ensure_future(self._give_up_when_gone(request, abandon))
        try:
            return await self._unless_ended(asyncio.ensure_future(run_in_threadpool(call)))
        finally:
            watcher.cancel()

    async def _give_up_when_gone(self, request: Request, abandon: Abandon) -> None:
        """Once the client of ``request`` closes its connection: count it, and have its call
        give up its place in the pool's queue."""
        if await _disconnected(request):
            abandon.set()
            self.client_disconnects += 1
            request.scope[_DROPPED] = True

    async def run(self, request: Request) -> Response:
        held = BodyBytes(self.inflight)
        try:  # the body's bytes are held until the request is answered
            return await self._run(request, held)
        finally:
            held.close()

    async def _run(self, request: Request, held: BodyBytes) -> Response:
        assert self.pool is not None
        try:
            # a body that takes longer to arrive than a request may run is cut (slowloris)
            raw = await self._unless_ended(asyncio.ensure_future(asyncio.wait_for(
                self._body(request, held), self.service.timeout)))
        except _ShuttingDown:
            return self.error(503, "PoolClosed", self._end_reason)
        except asyncio.TimeoutError:
            return self.error(408, "RequestTimeout", "the body did not arrive within the "
                              f"service's timeout of {self.service.timeout:g} s",
                              unread_body=True)
        except ClientDisconnect:  # nobody to answer, nothing to log
            self.client_disconnects += 1
            request.scope[_DROPPED] = True
            return Response(status_code=400)
        except _TooLarge:
            return self.error(413, "PayloadTooLarge", f"the body is over the limit of "
                              f"{self.max_body} bytes (rankguard serve --max-body)",
                              unread_body=True)
        except _TooManyBytes as error:
            return self.error(
                503, "TooManyRequestBytes", f"the request bodies being served hold "
                f"{self.inflight.held} of the {self.inflight.limit} bytes the server takes at "
                f"once (rankguard serve --max-inflight-bytes), and this one's {error.size} do "
                "not fit: retry later", unread_body=True, retry_after=_BYTES_RETRY_S)
        arrived = time.monotonic()  # the request is whole: its deadline starts
        timeout = self.service.timeout
        given = request.headers.getlist(TIMEOUT_HEADER)
        if len(given) > 1:  # which one a proxy on the way read is anyone's guess
            return self.error(400, "BadRequest", f"X-Request-Timeout is given {len(given)} "
                              "times; give it once")
        if given:
            try:
                # a client may shorten the service's deadline, never extend it: one request
                # must not hold a group for longer than the operator allowed
                timeout = self.pool.call_timeout("X-Request-Timeout", number(
                    "X-Request-Timeout", given[0], float, 0,
                    f"a number of seconds up to the service's timeout of "
                    f"{self.service.timeout:g} s", maximum=self.service.timeout))
            except UsageError as error:
                return self.error(400, "BadRequest", str(error))
        outcome: CallOutcome | None = CallOutcome.OK  # None: it never reached the ranks
        try:
            result, failure = await self._outcome(request, raw, Deadline(arrived + timeout,
                                                                         timeout))
            if failure is not None:
                raise failure
            if isinstance(result, request_body.Refused):
                outcome = CallOutcome.REFUSED
        except _ShuttingDown:
            outcome = CallOutcome.CLOSED
            return self.error(503, "PoolClosed", self._end_reason)
        except UsageError as error:  # the service's functions cannot be pickled
            outcome = None
            return self.error(500, "ServiceNotSendable", f"the request cannot be sent to the "
                              f"ranks: {error.problem}")
        except RequestFailed as error:
            outcome = CallOutcome.FAILED
            return self.error(500, "RequestFailed", str(error), rank=error.rank,
                              cause=error.cause, victims=error.victims,
                              error_type=error.error_type)
        except PoolUnavailable as error:
            outcome = CallOutcome.ABANDONED if error.state == UnavailableState.ABANDONED \
                else CallOutcome.UNAVAILABLE
            return self.error(503, "PoolUnavailable", str(error), state=error.state,
                              retry_after=error.retry_after)
        except PoolClosed as error:
            outcome = CallOutcome.CLOSED
            return self.error(503, "PoolClosed", str(error))
        finally:
            if outcome is not None:
                self.stats.observe_request(outcome, time.monotonic() - arrived)
        if isinstance(result, request_body.Refused):
            fields = {} if result.error_type is None else {"error_type": result.error_type}
            return self.error(result.status, result.kind, result.detail, **fields)
        try:  # in a worker thread: a large result's JSON must not hold up other requests
            return await run_in_threadpool(self.answer, 200, {
                "result": result, "took_s": round(time.monotonic() - arrived, 6)})
        except (TypeError, ValueError) as error:
            return self.error(500, "BadResult", f"rank 0's result is not JSON: {error}")

    async def healthz(self, request: Request) -> Response:
        if self.pool is None:
            return self.answer(503, {"state": PoolState.STARTING})
        status = self.pool.status()
        body = {"state": status.state, "replicas": status.replicas, "idle": status.idle,
                "serving": status.serving, "suspect": status.suspect,
                "waiting": status.waiting, "spares_ready": status.spares_ready,
                "spares_starting": status.spares_starting, "healing": status.healing,
                "warm_spares": status.warm_spares,
                "last_start_failure": status.last_start_failure}
        return self.answer(200 if status.state == PoolState.READY else 503, body)

    async def livez(self, request: Request) -> Response:
        state = PoolState.STARTING if self.pool is None else self.pool.status().state
        return self.answer(200, {"live": True, "state": state})

    async def readyz(self, request: Request) -> Response:
        status = self.pool.status() if self.pool is not None else None
        placement = [] if status is None else [
            {"group": number, "devices": list(devices)}
            for number, devices in status.placement.items()]
        if status is not None and status.idle:
            return self.answer(200, {"ready": True, "idle": status.idle,
                                     "placement": placement})
        why = PoolState.STARTING if status is None else (
            UnavailableState.BUSY if status.state == PoolState.READY else status.state)
        return self.answer(503, {"ready": False, "reason": why, "placement": placement},
                           {"Retry-After": str(_NOT_READY_RETRY_S)})

    async def metrics(self, request: Request) -> Response:
        return Response(self.stats.exposition(), media_type=metrics.CONTENT_TYPE)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.pool = Pool(self.service.world_size, self.service.setup, wait=False,
                         spares=self.service.spares, replicas=self.service.replicas,
                         timeout=self.service.timeout, **self.pool_options)
        # each request waits for the pool in a worker thread: enough threads for every call
        # the pool lets queue, so that the pool's bounded queue, not a hidden one, decides
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = max(limiter.total_tokens, self.pool.max_queue +
                                   self.service.replicas + self.service.spares + _SPARE_THREADS)
        try:
            yield
        finally:
            # after requests were ended, their ranks are not waited for
            if self._ended.is_set():
                await run_in_threadpool(self.pool.close, CUT_CLOSE_S, cut_calls=True)
            else:
                await run_in_threadpool(self.pool.close)


def build(service: Service, *, max_body: int, max_inflight_bytes: int | None = None,
          connections: Turned | None = None, **pool_options: Any) -> Starlette:
    """The ASGI application serving ``service``; the pool starts with the application (its
    lifespan) and is closed when the application shuts down. ``max_body``: the largest request
    body, in bytes; ``max_inflight_bytes``: the most bytes of bodies held at once (default
    ``INFLIGHT_BODIES`` times ``max_body``); ``connections``: what the server's cap on
    connections did (``head_deadline``), for the metrics. ``pool_options``: further keyword
    arguments of
    :class:`rankguard.Pool` (``journal``, ``log_dir``, ``on_healing``).
    ``app.state.end_requests(when)`` answers every request still running 503 (see
    ``_Server.end_requests``)."""
    server = _Server(service, max_body, max_inflight_bytes if max_inflight_bytes is not None
                     else INFLIGHT_BODIES * max_body,
                     connections if connections is not None else Turned(), pool_options)
    routes = [Route("/run", server.run, methods=["POST"]),
              Route("/healthz", server.healthz, methods=["GET"]),
              Route("/livez", server.livez, methods=["GET"]),
              Route("/readyz", server.readyz, methods=["GET"]),
              Route("/metrics", server.metrics, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=server.lifespan,
                    middleware=[Middleware(_Counted, codes=server.codes)],
                    exception_handlers={HTTPException: _no_route})
    app.router.redirect_slashes = False  # /run/ is another path: 404, not a 307 to /run
    app.state.end_requests = server.end_requests
    return app


async def _no_route(request: Request, error: Exception) -> Response:
    """Starlette's own answers (an unknown path, a method a route does not take) as JSON that
    names what is wrong, like every other error the server gives."""
    assert isinstance(error, HTTPException)
    path = request.url.path
    headers = dict(error.headers or {})
    if error.status_code == 405:
        kind = "MethodNotAllowed"
        detail = f"{path} takes {headers.get('Allow', '')}, not {request.method}"
    elif error.status_code == 404:
        kind = "NotFound"
        detail = f"no route {path}: the routes are POST /run and GET " + \
            ", ".join(route for route in ROUTES if route != "/run")
    else:
        kind, detail = "HTTPError", f"{path}: {error.detail}"
    return JSONResponse({"error": {"type": kind, "detail": detail}},
                        status_code=error.status_code, headers=headers)


async def _disconnected(request: Request) -> bool:
    """Once the body was read: True when the client closes its connection (uvicorn's
    ``http.disconnect``); it may never come."""
    try:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return True
    except Exception:  # noqa: BLE001 (the server's own way of saying the connection ended)
        return True


class _Counted:
    """ASGI middleware: counts each HTTP response the application sends in ``codes``, by
    route (``ROUTES``, else ``other``) and status code; not the responses to clients that left
    mid-body (they never get them)."""

    def __init__(self, app: ASGIApp, codes: Counter[tuple[str, int]]) -> None:
        self.app = app
        self.codes = codes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in ROUTES else "other"

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start" and not scope.get(_DROPPED):
                self.codes[route, message["status"]] += 1
            await send(message)

        await self.app(scope, receive, counted)
