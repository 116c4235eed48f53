"""Importing a Python file by path, under a module name of the caller's choosing."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def import_file(path: str, name: str) -> ModuleType:
    """Execute the file ``path`` as the module ``name``, registered in ``sys.modules`` (so
    that pickles can refer to its functions); raises what the file raises, and then leaves no
    half-made module registered."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
