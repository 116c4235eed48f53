"""A rank of the plugin's warm pool: ``python -m rankguard.testing.rank_worker``.

Started by ``pool.RankPool`` with the env:// variables of its rank. It turns on the rank runtime
(``rankguard.init``: SIGTERM teardown, stacks on demand, bounded collectives), imports torch,
joins the pool's gloo group, says it is ready, then serves commands, one JSON line each on
stdin, answering one JSON line each on the file descriptor ``RANKGUARD_POOL_FD``:

- ``{"op": "run", "path", "name", "args", "collective_timeout"}``: import the test file (once),
  call the test function (``name``: ``test_x`` or ``TestClass.test_x``) with the pickled arguments, every collective bounded by
  ``collective_timeout``; answer ``{"outcome": "passed"}`` or ``{"outcome": "failed", ...}``
  with the error type, whether it is a collective error (a consequence of a peer's fault), the
  ranks it names, the traceback and when it happened. A rank that fails by itself first tells
  its peers (the group is retired everywhere), so they stop waiting for it at once.
- ``{"op": "regroup"}``: form a fresh generation of the same ranks after a failed test.
- ``{"op": "exit"}``: a bounded shutdown, then exit 0.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import pickle
import sys
import time
import traceback
from typing import Any

import rankguard
from rankguard.runtime import groups

_modules: dict[str, Any] = {}


def _load(path: str) -> Any:
    module = _modules.get(path)
    if module is None:
        directory = os.path.dirname(path)
        if directory not in sys.path:
            sys.path.insert(0, directory)
        name = "rankguard_ranks_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _modules[path] = module
    return module


def _resolve(module: Any, qualname: str) -> Any:
    """The test function called ``qualname`` in ``module``; a method is bound to a fresh
    instance of its class, as pytest does for every test."""
    *classes, name = qualname.split(".")
    owner = module
    for cls in classes:
        owner = getattr(owner, cls)
    if classes:
        return getattr(owner(), name)
    function = getattr(owner, name)
    return getattr(function, "__wrapped__", function)


def _run(command: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    started = time.time()
    try:
        function = _resolve(_load(command["path"]), command["name"])
        kwargs = pickle.loads(base64.b64decode(command["args"]))
        with rankguard.deadline(command["collective_timeout"]):
            function(**kwargs)
        return {"outcome": "passed", "took": time.time() - started}
    except BaseException as error:  # noqa: BLE001 (reported to the plugin, whatever it is)
        collective = isinstance(error, (rankguard.CollectiveError, rankguard.GroupRetired))
        if not collective:
            groups.abandon_world(f"rank {dist.get_rank()} failed the test")
        return {"outcome": "failed", "error": type(error).__name__, "collective": collective,
                "missing": list(getattr(error, "missing", []) or []), "message": str(error),
                "traceback": traceback.format_exc(), "at": time.time()}


def main() -> None:
    rankguard.init(grace=float(os.environ.get("RANKGUARD_GRACE", "2")))
    import torch.distributed as dist

    out = os.fdopen(int(os.environ["RANKGUARD_POOL_FD"]), "w", buffering=1)
    dist.init_process_group("gloo")
    out.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "run":
            answer = _run(command)
        elif op == "regroup":
            generation = rankguard.regroup(exclude=[], timeout=command.get("timeout", 10))
            answer = {"ok": True, "took": generation.took}
        else:
            rankguard.shutdown(timeout=command.get("timeout", 5))
            out.write(json.dumps({"ok": True}) + "\n")
            return
        out.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
