"""The package's layers: what may import what (ARCHITECTURE.md), checked on the source.

Every import of a rankguard module counts, module-level or inside a function: a cycle closed by
a function-level import is still a cycle.
"""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

import rankguard

PACKAGE = pathlib.Path(rankguard.__file__).parent

# Each part, and the parts it may import. A part is a top-level module or a folder.
BOTTOM = {"errors", "deadline", "margins", "exit_waits"}
SHARED = {"records", "store", "processes", "inputs", "blame"}
MAY_IMPORT = {
    "errors": set(),
    "deadline": {"errors"},
    "margins": {"errors", "deadline"},
    "exit_waits": {"deadline", "margins"},
    # the shared folders: each on its own above the bottom, but the store, which keeps the
    # run's secret in a private file (records)
    **{name: BOTTOM | {name} for name in SHARED},
    "store": BOTTOM | {"store", "records"},
    "inject": BOTTOM | SHARED | {"inject"},
    "supervisor": BOTTOM | SHARED | {"supervisor"},
    "runtime": BOTTOM | SHARED | {"runtime", "inject"},
    "launcher": BOTTOM | SHARED | {"launcher", "supervisor", "inject"},
    "serving": BOTTOM | SHARED | {"serving", "supervisor", "runtime"},
    "testing": BOTTOM | SHARED | {"testing", "supervisor", "runtime", "serving"},
    "observe": BOTTOM | SHARED | {"observe"},
    "cli": BOTTOM | SHARED | {"launcher", "serving", "observe", "__init__"},
    "__main__": {"cli"},
    "__init__": BOTTOM | SHARED | {"runtime", "serving"},
}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__") or "__init__"


def _imports(path: pathlib.Path) -> set[str]:
    """The rankguard modules ``path`` imports, as dotted names below the package."""
    package = list(path.relative_to(PACKAGE).parent.parts)  # what "." means there
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "rankguard" or alias.name.startswith("rankguard."):
                    found.add(alias.name.removeprefix("rankguard").lstrip(".") or "__init__")
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module is None or not (node.module == "rankguard"
                                               or node.module.startswith("rankguard.")):
                    continue
                base = node.module.removeprefix("rankguard").lstrip(".")
            else:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                child = f"{base}.{alias.name}" if base else alias.name
                found.add(child if (PACKAGE / (child.replace(".", "/") + ".py")).exists()
                          or (PACKAGE / child.replace(".", "/")).is_dir() else base or "__init__")
    return found


def _part(module: str) -> str:
    return module.split(".")[0]


SOURCES = sorted(PACKAGE.rglob("*.py"))
GRAPH = {_module_name(p): _imports(p) - {_module_name(p)} for p in SOURCES}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_a_module_imports_only_the_layers_below_it(module: str) -> None:
    allowed = MAY_IMPORT[_part(module)]
    wrong = sorted(i for i in GRAPH[module] if _part(i) not in allowed)
    assert not wrong, f"{module} may not import {wrong} (see ARCHITECTURE.md)"


# Modules that ARCHITECTURE.md promises import less than their part may.
# (parts, or single modules)
NARROWER = {
    # torch's Flight Recorder, read in any rank; the capture mode of its reading threads
    "runtime.fr_progress": BOTTOM | {"runtime.capture_mode"},
    "runtime.capture_mode": set(),
}


@pytest.mark.parametrize("module", sorted(NARROWER))
def test_a_module_imports_no_more_than_architecture_promises(module: str) -> None:
    allowed = NARROWER[module]
    wrong = sorted(i for i in GRAPH[module] if _part(i) not in allowed and i not in allowed)
    assert not wrong, f"{module} may not import {wrong} (see ARCHITECTURE.md)"


def test_the_modules_import_one_another_without_a_cycle() -> None:
    cycles = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(GRAPH.get(module, ())):
            if target not in GRAPH:
                continue
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m != "__main__"))
def test_every_module_imports(module: str) -> None:
    """An import that names something a module no longer has fails here, not in the one run
    that reaches it (the multi-node agent is imported only for --nnodes)."""
    importlib.import_module(f"rankguard.{module}" if module != "__init__" else "rankguard")
