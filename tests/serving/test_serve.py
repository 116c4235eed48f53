"""``rankguard serve`` with the real example (examples/serve_tp.py), a real uvicorn server on
loopback, real rank processes and real faults: HTTP statuses for each outcome, healing, a
bounded load test with injected faults, and a graceful SIGTERM under load."""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from rankguard.records import journal
from rankguard.processes import proctree
from rankguard.serving.budgets import CUT_CLOSE_S, HTTP_ANSWER_S

from ..conftest import ROOT

sys.path.insert(0, str(ROOT / "examples"))
import serve_tp  # noqa: E402 (the example, for its reference output)

X = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
START_S = 90.0
SLEEPER = f"{Path(__file__).with_name('serve_apps.py')}:sleeper"


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


def samples(metrics: str, name: str) -> list[Any]:
    """Every sample named ``name`` in a Prometheus text exposition (parsed by the client
    library's own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    return [s for family in text_string_to_metric_families(metrics) for s in family.samples
            if s.name == name]


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of the sample ``name{labels}``; fails the test if there is none."""
    found = [s.value for s in samples(metrics, name) if s.labels == labels]
    assert len(found) == 1, (name, labels, metrics)
    return found[0]


class Server:
    """A ``rankguard serve`` process; ``stop()`` SIGTERMs it and returns its exit code.
    ``files``: its soft limit of open files."""

    def __init__(self, tmp_path: Path, *args: str, app: str = "examples/serve_tp.py:app",
                 files: int | None = None) -> None:
        self.journal = tmp_path / "journal.jsonl"
        self.seen: Counter[tuple[str, int]] = Counter()  # (path, status) -> responses
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rankguard.cli", "serve", app,
             "--port", "0", "--journal", str(self.journal), "--log-dir", str(tmp_path / "logs"),
             *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=None if files is None else lambda: resource.setrlimit(
                resource.RLIMIT_NOFILE, (files, resource.getrlimit(resource.RLIMIT_NOFILE)[1])))
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the server prints it before anything can block
        assert "listening on http://" in line, line + self.proc.stdout.read()
        self.url = line.split("listening on ")[1].split()[0]
        # read the server's output as it comes: a full pipe would block its event loop
        self._lines = [line]
        self._reader = threading.Thread(target=self._lines.extend, args=(self.proc.stdout,),
                                        daemon=True)
        self._reader.start()
        deadline = time.monotonic() + START_S
        while self.get("/healthz").status != 200:
            assert time.monotonic() < deadline, "the pool was not ready in time"
            time.sleep(0.2)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 30.0) -> Reply:
        req = urllib.request.Request(self.url + path, data=body, method=method,
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                status, raw, head = response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as error:
            status, raw, head = error.code, error.read(), dict(error.headers)
        self.seen[path, status] += 1
        text = raw.decode()
        is_json = head.get("content-type", "").startswith("application/json")
        return Reply(status, json.loads(text) if is_json else text, head)

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def run(self, payload: dict[str, Any], **kwargs: Any) -> Reply:
        return self.request("POST", "/run", json.dumps(payload).encode(), **kwargs)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in journal.read(str(self.journal)) if e["event"] == name]

    def stop(self, timeout: float = 30.0) -> int:
        assert self.proc.stdout is not None
        if self.proc.stdout.closed:  # stopped already
            return self.proc.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
            assert self.proc.stdout is not None
            self._reader.join(30)  # the pipe ends with the process
            self.output = "".join(self._lines)
            self.proc.stdout.close()


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    marker = request.node.get_closest_marker("serve_args")
    running = Server(tmp_path, *(marker.args if marker else ()))
    yield running
    running.stop()


def assert_served(reply: Reply) -> None:
    assert reply.status == 200, reply.body
    assert reply.body["result"] == pytest.approx(serve_tp.reference(X), rel=1e-5)


@pytest.mark.slow
@pytest.mark.deadline(240)
@pytest.mark.serve_args("--timeout", "2")
def test_each_fault_kind_answers_500_naming_the_rank_and_the_next_request_is_served(
        server: Server) -> None:
    assert_served(server.run({"x": X}))
    cases = [("raise:rank=1", 1, "raised"), ("crash:3:rank=0", 0, "exited"),
             ("kill:rank=1", 1, "signalled"), ("stop:rank=0", 0, "frozen"),
             ("hang:rank=1", 1, "deadline"), ("gil:rank=0", 0, "deadline")]
    for fault, rank, cause in cases:
        deadline = time.monotonic() + START_S
        while server.get("/healthz").body["spares_ready"] < 1:
            assert time.monotonic() < deadline, "no spare came back"
            time.sleep(0.1)
        started = time.monotonic()
        reply = server.run({"x": X, "fault": fault})
        assert time.monotonic() - started < 2.0 + 1.0, fault  # the 2 s deadline, plus HTTP
        assert reply.status == 500, (fault, reply.body)
        error = reply.body["error"]
        assert (error["type"], error["rank"], error["cause"]) == ("RequestFailed", rank, cause)
        assert error["error_type"] == ("InjectedFault" if cause == "raised" else None), error
        assert f"rank {rank}" in error["detail"]
        assert_served(server.run({"x": X}))
    metrics = server.get("/metrics").body
    assert sample(metrics, "rankguard_pool_faults_total", cause="deadline") == 2
    assert sample(metrics, "rankguard_pool_faults_total", cause="frozen") == 1
    assert sample(metrics, "rankguard_http_responses_total", route="/run", code="500") == 6
    assert sample(metrics, "rankguard_pool_heals_total") == 6
    assert sample(metrics, "rankguard_pool_heal_seconds_count") == 6
    assert sample(metrics, "rankguard_pool_heal_seconds_bucket", le="+Inf") == 6
    assert sample(metrics, "rankguard_request_seconds_count", outcome="failed") == 6
    assert sample(metrics, "rankguard_request_seconds_count", outcome="ok") == len(cases) + 1
    assert [e["cause"] for e in server.events("request_fault")] == [c for _, _, c in cases]


@pytest.mark.slow
@pytest.mark.deadline(240)
@pytest.mark.serve_args("--replicas", "2", "--spares", "1", "--timeout", "2",
                        "--suspect-after", "0.3")
def test_replicas_serve_concurrent_clients_while_one_replica_hangs(server: Server) -> None:
    deadline = time.monotonic() + START_S
    while (status := server.get("/healthz").body)["idle"] < 2 or status["spares_ready"] < 1:
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    assert (status["replicas"], status["serving"], status["waiting"]) == (2, 0, 0), status
    hung: list[Reply] = []
    hanging = threading.Thread(target=lambda: hung.append(
        server.run({"x": X, "fault": "hang:rank=1"})))
    hanging.start()
    while server.get("/readyz").body.get("idle", 0) == 2:  # until the hung request runs
        time.sleep(0.01)

    def client(_: int) -> list[Reply]:  # one request after another until the hung one ends
        replies = [server.run({"x": X})]
        while hanging.is_alive():
            replies.append(server.run({"x": X}))
        return replies

    with ThreadPoolExecutor(8) as clients:
        replies = [r for batch in clients.map(client, range(8)) for r in batch]
    hanging.join(10)
    assert all(r.status == 200 for r in replies), [r.body for r in replies if r.status != 200]
    assert [r.body["error"]["cause"] for r in hung] == ["deadline"]
    metrics = server.get("/metrics").body
    assert sample(metrics, "rankguard_pool_faults_total", cause="deadline") == 1
    assert sample(metrics, "rankguard_pool_requests_total", outcome="ok") == len(replies)
    assert sample(metrics, "rankguard_pool_suspicions_total") >= 1
    assert sum(sample(metrics, "rankguard_pool_replicas", state=state)
               for state in ("starting", "idle", "spare", "healing")) == 3
    # the hung rank's process is replaced after its stacks; its peer keeps its own
    assert sample(metrics, "rankguard_pool_heal_actions_total",
                  action="stacks_then_replace") == 1
    pids = [pid for e in server.events("group_start") for pid in e["pids"]]
    assert server.stop() == 0
    assert not [pid for pid in pids if proctree.alive(pid)], "a rank outlived the server"


MAX_BODY = 300_000  # more than the deeply nested body below (200,000 bytes)


def raw_request(url: str, head: str, parts: list[bytes], timeout: float = 20.0) -> str:
    """Send ``head`` (the request line and headers) and ``parts`` of a body over a socket of
    its own, without ending the body; the status line of the answer."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode() + b"\r\n")
        for part in parts:
            sock.sendall(part)
        return sock.makefile("rb").readline().decode()


@pytest.mark.serve_args("--max-body", str(MAX_BODY))
def test_bad_requests_are_answered_400_413_or_422_and_fail_no_rank(
        server: Server) -> None:
    assert server.request("POST", "/run", b'{"x": ').status == 400
    assert server.run({"x": X}, headers={"X-Request-Timeout": "soon"}).status == 400
    assert server.run({"x": X}, headers={"X-Request-Timeout": "-1"}).status == 400
    assert server.request("POST", "/run", b"[1, 2]").status == 422
    reply = server.run({"x": [1, 2]})
    assert reply.status == 422 and "'x' must be a list of 8 numbers" in reply.body["error"]["detail"]
    reply = server.run({"x": X, "fault": "boom:rank=1"})
    assert reply.status == 422 and "unknown kind 'boom'" in reply.body["error"]["detail"]
    reply = server.run({"x": X, "fault": "kill:rank=1,at=op1"})  # README: kinds without at=
    assert reply.status == 422 and "fault: at=op1 is not taken here" in \
        reply.body["error"]["detail"], reply.body
    reply = server.run({"x": X, "fault": "kill:rank=1,attempt=0"})  # a request has no attempts
    assert reply.status == 422 and "fault: attempt=0 is not taken here" in \
        reply.body["error"]["detail"], reply.body
    reply = server.run({"x": X, "fault": "kill:rank=7"})  # a replica has ranks 0 and 1
    assert reply.status == 422, reply.body
    assert "'fault' names rank 7, but a replica has ranks 0 to 1" in reply.body["error"]["detail"]
    # below the service's useful minimum (0.5 s), or above its own timeout (a client may not
    # hold a group longer than the operator allowed)
    for deadline in ("0.001", "inf", "nan", "0", "100000"):
        reply = server.run({"x": X}, headers={"X-Request-Timeout": deadline})
        assert reply.status == 400 and "X-Request-Timeout" in reply.body["error"]["detail"]
    reply = server.request("POST", "/run", b"[" * 100_000 + b"]" * 100_000)
    assert reply.status == 400 and "nested too deeply" in reply.body["error"]["detail"]
    for number in ("NaN", "Infinity", "-Infinity", "1e400"):
        reply = server.request("POST", "/run", f'{{"x": [{number}, 1, 2, 3, 4, 5, 6, 7]}}'.encode())
        assert reply.status == 422 and number in reply.body["error"]["detail"], reply.body
    # finite JSON numbers a float32 cannot hold: refused here, never a rank's fault (a heal)
    for number in ("9" * 400, "1e39", "-3.5e38"):
        reply = server.request("POST", "/run", f'{{"x": [{number}, 1, 2, 3, 4, 5, 6, 7]}}'.encode())
        assert reply.status == 422 and "'x' must be a list of 8 numbers" in \
            reply.body["error"]["detail"], reply.body
    deep = '{"x": %s, "extra": %s}' % (json.dumps(X), "[" * 900 + "]" * 900)
    assert_served(server.request("POST", "/run", deep.encode()))  # the ranks get its bytes
    declared = raw_request(server.url, "POST /run HTTP/1.1\r\nHost: x\r\n"
                           "Content-Length: 1000000000\r\n", [])  # and no byte of it sent
    assert declared.split()[1] == "413", declared
    twice = raw_request(server.url, "POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                        "X-Request-Timeout: 1\r\nX-Request-Timeout: 2\r\n", [b"{}"])
    assert twice.split()[1] == "400", twice
    chunk = b"%x\r\n%s\r\n" % (MAX_BODY // 2 + 1, b" " * (MAX_BODY // 2 + 1))
    streamed = raw_request(server.url, "POST /run HTTP/1.1\r\nHost: x\r\n"
                           "Transfer-Encoding: chunked\r\n", [chunk, chunk])  # never ended
    assert streamed.split()[1] == "413", streamed
    for method, path, status, allowed in (("GET", "/run", 405, "POST"),
                                          ("PUT", "/run", 405, "POST"),
                                          ("POST", "/healthz", 405, "GET"),
                                          ("GET", "/nothing", 404, None),
                                          # not redirected (307, no JSON) to /run, /healthz
                                          ("POST", "/run/", 404, None),
                                          ("GET", "/healthz/", 404, None)):
        reply = server.request(method, path)  # JSON naming what is wrong, as every error
        assert reply.status == status and path in reply.body["error"]["detail"], reply.body
        if allowed:
            assert allowed in reply.headers["allow"]
            assert f"takes {reply.headers['allow']}, not {method}" in \
                reply.body["error"]["detail"], reply.body
    assert_served(server.run({"x": X}))
    assert_served(server.request("POST", "/run", body_of_size(MAX_BODY)))  # the limit itself
    metrics = server.get("/metrics").body
    # the ranks parse and validate each body: the 15 they refused ran on them too, as calls
    # that ended well (3 were served), and none was a fault
    assert sample(metrics, "rankguard_pool_requests_total", outcome="ok") == 18
    assert sample(metrics, "rankguard_pool_requests_total", outcome="failed") == 0
    assert 'rankguard_pool_requests_total{outcome="refused"}' not in metrics
    # to a client's eyes (and an SLO's), the 15 refused are not answers that went well
    assert sample(metrics, "rankguard_request_seconds_count", outcome="refused") == 15
    assert sample(metrics, "rankguard_request_seconds_count", outcome="ok") == 3
    assert sample(metrics, "rankguard_http_responses_total", route="/run", code="413") == 2
    assert sample(metrics, "rankguard_http_responses_total", route="/run", code="400") == 10
    assert server.events("request_fault") == [] and server.events("group_retire") == []
    # not HTTP/1.1 at all: JSON, like every error
    status, headers, body = answer_to_head(server.url, "POST /run HTTP/1.1\r\nHost: x\r\n"
                                           "Content-Length: -1\r\n", [])
    assert status == 400 and body["error"]["type"] == "BadRequest", body
    assert headers["content-type"] == "application/json"
    # a bad chunk after the request was answered (405, its body unread) only ends the
    # connection: h11 refused a second answer, and asyncio logged a traceback for each
    assert answered_then_bad_chunk(server.url).startswith(b"HTTP/1.1 405 ")
    # an Upgrade header is served as plain HTTP, and logs nothing (two lines a request)
    status, _, body = answer_to_head(server.url, "GET /livez HTTP/1.1\r\nHost: x\r\n"
                                     "Upgrade: websocket\r\nConnection: Upgrade, close\r\n", [])
    assert status == 200 and body["live"] is True, body
    assert server.stop() == 0
    assert "Traceback" not in server.output and "Fatal error" not in server.output, \
        server.output[:3000]
    assert "upgrade" not in server.output.lower(), server.output[:3000]


def answered_then_bad_chunk(url: str, timeout: float = 20.0) -> bytes:
    """POST /healthz with a chunked body: once the 405 has come (before the body ended),
    send a chunk that is not HTTP; everything the server sent until it closed."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                     b"\r\n5\r\nhello\r\n")
        answer = b""
        while not answer.endswith(b"}}"):  # the 405's JSON body
            data = sock.recv(4096)
            assert data, answer
            answer += data
        sock.sendall(b"not a chunk\r\n")
        while data := sock.recv(4096):
            answer += data
        return answer


def answer_to_head(url: str, head: str, parts: list[bytes], timeout: float = 20.0
                   ) -> tuple[int, dict[str, str], Any]:
    """Send ``head`` and ``parts`` of a body that is never ended, and read the whole answer
    of a server that closes the connection after it: (status, headers, JSON body)."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode() + b"\r\n" + b"".join(parts))
        raw = sock.makefile("rb").read()
    top, _, body = raw.partition(b"\r\n\r\n")
    lines = top.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def body_of_size(size: int) -> bytes:
    """A request for serve_tp of exactly ``size`` bytes."""
    body = json.dumps({"x": X, "pad": ""})
    body = json.dumps({"x": X, "pad": " " * (size - len(body))}).encode()
    assert len(body) == size
    return body


@pytest.mark.slow  # out of the quick run (its 5 minutes)
@pytest.mark.serve_args("--max-body", str(MAX_BODY), "--max-inflight-bytes",
                        str(MAX_BODY * 3 // 2), "--timeout", "20")
def test_the_request_bodies_held_at_once_are_bounded_and_given_back_when_answered(
        server: Server) -> None:
    host, port = server.url.split("//")[1].split(":")
    slow_body = body_of_size(MAX_BODY)
    head = f"POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY}\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=20) as idle, \
            socket.create_connection((host, int(port)), timeout=20) as slow:
        # a declared body holds the bytes that arrived, not those it announced: heads alone
        # (taken whole, 64 of them locked every client out) hold nothing. 100 Continue: the
        # server is reading its body
        idle.sendall(head + b"Expect: 100-continue\r\n\r\n")
        assert idle.makefile("rb").readline().split()[1] == b"100"
        assert_served(server.request("POST", "/run", body_of_size(MAX_BODY)))
        # a body of the largest size, sent slowly: it holds what it sent
        sent = MAX_BODY * 3 // 4
        slow.sendall(head + b"\r\n" + slow_body[:sent])
        deadline = time.monotonic() + 10
        while sample(server.get("/metrics").body, "rankguard_http_inflight_body_bytes") \
                != sent:
            assert time.monotonic() < deadline, "the slow body's bytes were never taken"
            time.sleep(0.05)
        # a quarter of the limit less than a body is left: a declared body over it is refused
        # unread, a streamed one as soon as it passes it
        status, headers, answer = answer_to_head(server.url, head.decode(), [])
        assert status == 503 and answer["error"]["type"] == "TooManyRequestBytes", answer
        assert f"hold {sent} of the {MAX_BODY * 3 // 2} bytes" in answer["error"]["detail"]
        assert "--max-inflight-bytes" in answer["error"]["detail"]
        assert headers["retry-after"] == "1" and headers["connection"] == "close"
        chunk = b"%x\r\n%s\r\n" % (MAX_BODY // 2, b" " * (MAX_BODY // 2))
        status, _, answer = answer_to_head(server.url, "POST /run HTTP/1.1\r\nHost: x\r\n"
                                           "Transfer-Encoding: chunked\r\n", [chunk, chunk])
        assert status == 503 and answer["error"]["type"] == "TooManyRequestBytes", answer
        assert_served(server.request("POST", "/run", body_of_size(MAX_BODY // 2)))  # it fits
        slow.sendall(slow_body[sent:])
        reply = slow.makefile("rb").readline().decode()
        assert reply.split()[1] == "200", reply
    metrics = server.get("/metrics").body
    assert sample(metrics, "rankguard_http_inflight_body_bytes") == 0  # all given back
    assert sample(metrics, "rankguard_http_responses_total", route="/run", code="503") == 2
    assert_served(server.request("POST", "/run", body_of_size(MAX_BODY)))


@pytest.mark.slow  # out of the quick run (its 5 minutes)
@pytest.mark.deadline(180)
@pytest.mark.serve_args("--spares", "0", "--on-healing", "fail", "--timeout", "2",
                        "--no-zygote")  # a cold start: long enough to be seen healing
def test_while_healing_requests_get_503_with_retry_after_then_are_served_again(
        server: Server) -> None:
    assert server.run({"x": X, "fault": "kill:rank=1"}).status == 500
    reply = server.run({"x": X})
    assert reply.status == 503 and reply.body["error"]["state"] == "healing"
    assert int(reply.headers["retry-after"]) >= 1
    health = server.get("/healthz")
    assert health.status == 503 and health.body["state"] == "healing"
    deadline = time.monotonic() + START_S
    while server.get("/healthz").status != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert_served(server.run({"x": X}))
    heal = server.events("heal")
    assert len(heal) == 1 and heal[0]["took_s"] > 0.5  # a cold start: no spare to take over
    # only rank 1 was started anew, in the same replica, on the same devices
    assert server.get("/readyz").body["placement"] == [{"group": 1, "devices": ["cpu", "cpu"]}]
    metrics = server.get("/metrics").body
    assert [sample.labels for sample in samples(metrics, "rankguard_pool_rank_device")] == [
        {"group": "1", "rank": "0", "device": "cpu"}, {"group": "1", "rank": "1", "device": "cpu"}]
    assert sample(metrics, "rankguard_pool_ranks_replaced_total") == 1
    assert sample(metrics, "rankguard_pool_heal_actions_total", action="replace") == 1
    assert [e["devices"] for e in server.events("group_start")] == [["cpu", "cpu"]]
    healed = [e for e in server.events("group_ready") if e["role"] == "ranks_replaced"]
    assert [(e["group"], e["ranks"]) for e in healed] == [(1, [1])]


def body_of_small_lists(size: int) -> bytes:
    """A request for serve_tp of about ``size`` bytes, padded with many small lists: JSON that
    takes about 20 times its bytes, and as long to parse as any, once parsed."""
    pairs = ",".join(f"[{i % 100},{i * 7 % 100}]" for i in range(size // 8))
    return ('{"x": %s, "pad": [%s]}' % (json.dumps(X), pairs)).encode()


LARGE_BODY_LATE_S = 2.0  # past its deadline: the 1 MiB upload on a loaded machine, the answer


@pytest.mark.slow  # 16 clients for 6 s
@pytest.mark.deadline(180)
@pytest.mark.serve_args("--replicas", "2", "--spares", "0", "--timeout", "2")
def test_under_many_large_bodies_every_answer_comes_within_its_deadline(server: Server) -> None:
    # parsed in the server, such bodies held its event loop and GIL for seconds at a time:
    # answers came 7 to 12 s past their deadline, and /livez with them
    body = body_of_small_lists(1 << 20)
    until = time.monotonic() + 6

    def client(_: int) -> list[tuple[int, float]]:
        answers = []
        while time.monotonic() < until:
            started = time.monotonic()
            reply = server.request("POST", "/run", body, timeout=30)
            answers.append((reply.status, time.monotonic() - started))
        return answers

    with ThreadPoolExecutor(16) as clients:
        answers = [answer for some in clients.map(client, range(16)) for answer in some]
    assert {status for status, _ in answers} <= {200, 500, 503}, Counter(answers)
    slowest = max(took for _, took in answers)
    print(f"\n{len(answers)} answers {Counter(status for status, _ in answers)}, slowest "
          f"{slowest:.2f} s")
    assert slowest < 2 + LARGE_BODY_LATE_S, sorted(took for _, took in answers)[-5:]


@pytest.mark.slow
@pytest.mark.deadline(300)
@pytest.mark.serve_args("--spares", "2", "--timeout", "30")
def test_load_2000_requests_8_clients_5_percent_faults_every_answer_is_the_right_one(
        server: Server) -> None:
    rng = random.Random(7)
    plan: list[str | None] = [None] * 2000
    faulted = rng.sample(range(2000), 100)
    for n, index in enumerate(faulted):  # mostly raises (the group regroups in place); some
        rank = rng.randrange(2)           # crashes and kills (the group is replaced)
        plan[index] = (f"crash:3:rank={rank}" if n % 25 == 0 else
                       f"kill:rank={rank}" if n % 25 == 1 else f"raise:rank={rank}")

    def send(fault: str | None) -> tuple[str | None, Reply, float]:
        payload = {"x": X} if fault is None else {"x": X, "fault": fault}
        started = time.monotonic()
        return fault, server.run(payload, timeout=60), time.monotonic() - started

    started = time.monotonic()
    with ThreadPoolExecutor(8) as clients:
        results = list(clients.map(send, plan))
    wall = time.monotonic() - started
    good = [r for f, r, _ in results if f is None]
    bad = [(f, r) for f, r, _ in results if f is not None]
    assert all(r.status == 200 for r in good), [r.body for r in good if r.status != 200][:3]
    expected = pytest.approx(serve_tp.reference(X), rel=1e-5)
    assert all(r.body["result"] == expected for r in good)
    for fault, reply in bad:
        assert reply.status == 500, (fault, reply.body)
        kind = fault.split(":")[0]
        rank = int(fault.rsplit("rank=", 1)[1])
        assert reply.body["error"]["rank"] == rank, (fault, reply.body)
        assert reply.body["error"]["cause"] == {"raise": "raised", "crash": "exited",
                                                "kill": "signalled"}[kind]
    slowest = max(took for _, _, took in results)
    print(f"\n2000 requests, 8 clients, 100 faults: {wall:.1f} s, "
          f"{2000 / wall:.0f} req/s, slowest {slowest:.2f} s")
    assert slowest < 30 + 2  # no request waited past its deadline


@pytest.mark.slow  # out of the quick run (its 5 minutes)
@pytest.mark.deadline(120)
@pytest.mark.serve_args("--grace", "5", "--timeout", "3")
def test_sigterm_under_load_finishes_or_fails_in_flight_requests_and_exits_0(
        server: Server) -> None:
    replies: list[int] = []
    refused: list[str] = []
    stop = threading.Event()

    def client(n: int) -> None:
        while not stop.is_set():
            fault = "hang:rank=1" if n == 0 and not replies else None
            try:
                payload = {"x": X} if fault is None else {"x": X, "fault": fault}
                replies.append(server.run(payload, timeout=20).status)
            except (urllib.error.URLError, ConnectionError) as error:
                refused.append(str(error))
                time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # a hung request is in flight; the others queue behind it
    started = time.monotonic()
    code = server.stop(timeout=30)
    took = time.monotonic() - started
    stop.set()
    for thread in threads:
        thread.join(30)
    assert code == 0, server.output
    assert took < 5 + 5, took  # the grace, plus the pool's close
    assert "rankguard serve: stopped" in server.output
    assert replies and set(replies) <= {200, 500, 503}, replies
    assert 500 in replies  # the hung request got its error, not a hang


def _take_word(listener: socket.socket) -> None:
    with listener.accept()[0] as running:
        assert running.recv(16) == b"running"  # read before closing: the rank gets no EPIPE


@contextlib.contextmanager
def running_signal(path: Path) -> Iterator[Callable[[], None]]:
    """A Unix socket at ``path`` that ``serve_apps.sleeper``'s rank 0 connects to once a
    request runs on the ranks; yields a function that waits (bounded) for that."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        listener.listen(8)
        listener.settimeout(START_S)
        yield lambda: _take_word(listener)


def stopped_mid_request(tmp_path: Path, grace: float, signal_it: Callable[[Server], float]
                        ) -> tuple[Reply, float, float]:
    """A ``serve_apps.sleeper`` server with ``--grace``, stopped by ``signal_it(server)`` (which
    returns the instant to time from) and then a SIGTERM, while a request of a minute runs on
    its ranks; checks that it exited 0 without a traceback and returns the request's reply, and
    the seconds from that instant to the reply and to the exit."""
    server = Server(tmp_path, "--grace", str(grace), app=SLEEPER)
    replies: list[tuple[Reply, float]] = []

    def client() -> None:
        reply = server.run({"sleep": 60, "notify": str(tmp_path / "running.sock")}, timeout=60)
        replies.append((reply, time.monotonic()))

    with running_signal(tmp_path / "running.sock") as wait_running:
        caller = threading.Thread(target=client)
        caller.start()
        try:
            wait_running()
            started = signal_it(server)
            code = server.stop(timeout=60)
            took = time.monotonic() - started
        finally:
            server.stop()
            caller.join(60)
    assert code == 0, server.output
    assert "Traceback" not in server.output and "Cancel" not in server.output, server.output
    assert "rankguard serve: stopped" in server.output
    (reply, answered), = replies
    return reply, answered - started, took


@pytest.mark.slow  # moved out of the README's 5-minute run; SIGTERM under load stays
@pytest.mark.deadline(180)
def test_sigterm_with_a_grace_shorter_than_a_request_answers_it_503_json_and_exits_0(
        tmp_path: Path) -> None:
    grace = 1.0
    reply, answered, took = stopped_mid_request(tmp_path, grace, lambda _: time.monotonic())
    assert reply.status == 503, reply
    error = reply.body["error"]
    assert error["type"] == "PoolClosed" and "shutting down" in error["detail"], error
    assert str(grace) in error["detail"] or f"{grace:g}" in error["detail"], error
    assert grace <= answered < grace + HTTP_ANSWER_S, answered
    # the ranks still running the request are killed at once, not given CUT_CLOSE_S for a
    # barrier they cannot join, and the process skips the interpreter's finalization (0.6 s
    # idle, seconds loaded): it ended 1.7 to 2.3 s after the grace, now ~0.3 s (2 cores,
    # loaded). The bound is a generous one that proves the exit bounded on a loaded machine
    # (CI's slow set missed grace + CUT_CLOSE_S once under xdist); the figure is the note's.
    assert took < grace + CUT_CLOSE_S + 2.0, took


def _interrupt_twice(server: Server) -> float:
    """Ctrl-C, and once the server stopped accepting (its shutdown began), Ctrl-C again."""
    server.proc.send_signal(signal.SIGINT)
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    refused_by = time.monotonic() + START_S
    while True:
        try:
            socket.create_connection((host, int(port)), 1).close()
        except ConnectionRefusedError:
            break
        assert time.monotonic() < refused_by, "the server kept accepting"
        time.sleep(0.05)
    server.proc.send_signal(signal.SIGINT)
    return time.monotonic()


@pytest.mark.slow  # about 5 s: a server, a request, two signals
@pytest.mark.deadline(180)
def test_a_second_sigint_ends_the_grace_at_once_answering_503_json_and_exits_0(
        tmp_path: Path) -> None:
    # uvicorn's own "force quit" on a second SIGINT answered a bare 500 with a traceback, and
    # left the pool's close to wait out its timeout
    grace = 20.0
    reply, answered, took = stopped_mid_request(tmp_path, grace, _interrupt_twice)
    assert reply.status == 503, reply
    assert reply.body["error"]["type"] == "PoolClosed", reply.body
    assert "a second SIGINT ended the grace of 20 s after SIGINT" in reply.body["error"]["detail"]
    # long before the grace's end: the second signal ended it (generous, for a loaded machine)
    assert answered < grace / 4 and took < grace / 2, (answered, took)


@pytest.mark.slow
@pytest.mark.deadline(120)
@pytest.mark.serve_args("--timeout", "2")
def test_a_body_that_does_not_arrive_within_the_timeout_gets_408(server: Server) -> None:
    started = time.monotonic()
    status = raw_request(server.url, "POST /run HTTP/1.1\r\nHost: x\r\n"
                         "Content-Length: 100\r\n", [b'{"x": '])  # and the rest never comes
    assert status.split()[1] == "408", status
    assert 2 <= time.monotonic() - started < 2 + 3
    assert_served(server.run({"x": X}))


def closed_after(url: str, trickle: bytes, every: float, limit: float) -> float | None:
    """Connect and send ``trickle`` a byte every ``every`` seconds (nothing if empty) until
    the server closes the connection; the seconds that took, or None if it was still open
    after ``limit`` seconds."""
    host, port = url.split("//")[1].split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=limit) as sock:
        sock.settimeout(every if trickle else limit)
        for byte in trickle * int(limit / every + 1) if trickle else [b""]:
            try:
                if trickle:
                    sock.sendall(bytes([byte]))
                if sock.recv(1) == b"":
                    return time.monotonic() - started
            except TimeoutError:
                pass
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - started
            if time.monotonic() - started > limit:
                return None
    return None


@pytest.mark.slow
@pytest.mark.deadline(120)
@pytest.mark.serve_args("--timeout", "2")
def test_a_client_that_sends_no_request_head_or_sends_it_slowly_is_cut_at_the_timeout(
        server: Server) -> None:
    # uvicorn bounds neither: such a client held its connection (a descriptor of the
    # server's) as long as it liked (slowloris)
    with ThreadPoolExecutor(2) as clients:
        silent = clients.submit(closed_after, server.url, b"", 0.5, 10.0)
        slow = clients.submit(closed_after, server.url, b"POST /run HTTP/1.1\r\nHost: x\r\n"
                              b"X-Filler: " + b"a" * 100, 0.2, 10.0)
        for took in silent.result(30), slow.result(30):
            assert took is not None and 2 <= took < 2 + 3, took
    assert_served(server.run({"x": X}))


@pytest.mark.slow  # moved out of the README's 5-minute run; the bad-request cases stay
@pytest.mark.deadline(180)
def test_clients_that_drop_mid_body_cost_no_traceback_and_the_server_keeps_serving(
        tmp_path: Path) -> None:
    server = Server(tmp_path, app=SLEEPER)
    try:
        host, port = server.url.split("//")[1].split(":")
        dropped = 50
        sockets = [socket.create_connection((host, int(port)), timeout=30)
                   for _ in range(dropped)]
        for sock in sockets:  # 1000 bytes announced, 100 sent, then gone
            sock.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" +
                         b'{"sleep": 0, "pad": "' + b" " * 79)
        for sock in sockets:
            sock.close()
        deadline = time.monotonic() + START_S
        while sample(server.get("/metrics").body,
                     "rankguard_http_client_disconnects_total") != dropped:
            assert time.monotonic() < deadline, server.get("/metrics").body
            time.sleep(0.1)
        assert 'code="400"' not in server.get("/metrics").body  # no response they never got
        reply = server.run({"sleep": 0})
        assert reply.status == 200 and reply.body["result"] == "slept", reply
    finally:
        assert server.stop() == 0
    lines = server.output.splitlines()
    assert "Traceback" not in server.output and "ClientDisconnect" not in server.output, \
        server.output[:3000]
    assert len(lines) <= 2 + dropped, server.output[:3000]  # start, stop, a line a client


@pytest.mark.slow
@pytest.mark.deadline(180)
def test_a_client_that_leaves_while_its_request_waits_gives_up_its_place(
        tmp_path: Path) -> None:
    server = Server(tmp_path, app=SLEEPER)
    try:
        with running_signal(tmp_path / "running.sock") as wait_running:
            first: list[Reply] = []
            caller = threading.Thread(target=lambda: first.append(server.run(
                {"sleep": 2, "notify": str(tmp_path / "running.sock")}, timeout=60)))
            caller.start()
            wait_running()
            host, port = server.url.split("//")[1].split(":")
            body = json.dumps({"sleep": 30}).encode()  # would hold the group 30 s
            with socket.create_connection((host, int(port)), timeout=30) as leaving:
                leaving.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                                % (len(body), body))
                deadline = time.monotonic() + START_S
                while sample(server.get("/metrics").body, "rankguard_pool_waiting") != 1:
                    assert time.monotonic() < deadline, "the request never queued"
                    time.sleep(0.02)
            deadline = time.monotonic() + START_S
            while sample(server.get("/metrics").body, "rankguard_pool_waiting") != 0:
                assert time.monotonic() < deadline, "the request kept its place"
                time.sleep(0.02)
            started = time.monotonic()
            reply = server.run({"sleep": 0})  # served once the first ends, not 30 s later
            took = time.monotonic() - started
            caller.join(60)
        metrics = server.get("/metrics").body
    finally:
        assert server.stop() == 0
    assert reply.status == 200 and first[0].status == 200
    assert took < 2 + 10, took
    assert sample(metrics, "rankguard_http_client_disconnects_total") == 1
    assert sample(metrics, "rankguard_pool_requests_total", outcome="abandoned") == 1
    assert sample(metrics, "rankguard_request_seconds_count", outcome="abandoned") == 1
    assert sample(metrics, "rankguard_pool_requests_total", outcome="ok") == 2
    assert "Traceback" not in server.output, server.output


@pytest.mark.slow  # out of the quick run (its 5 minutes)
@pytest.mark.deadline(180)
@pytest.mark.serve_args("--spares", "0", "--on-healing", "fail", "--timeout", "2",
                        "--no-zygote")  # a cold start: long enough to answer 503s meanwhile
def test_metrics_count_every_response_a_client_saw_by_route_and_code(server: Server) -> None:
    assert_served(server.run({"x": X}))
    assert server.run({"x": X, "fault": "kill:rank=1"}).status == 500
    deadline = time.monotonic() + START_S
    while server.get("/healthz").status != 200:  # healing from a cold start: 503s
        assert time.monotonic() < deadline, "the pool did not heal"
        assert server.run({"x": X}).status in (200, 503)
        time.sleep(0.05)
    assert server.request("POST", "/nowhere", b"{}").status == 404
    assert server.get("/run").status == 405
    seen = dict(server.seen)
    assert seen.get(("/run", 503), 0) >= 1 and seen.get(("/healthz", 503), 0) >= 1, seen
    metrics = server.get("/metrics").body
    for (path, code), count in seen.items():
        route = path if path in ("/run", "/healthz", "/metrics") else "other"
        assert sample(metrics, "rankguard_http_responses_total", route=route,
                      code=str(code)) == count, (path, code, metrics)
    assert len(samples(metrics, "rankguard_http_responses_total")) == len(seen), metrics
    outcomes = {"ok": seen[("/run", 200)], "failed": seen[("/run", 500)],
                "unavailable": seen[("/run", 503)], "closed": 0}
    for outcome, count in outcomes.items():
        assert sample(metrics, "rankguard_pool_requests_total", outcome=outcome) == count, \
            (outcome, count, metrics)
        assert sample(metrics, "rankguard_request_seconds_count", outcome=outcome) == count


@pytest.mark.slow  # 5 to 11 s: the quick set stays within 5 minutes
@pytest.mark.deadline(180)
def test_probes_live_while_a_request_runs_not_ready_until_it_ends(tmp_path: Path) -> None:
    server = Server(tmp_path, app=SLEEPER)
    replies: list[Reply] = []
    try:
        assert server.get("/readyz").status == 200
        with running_signal(tmp_path / "running.sock") as wait_running:
            caller = threading.Thread(target=lambda: replies.append(server.run(
                {"sleep": 3, "notify": str(tmp_path / "running.sock")}, timeout=60)))
            caller.start()
            try:
                wait_running()
                live, ready = server.get("/livez"), server.get("/readyz")
            finally:
                caller.join(60)
        assert (live.status, live.body) == (200, {"live": True, "state": "ready"})
        assert (ready.status, ready.body["ready"], ready.body["reason"]) == (503, False, "busy")
        # the busy replica is healthy: it stays in the placement
        assert [p["devices"] for p in ready.body["placement"]] == [["cpu", "cpu"]], ready.body
        assert ready.headers["retry-after"] == "1"
        assert replies[0].status == 200
        assert (server.get("/readyz").status, server.get("/livez").status) == (200, 200)
        metrics = server.get("/metrics").body
        assert sample(metrics, "rankguard_http_responses_total", route="/readyz",
                      code="503") == 1
        assert sample(metrics, "rankguard_http_responses_total", route="/livez", code="200") == 2
    finally:
        assert server.stop() == 0


@pytest.mark.slow  # a server of its own: 5 to 10 s
@pytest.mark.deadline(180)
def test_a_validate_that_raises_another_error_is_answered_500_json_without_a_traceback(
        tmp_path: Path) -> None:
    server = Server(tmp_path, app=f"{Path(__file__).with_name('serve_apps.py')}:picky_app")
    try:
        reply = server.run({"m": 1})  # picky's validate raises KeyError: a bug of the service
        assert reply.status == 500, reply.body
        assert reply.body["error"]["type"] == "ValidateFailed"
        assert reply.body["error"]["error_type"] == "KeyError"
        assert "validate raised KeyError: 'n'" in reply.body["error"]["detail"], reply.body
        assert server.run({"n": None}).status == 422  # its ValueError still refuses
        reply = server.run({"n": 3})  # and the server serves on
        assert (reply.status, reply.body["result"]) == (200, 3), reply.body
        reply = server.run({"n": 3, "as": "set"})  # a result that JSON cannot carry
        assert (reply.status, reply.body["error"]["type"]) == (500, "BadResult"), reply.body
        assert "rank 0's result is not JSON" in reply.body["error"]["detail"], reply.body
        assert server.run({"n": 4}).body["result"] == 4
    finally:
        assert server.stop() == 0
    assert "Traceback" not in server.output, server.output
    assert server.events("request_fault") == []


def request_reading(url: str, timeout: float = 20.0) -> socket.socket:
    """A connection whose request's body the server has begun to read (it answered the
    head's ``Expect: 100-continue``); the body is never sent."""
    host, port = url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.sendall(b"POST /run HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                 b"Expect: 100-continue\r\n\r\n")
    line = sock.makefile("rb").readline()
    assert line.split()[1:2] == [b"100"], line
    return sock


@pytest.mark.slow  # a server of its own: 5 s
@pytest.mark.deadline(120)
@pytest.mark.serve_args("--max-connections", "3", "--timeout", "20")
def test_past_max_connections_an_idle_one_is_closed_else_the_new_one_gets_503_both_counted(
        server: Server) -> None:
    host, port = server.url.split("//")[1].split(":")
    idle = socket.create_connection((host, int(port)), timeout=20)  # sends nothing
    held = [request_reading(server.url), request_reading(server.url)]
    try:
        held.append(request_reading(server.url))  # the fourth: the idle one makes room
        assert idle.recv(1) == b""  # closed by the server
        idle.close()
        with socket.create_connection((host, int(port)), timeout=20) as one_more:
            answer = one_more.makefile("rb").read()  # every connection has a request
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert b'"TooManyConnections"' in answer and b"retry-after: 1" in answer, answer
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while (reply := server.get("/metrics")).status != 200:  # until the server saw them close
        assert time.monotonic() < deadline, reply.body
        time.sleep(0.1)
    metrics = reply.body
    assert sample(metrics, "rankguard_http_connections_refused_total") >= 1
    assert sample(metrics, "rankguard_http_idle_connections_closed_total") == 1
    assert_served(server.run({"x": X}))


@pytest.mark.slow  # a server of its own: 5 to 10 s
@pytest.mark.deadline(180)
def test_idle_connections_past_the_descriptors_cost_no_traceback_and_others_are_served(
        tmp_path: Path) -> None:
    server = Server(tmp_path, "--timeout", "30", files=256)  # 64 connections at most
    host, port = server.url.split("//")[1].split(":")
    idle: list[socket.socket] = []
    try:
        for _ in range(400):  # no request on them: each held until the 30 s head deadline
            idle.append(socket.create_connection((host, int(port)), timeout=10))
        assert_served(server.run({"x": X}, timeout=10))
        assert len(os.listdir(f"/proc/{server.proc.pid}/fd")) < 256
        assert server.run({"x": X, "fault": "kill:rank=1"}, timeout=10).status == 500
        assert_served(server.run({"x": X}, timeout=10))  # healed: the pool had descriptors
    finally:
        for sock in idle:
            sock.close()
        assert server.stop() == 0
    assert "Traceback" not in server.output and "Too many open files" not in server.output, \
        server.output[-3000:]
