"""No import circles in `draplugin/` or `controller/`.

The graph is read from the source with `ast`, so it holds every import a
module can run: top-level ones, the ones inside functions, and the ones under
`if TYPE_CHECKING:` (mypy follows those too, and a circle hidden in a function
is still two modules that each need the other). An edge goes to the module an
import names (`from a.b import c` is `a.b.c` when that is a module of its own,
otherwise `a.b`); a package's `__init__` that a submodule's import runs first
is not an edge, since a package re-exporting its own submodules is no circle.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("draplugin", "controller")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    return {
        module_name(root, path): path
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
    }


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of other modules in `modules`."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, module, path.name == "__init__.py")
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        edges.add(f"{base}.{alias.name}")
                    elif base in modules:
                        edges.add(base)
        edges.discard(module)
        graph[module] = edges
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_no_import_circles() -> None:
    found = circles(import_graph(source_modules(REPO_ROOT, PACKAGES)))
    assert found == [], "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def _write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        pytest.param(
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "def f() -> None:\n    from pkg import b\n",
                "pkg/b.py": "from pkg.a import f\n",
            },
            [["pkg.a", "pkg.b"]],
            id="inside-a-function",
        ),
        pytest.param(
            {
                "pkg/__init__.py": "",
                "pkg/sub/__init__.py": "",
                "pkg/sub/a.py": (
                    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.b import B\n"
                ),
                "pkg/sub/b.py": "from .c import C\n",
                "pkg/sub/c.py": "from ..sub import a\n",
            },
            [["pkg.sub.a", "pkg.sub.b", "pkg.sub.c"]],
            id="type-checking-and-relative",
        ),
        pytest.param(
            {
                "pkg/__init__.py": "from pkg.a import f\n",
                "pkg/a.py": "import pkg.b\ndef f() -> None: ...\n",
                "pkg/b.py": "X = 1\n",
            },
            [],
            id="package-re-exporting-its-submodule",
        ),
    ],
)
def test_circles_are_found(tmp_path: Path, files: Mapping[str, str], expected: list[list[str]]) -> None:
    _write(tmp_path, files)
    assert circles(import_graph(source_modules(tmp_path, ("pkg",)))) == expected
