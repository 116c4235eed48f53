"""A real etcd server for a test (Debian's ``etcd-server`` package; ``.ci/run`` installs it).

``etcd_server(tmp_path)`` starts one on free loopback ports with its v2 API enabled (torch's
etcd-v2 rendezvous speaks v2), waits until it answers, and stops it (SIGKILL, then reaped) when
the block ends, whatever happened inside. Tests that need it skip, naming what is missing, where
the server or the ``python-etcd`` client is not installed.
"""

from __future__ import annotations

import contextlib
import http.client
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from rankguard.deadline import Deadline

START_S = 30.0  # a loaded machine starts etcd in about a second


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def require_etcd() -> str:
    """The etcd binary's path; skips the test where etcd or python-etcd is missing."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("no etcd server here: apt-get install etcd-server (.ci/run does)")
    try:
        import etcd  # noqa: F401
    except ImportError:
        pytest.skip("no python-etcd here: pip install -e '.[test]' installs it")
    return binary


def _answers(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
        conn.request("GET", "/v2/keys/")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


@contextlib.contextmanager
def etcd_server(folder: Path) -> Iterator[str]:
    """A running etcd with its data in ``folder``; yields its endpoint ``127.0.0.1:PORT``."""
    binary = require_etcd()
    client, peer = _free_ports(2)
    log = open(folder / "etcd.log", "wb")
    proc = subprocess.Popen(
        [binary, "--enable-v2", "--name", "test", "--data-dir", str(folder / "etcd-data"),
         "--listen-client-urls", f"http://127.0.0.1:{client}",
         "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"test=http://127.0.0.1:{peer}"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        until = Deadline.after(START_S)
        while not _answers(client):
            if proc.poll() is not None or until.passed():
                pytest.fail(f"etcd did not start: {(folder / 'etcd.log').read_text()[-2000:]}")
            time.sleep(until.wait_time(0.05))  # nothing signals that etcd is up
        yield f"127.0.0.1:{client}"
    finally:
        proc.kill()
        proc.wait(timeout=10)
        log.close()
