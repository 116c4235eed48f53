"""What a rank of the plugin's pool runs for a ``@pytest.mark.ranks`` test (imported by name in
the rank processes).

A rank learns that a peer left the test through that peer's notice (``internal.abandon_world``):
a rank whose test raises sends it (``serving.worker``), and so, here, does a rank whose test
calls ``dist.destroy_process_group()`` on the default group, before the group goes: a peer
waiting in a collective is released at once, its ``PeerFailed`` naming the rank and what it
did, where it would otherwise see only a closed connection (gloo) or wait until the test's
deadline (NCCL).
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..inputs.pyfiles import import_file
from ..runtime import internal

_modules: dict[str, Any] = {}


def run_test(state: Any, path: str, qualname: str, args: bytes) -> bool:
    """Call test ``qualname`` (``test_x`` or ``TestClass.test_x``) of the file ``path`` with
    the pickled fixture values ``args``; what it raises is the rank's answer. Returns whether
    the rank still has its process group (a test may destroy it: the next test must not find
    the ranks without one)."""
    function = _resolve(_load(path), qualname)
    import torch.distributed as dist  # imported by the rank before any test

    with _destroying_tells_the_peers(dist):
        function(**pickle.loads(args))
    return dist.is_initialized()


DESTROYED = "destroyed the process group (dist.destroy_process_group()) during the test"


@contextmanager
def _destroying_tells_the_peers(dist: Any) -> Iterator[None]:
    """While the test runs, ``dist.destroy_process_group()`` of the default group first tells
    the peers (``internal.abandon_world``, bounded by its notice window), then destroys it."""
    original = dist.destroy_process_group

    @functools.wraps(original)
    def destroy_process_group(group: Any = None) -> None:
        if (group is None or group is dist.group.WORLD) and dist.is_initialized():
            internal.abandon_world(f"rank {dist.get_rank()} {DESTROYED}")
        original(group)

    dist.destroy_process_group = destroy_process_group
    try:
        yield
    finally:
        dist.destroy_process_group = original


def _load(path: str) -> Any:
    """The test file as a module (imported once per rank)."""
    module = _modules.get(path)
    if module is None:
        directory = os.path.dirname(path)
        if directory not in sys.path:
            sys.path.insert(0, directory)
        name = "rankguard_ranks_" + os.path.splitext(os.path.basename(path))[0]
        module = _modules[path] = import_file(path, name)
    return module


def _resolve(module: Any, qualname: str) -> Any:
    """The test function; a method is bound to a fresh instance of its class, as pytest does
    for every test."""
    *classes, name = qualname.split(".")
    owner = module
    for cls in classes:
        owner = getattr(owner, cls)
    if classes:
        return getattr(owner(), name)
    function = getattr(owner, name)
    return getattr(function, "__wrapped__", function)
