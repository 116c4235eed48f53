"""A real headless Chromium driven over the W3C WebDriver protocol (Debian's chromium and
chromium-driver packages; plain HTTP to chromedriver on loopback, no client library). Tests that
need it skip where the packages are missing; CI installs them (``.ci/run``)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, Iterator

import pytest

CHROMIUM = "/usr/bin/chromium"
START_S = 30.0  # chromedriver answering, and a session opening, on a loaded machine
REQUEST_S = 60.0
# the flags a closed network and a root user need (see the environment's notes)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1200,1400"]


class Browser:
    """One WebDriver session."""

    def __init__(self, base: str, session: str) -> None:
        self._base = f"{base}/session/{session}"

    def open(self, url: str) -> None:
        _call("POST", f"{self._base}/url", {"url": url})

    def run(self, script: str, *args: Any) -> Any:
        """The value ``script`` (a function body) returns in the page."""
        return _call("POST", f"{self._base}/execute/sync", {"script": script, "args": list(args)})

    def screenshot(self, path: str) -> None:
        with open(path, "wb") as out:
            out.write(base64.b64decode(_call("GET", f"{self._base}/screenshot")))


def _call(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"},
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_S) as response:
            return json.load(response)["value"]
    except urllib.error.HTTPError as error:
        raise AssertionError(f"webdriver {method} {url}: {error.read()[:2000]!r}") from error


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium session; skips the test where Chromium or its driver is missing."""
    driver = shutil.which("chromedriver")
    if driver is None or not os.path.exists(CHROMIUM):
        pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver)")
    port = _free_port()
    profile = tempfile.mkdtemp(prefix="rankguard-chromium-")
    proc = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    session = None
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                if _call("GET", f"{base}/status").get("ready"):
                    break
            except (OSError, AssertionError):
                pass
            assert proc.poll() is None, f"chromedriver exited with {proc.returncode}"
            assert time.monotonic() < deadline, "chromedriver did not answer in time"
            time.sleep(0.1)
        opened = _call("POST", f"{base}/session", {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": {
                "binary": CHROMIUM, "args": [*FLAGS, f"--user-data-dir={profile}"]}}}})
        session = opened["sessionId"]
        yield Browser(base, session)
    finally:
        if session is not None:
            with contextlib.suppress(OSError, AssertionError):
                _call("DELETE", f"{base}/session/{session}")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the driver, and any browser it left
        proc.wait(timeout=10)
        shutil.rmtree(profile, ignore_errors=True)
