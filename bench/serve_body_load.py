"""``rankguard serve`` under many concurrent large JSON bodies: are answers still within their
deadline, is the server still responsive, how much memory does it hold?

    python bench/serve_body_load.py [--clients 40] [--seconds 20] [--body 1048576]
                                    [--timeout 5] [--replicas 2] [--app examples/serve_tp.py:app]

``--clients`` threads each POST, one after another for ``--seconds``, a body of about
``--body`` bytes made of many small lists (``{"x": [8 numbers], "pad": [[1, 2], [3, 4], ...]}``:
parsed, such JSON takes ~20 times its bytes) to a server of ``--replicas`` replicas (no spare)
whose requests have a deadline of ``--timeout`` s. Every wait is bounded: a client gives up
at 4 times the deadline, the run at ``--seconds`` plus that.

Printed: answers by status; each answer's lateness, the client's wait from the body's last byte
sent to the whole answer less the deadline (and from the request's first byte: with the
upload, which the deadline does not cover), and the server's largest ``took_s``; how long a ``GET /livez``
took meanwhile (every 0.1 s: the event loop's responsiveness); the server's peak RSS (its own
process, its ranks apart). The peer figure is the promise itself: an answer within its deadline
plus about 0.1 s, whatever the load.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_S = 120.0
X = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]


def body_of(size: int) -> bytes:
    """A request for serve_tp of about ``size`` bytes, padded with small lists."""
    pairs = ",".join(f"[{i % 100},{(i * 7) % 100}]" for i in range(max(0, size // 8)))
    return ('{"x": %s, "pad": [%s]}' % (json.dumps(X), pairs)).encode()


class Serve:
    """A ``rankguard serve`` process on a free port (stopped by :meth:`stop`, bounded)."""

    def __init__(self, app: str, args: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "rankguard.cli", "serve", app,
                                      "--port", "0", *args], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.output: list[str] = []  # the server's, for a failed start
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on http://" not in line:
            self.stop()
            raise RuntimeError(f"the server did not start: {line}")
        self.host, port = line.split("listening on http://")[1].split()[0].split(":")
        self.port = int(port)
        self._drain = threading.Thread(target=self.output.extend, args=(self.proc.stdout,),
                                       daemon=True)
        self._drain.start()
        until = time.monotonic() + START_S
        while self.request("GET", "/healthz", None, {}, 5.0)[0] != 200:
            if time.monotonic() > until or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("the pool was not ready in time")
            time.sleep(0.2)

    def request(self, method: str, path: str, body: bytes | None, headers: dict[str, str],
                timeout: float) -> tuple[int, Any, float]:
        """(status, parsed JSON body, seconds from the body's last byte sent to the whole
        answer); status 0 for a connection error or a timeout."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        sent = time.monotonic()
        try:
            connection.request(method, path, body=body, headers=headers)
            sent = time.monotonic()
            response = connection.getresponse()
            raw = response.read()
            return response.status, json.loads(raw) if raw else None, time.monotonic() - sent
        except (OSError, http.client.HTTPException, ValueError):
            return 0, None, time.monotonic() - sent
        finally:
            connection.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One load run; its figures."""
    folder = tempfile.mkdtemp(prefix="serve-body-load-")
    server = Serve(args.app, ["--replicas", str(args.replicas), "--spares", "0",
                              "--timeout", str(args.timeout), "--log-dir", folder])
    body = body_of(args.body)
    # (status, from the body sent to the answer, from the request's start to it, took_s)
    answers: list[tuple[int, float, float, float | None]] = []
    causes: Counter[str] = Counter()  # of the 500s: the error's type and cause
    probes: list[float] = []
    peak = [0, 0]  # the server's RSS, its ranks' RSS (bytes)
    lock = threading.Lock()
    stop_at = time.monotonic() + args.seconds
    done = threading.Event()

    def client() -> None:
        while time.monotonic() < stop_at:
            started = time.monotonic()
            status, reply, waited = server.request("POST", "/run", body, {}, 4 * args.timeout)
            took = reply.get("took_s") if isinstance(reply, dict) else None
            error = reply.get("error") if isinstance(reply, dict) else None
            with lock:
                if status == 500 and isinstance(error, dict):
                    causes[f"{error.get('type')}:{error.get('cause')}"] += 1
                answers.append((status, waited, time.monotonic() - started, took))

    def probe() -> None:
        while not done.wait(0.1):
            started = time.monotonic()
            probes.append(server.request("GET", "/livez", None, {}, 4 * args.timeout)[2])

    def sample() -> None:
        process = psutil.Process(server.proc.pid)
        while not done.wait(0.1):
            try:
                peak[0] = max(peak[0], process.memory_info().rss)
                peak[1] = max(peak[1], sum(child.memory_info().rss
                                           for child in process.children(recursive=True)))
            except psutil.Error:
                pass

    helpers = [threading.Thread(target=probe, daemon=True),
               threading.Thread(target=sample, daemon=True)]
    clients = [threading.Thread(target=client, daemon=True) for _ in range(args.clients)]
    for thread in helpers + clients:
        thread.start()
    for thread in clients:
        thread.join(max(0.0, stop_at - time.monotonic()) + 5 * args.timeout)
    done.set()
    for thread in helpers:
        thread.join(5 * args.timeout)
    server.stop()
    codes = Counter(status for status, *_ in answers)
    late = [waited - args.timeout for status, waited, _, _ in answers if status]
    whole = [total - args.timeout for status, _, total, _ in answers if status]
    took = [t for *_, t in answers if t is not None]
    worst: dict[int, float] = {}
    for status, waited, _, _ in answers:
        worst[status] = max(worst.get(status, -math.inf), waited - args.timeout)
    return {"answers": dict(sorted(codes.items())), "body": len(body),
            "causes": dict(causes), "late_by_status": {code: round(late, 2) for code, late in sorted(worst.items())},
            "whole_max": max(whole, default=float("nan")),
            "late_max": max(late, default=float("nan")), "late_p99": percentile(late, 0.99),
            "over_0.1": sum(1 for x in late if x > 0.1), "over_1": sum(1 for x in late if x > 1),
            "took_max": max(took, default=float("nan")),
            "livez_p99": percentile(probes, 0.99), "livez_max": max(probes, default=0.0),
            "rss_mb": peak[0] / 2**20, "ranks_rss_mb": peak[1] / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--body", type=int, default=1 << 20, help="bytes per body (about)")
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--app", default="examples/serve_tp.py:app")
    args = parser.parse_args()
    print(f"{args.clients} clients, {args.seconds:g} s, bodies of {args.body} bytes, deadline "
          f"{args.timeout:g} s, {args.replicas} replicas; peer: within the deadline + ~0.1 s")
    for _ in range(args.repeat):
        figures = run(args)
        print(f"answers {figures['answers']}  late: max {figures['late_max']:+.2f} s, "
              f"p99 {figures['late_p99']:+.2f} s, {figures['over_0.1']} over +0.1 s, "
              f"{figures['over_1']} over +1 s (by status {figures['late_by_status']}; with the "
              f"upload: max "
              f"{figures['whole_max']:+.2f} s); took_s max {figures['took_max']:.2f}; "
              f"/livez p99 {figures['livez_p99']:.2f} s, max {figures['livez_max']:.2f} s; "
              f"server RSS {figures['rss_mb']:.0f} MB (ranks {figures['ranks_rss_mb']:.0f} MB); "
              f"500s: {figures['causes']}",
              flush=True)


if __name__ == "__main__":
    main()
