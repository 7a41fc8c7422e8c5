"""The rooms of `draplugin/` and `controller/` as docs/architecture.md shows them.

Each package says in the first line of its `__init__.py` what it is; the
architecture page names every room; `controller/` keeps only a handful of
modules at its top; and imports between the controller's rooms go one way,
with every `command.py` (and `cli.py`) counted as one layer, the commands',
on top of all of them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.unit.test_import_graph import circles, import_graph, source_modules

REPO_ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
# Generated code, documented as one part of kubelet/.
GENERATED = "_proto"
CONTROLLER_TOP_LIMIT = 5


def rooms(package: str) -> list[Path]:
    return sorted(
        path.parent for path in (REPO_ROOT / package).rglob("__init__.py") if GENERATED not in path.parts
    )


@pytest.mark.parametrize("room", rooms("draplugin") + rooms("controller"), ids=str)
def test_every_package_says_what_it_is(room: Path) -> None:
    docstring = ast.get_docstring(ast.parse((room / "__init__.py").read_text()))
    assert docstring and docstring.splitlines()[0].strip(), f"{room}/__init__.py has no one-line docstring"


def test_the_architecture_page_names_every_room() -> None:
    text = ARCHITECTURE.read_text()
    missing = [
        str(room.relative_to(REPO_ROOT))
        for package in ("draplugin", "controller")
        for room in rooms(package)
        if room.name != package and f"{room.name}/" not in text
    ]
    top = [
        path.name for path in sorted((REPO_ROOT / "controller").glob("*.py")) if path.name != "__init__.py"
    ]
    missing += [f"controller/{name}" for name in top if name not in text]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_controller_keeps_a_handful_of_modules_at_its_top() -> None:
    top = sorted(path.name for path in (REPO_ROOT / "controller").glob("*.py"))
    assert len(top) <= CONTROLLER_TOP_LIMIT, f"controller/ has {len(top)} modules at its top: {top}"


def controller_room(module: str) -> str:
    """The room a controller module belongs to; commands form one layer of their own."""
    parts = module.split(".")
    if parts[-1] == "command" or module == "controller.cli":
        return "commands"
    if len(parts) == 1:
        return "controller"
    return parts[1]


def test_imports_between_the_controller_rooms_go_one_way() -> None:
    graph = import_graph(source_modules(REPO_ROOT, ("controller",)))
    between: dict[str, set[str]] = {}
    for module, imported in graph.items():
        room = controller_room(module)
        between.setdefault(room, set()).update(controller_room(m) for m in imported)
        between[room].discard(room)
    assert circles(between) == []
    assert between["cel"] == set() and between["allocation"] == {"cel"}
    assert not any("commands" in imported for imported in between.values())
