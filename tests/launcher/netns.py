"""Nodes on one machine, each in a Linux network namespace of its own, with its own address on a
veth pair to a bridge that the test makes: traffic between them crosses a real (virtual) link,
which a test can cut (a partition).

Everything made here is named after the test's process (several tests may run at once) and
removed on the way out, even when the test fails; where namespaces cannot be made (not root, no
``ip``), the test is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Iterator

import pytest

IFNAME = "rgeth0"  # the node's side of its link, in its namespace (give it to gloo)
_CMD_S = 10.0  # one `ip` command, on a loaded machine


@dataclass(frozen=True)
class Node:
    """One namespace node."""

    namespace: str
    address: str
    link: str  # the host's side of its veth pair: down = the node is cut off

    def wrap(self) -> list[str]:
        """The command prefix that runs a program inside this node."""
        return ["ip", "netns", "exec", self.namespace]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=_CMD_S)


def _quiet_ip(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, timeout=_CMD_S)


def cut(node: Node) -> None:
    """Partition ``node``: its link to the bridge goes down (nothing crosses; no reset is
    sent to anyone, as when a network fails)."""
    _ip("link", "set", node.link, "down")


@contextlib.contextmanager
def nodes(count: int) -> Iterator[list[Node]]:
    """``count`` namespace nodes on one bridge, addresses 10.X.Y.1 and up; all removed after."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2's `ip`")
    tag = f"{os.getpid() % 100000:05d}"
    subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() // 50 % 250}"
    bridge = f"rgb{tag}"
    made: list[Node] = []
    try:
        try:
            _ip("link", "add", bridge, "type", "bridge")
            _ip("link", "set", bridge, "up")
            for index in range(count):
                node = Node(f"rgn{tag}{index}", f"{subnet}.{index + 1}", f"rgv{tag}{index}")
                _ip("netns", "add", node.namespace)
                made.append(node)
                _ip("link", "add", node.link, "type", "veth", "peer", "name", IFNAME, "netns",
                    node.namespace)
                _ip("link", "set", node.link, "master", bridge)
                _ip("link", "set", node.link, "up")
                inside = ["netns", "exec", node.namespace, "ip"]
                _ip(*inside, "link", "set", "lo", "up")
                _ip(*inside, "addr", "add", f"{node.address}/24", "dev", IFNAME)
                _ip(*inside, "link", "set", IFNAME, "up")
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot make network namespaces here: {exc.stderr.strip()}")
        yield made
    finally:
        for node in made:
            _quiet_ip("netns", "del", node.namespace)
            _quiet_ip("link", "del", node.link)
        _quiet_ip("link", "del", bridge)
        _await_gone(bridge, [node.link for node in made])


def _await_gone(bridge: str, links: list[str], within_s: float = _CMD_S) -> None:
    """Links are removed asynchronously: return once none of ours is listed."""
    until = time.monotonic() + within_s
    names = {bridge, *links}
    while time.monotonic() < until:
        listed = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                                timeout=_CMD_S).stdout
        if not any(f" {name}:" in listed or f" {name}@" in listed for name in names):
            return
        time.sleep(0.05)  # the kernel frees them shortly; nothing signals it
    raise AssertionError(f"links left behind: {names}")
