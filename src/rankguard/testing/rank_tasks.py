"""What a rank of the plugin's pool runs for a ``@pytest.mark.ranks`` test (imported by name in
the rank processes)."""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any

from ..inputs.pyfiles import import_file

_modules: dict[str, Any] = {}


def run_test(state: Any, path: str, qualname: str, args: bytes) -> bool:
    """Call test ``qualname`` (``test_x`` or ``TestClass.test_x``) of the file ``path`` with
    the pickled fixture values ``args``; what it raises is the rank's answer. Returns whether
    the rank still has its process group (a test may destroy it: the next test must not find
    the ranks without one)."""
    function = _resolve(_load(path), qualname)
    function(**pickle.loads(args))
    import torch.distributed as dist  # imported by the rank before any test

    return dist.is_initialized()


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
