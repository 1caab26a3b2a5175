"""The package's import graph, read from the source (every ``import``,
inside functions and under ``TYPE_CHECKING`` included).

    python tests/helpers/import_graph.py     # import cycles: 0 ... (exit 1 otherwise)

The rooms point one way: impl <- spec <- model <- oracle <- the CLI, with
the bench beside the oracle and using it (:data:`LAYERS`).  Reports the
import cycles, the imports that point the other way and the imports of
another module's private names; ``.ci/run`` runs it, and
tests/test_layering.py asserts on the same functions.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, List, Set, Union

ROOT = Path(__file__).resolve().parents[2]
LAYERS = {"impl": 0, "spec": 1, "model": 2, "oracle": 3, "bench": 4, "cli": 5}
ImportNode = Union[ast.Import, ast.ImportFrom]


def modules() -> Dict[str, Path]:
    """Every module of the package, by its ``prefixcache.*`` name."""
    found = {"prefixcache.cli": ROOT / "prefixcache" / "cli.py"}
    for part in ("impl", "spec", "model", "oracle", "bench"):
        for path in (ROOT / part).rglob("*.py"):
            names = ["prefixcache", part, *path.relative_to(ROOT / part).with_suffix("").parts]
            found[".".join(names[:-1] if names[-1] == "__init__" else names)] = path
    return found


def imports(path: Path) -> List[ImportNode]:
    """Every import statement of a file, wherever it stands."""
    return [n for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.Import, ast.ImportFrom))]


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def graph() -> Dict[str, Set[str]]:
    """Module -> the package's modules it imports."""
    known = modules()

    def resolve(name: str) -> str:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name

    edges: Dict[str, Set[str]] = {}
    for module, path in known.items():
        deps: Set[str] = set()
        for node in imports(path):
            if isinstance(node, ast.ImportFrom):
                target = _absolute(module, path, node)
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            else:
                names = [a.name for a in node.names]
            deps |= {resolve(n) for n in names} - {"", module}
        edges[module] = deps
    return edges


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle (as a path that ends where it starts) per strongly connected
    group of more than one module."""
    found: List[List[str]] = []
    done: Set[str] = set()

    def visit(module: str, path: List[str]) -> None:
        if module in path:
            found.append(path[path.index(module):] + [module])
            return
        if module in done:
            return
        for dep in sorted(edges[module]):
            visit(dep, path + [module])
        done.add(module)

    for module in sorted(edges):
        visit(module, [])
    return found


def upward(edges: Dict[str, Set[str]]) -> List[str]:
    """The imports that point from a lower room to a higher one."""
    def layer(module: str) -> int:
        return LAYERS[module.split(".")[1]]

    return sorted(f"{m} -> {d}" for m, deps in edges.items() for d in deps if layer(d) > layer(m))


def private_imports() -> List[str]:
    """``from X import _name`` anywhere in the package."""
    return sorted(f"{module}: {alias.name}" for module, path in modules().items()
                  for node in imports(path) if isinstance(node, ast.ImportFrom)
                  and node.module != "__future__"
                  for alias in node.names if alias.name.startswith("_"))


def main() -> int:
    """Print the three counts (and each offence); 1 if any is not zero."""
    edges = graph()
    report = {"import cycles": [" -> ".join(c) for c in cycles(edges)],
              "imports against the rooms' order": upward(edges),
              "imports of private names": private_imports()}
    for label, offences in report.items():
        print(f"{label}: {len(offences)}")
        for offence in offences:
            print(f"  {offence}")
    return 1 if any(report.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
