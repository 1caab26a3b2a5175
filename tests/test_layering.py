"""The package's imports point one way: impl <- spec <- model <- oracle <- the
CLI, with the bench beside the oracle and using it; no cycle (imports inside
functions and under TYPE_CHECKING included) and no import of another
module's private names."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"impl": 0, "spec": 1, "model": 2, "oracle": 3, "bench": 4, "cli": 5}


def _modules() -> Dict[str, Path]:
    found = {"prefixcache.cli": ROOT / "prefixcache" / "cli.py"}
    for part in ("impl", "spec", "model", "oracle", "bench"):
        for path in (ROOT / part).rglob("*.py"):
            names = ["prefixcache", part, *path.relative_to(ROOT / part).with_suffix("").parts]
            found[".".join(names[:-1] if names[-1] == "__init__" else names)] = path
    return found


MODULES = _modules()


def _imports(module: str, path: Path) -> List[ast.ImportFrom | ast.Import]:
    return [n for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.Import, ast.ImportFrom))]


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str) -> str:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _graph() -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for module, path in MODULES.items():
        deps: Set[str] = set()
        for node in _imports(module, path):
            if isinstance(node, ast.ImportFrom):
                target = _absolute(module, path, node)
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            else:
                names = [a.name for a in node.names]
            deps |= {_known(n) for n in names} - {"", module}
        graph[module] = deps
    return graph


def _layer(module: str) -> int:
    return LAYERS[module.split(".")[1]]


def test_no_import_cycle() -> None:
    graph = _graph()
    done: Set[str] = set()

    def visit(module: str, path: List[str]) -> None:
        if module in path:
            cycle = path[path.index(module):] + [module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, path + [module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_imports_point_one_way() -> None:
    upward = [f"{m} -> {d}" for m, deps in _graph().items() for d in deps
              if _layer(d) > _layer(m)]
    assert upward == []


def test_no_module_imports_another_modules_private_names() -> None:
    private = [f"{module}: {alias.name}" for module, path in MODULES.items()
               for node in _imports(module, path) if isinstance(node, ast.ImportFrom)
               and node.module != "__future__"
               for alias in node.names if alias.name.startswith("_")]
    assert private == []
