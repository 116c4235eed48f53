"""``rankguard serve APP``: an HTTP server (uvicorn) in front of a rankguard.Pool.

Bad input (options, APP) ends in one line on stderr naming what is wrong, and exit code 2,
before anything starts. SIGTERM or SIGINT: stop accepting, let in-flight requests finish or fail
within ``--grace``, close the pool (every rank process ends: those still running a request at
once), exit 0 without the interpreter's finalization: the process ends a fraction of a second
after ``--grace`` (each step after it is bounded: the answers by ``HTTP_ANSWER_S``, the pool's
close by ``CUT_CLOSE_S`` plus ``CLOSE_JOIN_S``). A second SIGTERM or SIGINT ends the grace at
once, the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from .. import exit_waits
from ..errors import UsageError
from ..inputs.options import (MAX_LOCAL_RANKS, Parser, check_ranks_env, number,
                              writable_dir, writable_file)
from ..records import private_files
from . import head_deadline
from .inflight_bytes import INFLIGHT_BODIES
from .placement import CLI_NAMES, parse_devices
from .pool_options import HEALING_MODES, MAX_QUEUE, check_size, placed
from ..serving.budgets import HTTP_ANSWER_S

PROG = "rankguard serve"
MAX_BODY = 1 << 20  # bytes: the default limit on a request's body (1 MiB)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def build_parser() -> Parser:
    p = Parser(prog=PROG, allow_abbrev=False, description="Serve a rankguard.Service over "
               "HTTP: each request runs on a replica (the rank processes of one gloo group); a "
               "rank fault fails that request only (HTTP 500 naming the rank), and the pool "
               "heals from spare replicas.")
    p.add_argument("app", metavar="APP",
                   help="path/to/file.py:name or module:name of a rankguard.Service")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", default="8000", help="port to listen on; 0: any free port, "
                   "printed at start-up (default 8000)")
    p.add_argument("--world-size", dest="world_size", default=None,
                   help="ranks per replica (default: the service's)")
    p.add_argument("--replicas", default=None, help="replicas that serve requests at the same "
                   "time, one request each (default: the service's, 1)")
    p.add_argument("--spares", default=None, help="spare replicas kept ready (default: the "
                   "service's)")
    p.add_argument("--suspect-after", dest="suspect_after", default=None,
                   help="seconds after which a request still running drains its replica: the "
                   "requests behind it go to a spare replica (default: a fifth of --timeout)")
    p.add_argument("--max-queue", dest="max_queue", default=None,
                   help="requests that may wait for a replica; one more is answered 503 at once "
                   "(default: 32 per replica)")
    p.add_argument("--timeout", default=None,
                   help="default deadline of a request in seconds (default: the service's)")
    p.add_argument("--on-healing", dest="on_healing", default="wait", choices=HEALING_MODES,
                   help="a request that arrives while no replica is ready waits for one within "
                   "its deadline, or fails at once with 503 (default wait)")
    p.add_argument("--devices", default=None,
                   help="the CUDA device of each rank, e.g. 0,1 (rank r of every replica on "
                   "the r-th), or one list per replica, spares included, e.g. 0,1/2,3; the "
                   "replicas then form NCCL groups (default: the CPU, over gloo)")
    p.add_argument("--gpus-per-replica", dest="gpus_per_replica", default=None,
                   help="instead of --devices: CUDA devices of its own for each replica, "
                   "spares included, in order, its ranks spread over them")
    p.add_argument("--warm-spares", dest="warm_spares", default=None,
                   help="rank processes kept ready on each device the replicas use (torch "
                   "imported; on a GPU, CUDA initialised), each taking an unusable rank's "
                   "place when a replica heals (default: 1 per device on GPUs, 0 on the CPU)")
    p.add_argument("--no-zygote", dest="zygote", action="store_false",
                   help="start each rank as a new Python (seconds) instead of forking it from "
                   "a zygote process that imported torch once (milliseconds)")
    p.add_argument("--grace", default="10", help="seconds in-flight requests get to finish "
                   "after SIGTERM (default 10)")
    p.add_argument("--max-body", dest="max_body", default=str(MAX_BODY),
                   help="the largest request body in bytes; a larger one is answered 413 "
                   f"without being read (default {MAX_BODY}, 1 MiB)")
    p.add_argument("--max-inflight-bytes", dest="max_inflight_bytes", default=None,
                   help="the bytes of request bodies held at once (bodies being read, and those "
                   "of requests not yet answered); a body that would pass it is answered 503 "
                   "with Retry-After (default 64 times --max-body: 64 MiB)")
    p.add_argument("--max-connections", dest="max_connections", default=None,
                   help="connections kept open at once (default: a quarter of the open-file "
                        "limit); "
                        "one more closes the oldest that sent no request, else gets 503")
    p.add_argument("--log-dir", dest="log_dir", default="",
                   help="folder for the ranks' output and stacks (default: a new temporary "
                   "folder, removed at exit)")
    p.add_argument("--journal", default="", help="append pool events to this JSON-lines file")
    return p


def main(argv: list[str]) -> int:
    try:
        import uvicorn

        from . import bad_http, http, service
    except ImportError as error:
        print(f"{PROG}: error: the HTTP server needs packages that are not installed ({error}); "
              "install them with: pip install 'rankguard[serve]'", file=sys.stderr)
        return 2
    try:
        args = build_parser().parse_args(argv)
        check_ranks_env()
        port = int(number("--port", args.port, int, 0, "use a port from 0 to 65535, e.g. "
                          "--port 8000", maximum=65535))
        grace = number("--grace", args.grace, float, 0.1, "e.g. --grace 10")
        max_body = int(number("--max-body", args.max_body, int, 1, "a number of bytes, e.g. "
                              f"--max-body {MAX_BODY}"))
        max_inflight = INFLIGHT_BODIES * max_body if args.max_inflight_bytes is None else int(
            number("--max-inflight-bytes", args.max_inflight_bytes, int, 1, "a number of "
                   f"bytes, e.g. --max-inflight-bytes {INFLIGHT_BODIES * max_body}"))
        if max_inflight < max_body:
            raise UsageError("--max-inflight-bytes", f"{max_inflight} bytes is less than "
                             f"--max-body ({max_body}): a body of the largest size would never "
                             "fit", f"give at least {max_body}, e.g. --max-inflight-bytes "
                             f"{INFLIGHT_BODIES * max_body}")
        max_connections = head_deadline.default_max_connections() \
            if args.max_connections is None else _max_connections(args.max_connections)
        served = service.load(args.app)
        if args.world_size is not None:
            served.world_size = int(number("--world-size", args.world_size, int, 1,
                                           "e.g. --world-size 2"))
        if args.spares is not None:
            served.spares = int(number("--spares", args.spares, int, 0, "e.g. --spares 1"))
        if args.replicas is not None:
            served.replicas = int(number("--replicas", args.replicas, int, 1,
                                         "e.g. --replicas 2"))
        check_size(served.world_size, served.spares, served.replicas,
                   ("--world-size", "--spares", "--replicas"))
        options: dict[str, Any] = {"on_healing": args.on_healing, "max_body": max_body,
                                   "max_inflight_bytes": max_inflight,
                                   "zygote": args.zygote}
        if args.devices is not None:
            options["devices"] = parse_devices(args.devices)
        if args.gpus_per_replica is not None:
            options["gpus_per_replica"] = int(number(
                "--gpus-per-replica", args.gpus_per_replica, int, 1, "e.g. --gpus-per-replica 2"))
        placed(options.get("devices"), options.get("gpus_per_replica"), served.world_size,
               served.replicas, served.spares, CLI_NAMES)
        if args.warm_spares is not None:
            options["warm_spares"] = int(number("--warm-spares", args.warm_spares, int, 0,
                                                f"at most {MAX_LOCAL_RANKS}, e.g. "
                                                "--warm-spares 1", maximum=MAX_LOCAL_RANKS))
        if args.timeout is not None:
            served.timeout = number("--timeout", args.timeout, float, 0.001, "e.g. --timeout 5")
        if args.suspect_after is not None:
            options["suspect_after"] = number(
                "--suspect-after", args.suspect_after, float, 0.001,
                f"seconds up to --timeout ({served.timeout:g}), e.g. --suspect-after 0.5",
                maximum=served.timeout)
        if args.max_queue is not None:
            options["max_queue"] = int(number("--max-queue", args.max_queue, int, 0,
                                              f"at most {MAX_QUEUE}, e.g. --max-queue 64",
                                              maximum=MAX_QUEUE))
        if args.log_dir:
            options["log_dir"] = writable_dir("--log-dir", args.log_dir)
            private_files.check_own(options["log_dir"], "--log-dir")
        if args.journal:
            options["journal"] = writable_file("--journal", args.journal)
            private_files.check_own_file(options["journal"], "--journal")
        listener = _listen(args.host, port)
    except UsageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    host, bound = listener.getsockname()[:2]
    print(f"{PROG}: listening on http://{host}:{bound} ({served.world_size} ranks per replica, "
          f"{served.replicas} serving, {served.spares} spare(s))", flush=True)
    turned = head_deadline.Turned()
    app = http.build(served, connections=turned, **options)
    # at the end of --grace the app answers what still runs (503); uvicorn's own cut, which
    # would cancel it unanswered, comes later
    from uvicorn.protocols.http.h11_impl import H11Protocol

    # a request's head gets the service's timeout, as its body does (serving.http)
    config = uvicorn.Config(app, log_level="warning", lifespan="on",
                            http=head_deadline.protocol(bad_http.protocol(H11Protocol),
                                                       served.timeout, max_connections, turned),
                            backlog=head_deadline.accept_batch(max_connections),
                            timeout_graceful_shutdown=grace + HTTP_ANSWER_S,
                            ws="none")  # no WebSocket route: an upgrade is served as HTTP
    logging.getLogger("uvicorn.error").addFilter(bad_http.QuietUpgrades())
    server = _graceful_server(uvicorn, grace, app.state.end_requests)(config)
    server.run(sockets=[listener])
    if not server.started:
        print(f"{PROG}: error: the server did not start (see above)", file=sys.stderr)
        return 1
    print(f"{PROG}: stopped", flush=True)
    # the pool is closed and the journal written: the interpreter's finalization would only
    # add 0.6 s (seconds on a loaded machine) to the exit that --grace bounds
    exit_waits.leave_now(0)


def _max_connections(given: str) -> int:
    """``--max-connections``, refused where connections could take the descriptors the pool
    needs (``head_deadline.most_connections``)."""
    value = int(number("--max-connections", given, int, 1, "e.g. --max-connections 500",
                       maximum=1_000_000))
    most = head_deadline.most_connections()
    if value > most:
        raise UsageError("--max-connections", f"{value} connections, with the sockets accepted "
                         f"ahead of them, could take more than half of the "
                         f"{head_deadline.open_file_limit()} descriptors this "
                         "process may open, which the pool's ranks need",
                         f"give at most {most}, or raise the open-file limit with ulimit -n")
    return value


def _graceful_server(uvicorn: Any, grace: float, end_requests: Callable[[str], None]
                     ) -> type:
    """uvicorn's Server, except that SIGTERM and SIGINT end it with exit status 0 (uvicorn
    re-raises the signal once it has shut down, which would end the process as killed by it),
    that ``grace`` after the shutdown began, ``end_requests(when)`` answers the requests still
    running, and that a second SIGTERM or SIGINT ends the grace at once the same way (uvicorn's
    own "force quit" on a second SIGINT would cancel them unanswered, with a traceback each,
    and skip the pool's close that cuts their ranks)."""

    class GracefulServer(uvicorn.Server):  # type: ignore[misc,name-defined]
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            timer = asyncio.get_running_loop().call_later(
                grace, end_requests, f"its grace of {grace:g} s after {self._stopped_by} ended")
            try:
                await super().shutdown(sockets)
            finally:
                timer.cancel()

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.should_exit:
                self._stopped_by = signal.Signals(sig).name
                super().handle_exit(sig, frame)
                return
            self._loop.call_soon_threadsafe(  # in the signal handler: from the loop, not here
                end_requests, f"a second {signal.Signals(sig).name} ended the grace of "
                f"{grace:g} s after {self._stopped_by}")

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            self._loop = asyncio.get_running_loop()
            self._stopped_by = "SIGTERM"
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in _STOP_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return GracefulServer


def _listen(host: str, port: int) -> socket.socket:
    if not host.strip():  # socket.bind would take it for every interface
        raise UsageError("--host", "it is empty", "give an address to listen on: "
                         "127.0.0.1 (this machine only), or 0.0.0.0 for every interface")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as error:
        fix = "choose a free port, or 0 for any" if error.errno == errno.EADDRINUSE else \
            "give an address of this machine, e.g. --host 127.0.0.1"
        raise UsageError("--host/--port", f"cannot listen on {host}:{port}: {error.strerror}",
                         fix) from None
    return sock
