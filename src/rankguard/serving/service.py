"""What ``rankguard serve APP`` serves: a :class:`Service`, and how ``APP`` is found."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import pickle
import sys
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UsageError
from ..inputs.pyfiles import import_file


@dataclass
class Service:
    """A model served by ``rankguard serve``.

    Attributes:
        handle: ``handle(state, request) -> result``, run on every rank for each request
            (``request``: the JSON body, a dict); rank 0's result is the response, so it must
            be JSON-serialisable. Module-level, so the ranks can import it.
        setup: ``setup(rank, world_size) -> state``, run once per rank, ahead of time in spare
            replicas.
        validate: ``validate(request) -> request``, run in every rank before ``handle`` (the
            ranks parse the body: ``serving.request_body``); raising ``ValueError`` or
            ``TypeError`` answers 422 with its message, any other exception (or returning
            None or a bool) 500 ``ValidateFailed`` naming it; neither is a rank's fault.
            Module-level, and the same answer on every rank.
        world_size: ranks per replica.
        replicas: replicas that serve requests at the same time.
        spares: spare replicas kept ready.
        timeout: default deadline of a request, in seconds (the ``X-Request-Timeout`` header
            may ask for another).
    """

    handle: Callable[[Any, dict[str, Any]], Any]
    setup: Callable[[int, int], Any] | None = None
    validate: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    world_size: int = 2
    spares: int = 1
    replicas: int = 1
    timeout: float = 10.0


def load(spec: str) -> Service:
    """The :class:`Service` that ``spec`` names: ``path/to/file.py:name`` or ``module:name``
    (``name`` defaults to ``app``).

    Raises:
        UsageError: the file or module cannot be found or imported, ``name`` is missing or
            not a Service, or its ``handle`` or ``validate`` cannot be pickled.
    """
    target, _, name = spec.partition(":")
    name = name or "app"
    if target.endswith(".py"):
        module = _load_file(spec, target)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as error:
            raise UsageError("APP", f"cannot import module {target!r}: {error}",
                             "give path/to/file.py:name or an importable module:name") from None
    service = getattr(module, name, None)
    if service is None:
        raise UsageError("APP", f"{target} has no attribute {name!r}",
                         "name the rankguard.Service object after the colon")
    if not isinstance(service, Service):
        raise UsageError("APP", f"{target}:{name} is a {type(service).__name__}, not a "
                         "rankguard.Service")
    for role in ("handle", "validate"):  # sent to the ranks with each request
        try:
            pickle.dumps(getattr(service, role))
        except Exception as error:  # noqa: BLE001 (whatever pickling raises)
            raise UsageError("APP", f"{target}:{name}'s {role} cannot be sent to the ranks: "
                             f"{error}", f"make {role} a module-level function") from None
    return service


def _load_file(spec: str, path: str) -> Any:
    """Import the file as a module named after it, its folder on ``sys.path``, so that the
    ranks (which inherit the leader's path) import its functions by the same name."""
    if not os.path.isfile(path):
        raise UsageError("APP", f"no such file: {path}", f"check the path in {spec!r}")
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.splitext(os.path.basename(path))[0]
    other = _shadowed(name, folder)
    if other is not None:
        raise UsageError("APP", f"{path} has the name of the module {name!r} that Python "
                         f"imports from {other}: the ranks (and the server) would take that "
                         "one for your file", f"rename {os.path.basename(path)}, e.g. "
                         f"my_{name}.py")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        return import_file(path, name)
    except Exception as error:  # noqa: BLE001 (any error of the user's file)
        raise UsageError("APP", f"importing {path} failed: {type(error).__name__}: {error}"
                         ) from None


def _shadowed(name: str, folder: str) -> str | None:
    """Where a module ``name`` other than the file of that name in ``folder`` comes from (the
    standard library's ``queue``, an installed package's): the server has it or imports it, and
    a rank that unpickles ``name.handle`` would find that module's; None when there is none."""
    if name in sys.builtin_module_names:
        return "Python itself (a built-in module)"
    loaded = sys.modules.get(name)
    if loaded is not None:  # the file itself, loaded before, is no other
        where = getattr(loaded, "__file__", None)
        same = where is not None and os.path.dirname(os.path.abspath(where)) == folder
        return None if same else where or "Python itself"
    elsewhere = [entry for entry in sys.path
                 if os.path.abspath(entry or os.curdir) != folder]
    found = importlib.machinery.PathFinder.find_spec(name, elsewhere)
    return None if found is None else (found.origin or f"the package {name}")
