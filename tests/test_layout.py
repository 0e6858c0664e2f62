"""The package's rooms follow the path of data: no import cycles, and no room imports a room above it.

Imports are read from the source (every `import`, including those inside functions and under
TYPE_CHECKING, since a cycle for typing is still a cycle in the design).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROOTS = {"lakefeed": REPO / "daemon", "lakefeed.connectors": REPO / "connectors"}

# Bottom to top; rooms on one line share a rank and may not import each other.
RANKS = [
    ["kernel"],  # lakefeed.clock, errors, log, failpoints: the small core every room uses
    ["lakefeed.config"],
    ["lakefeed.inbox"],
    ["lakefeed.connectors.sources", "lakefeed.connectors.streams"],
    ["lakefeed.batch"],
    ["lakefeed.connectors.sinks"],
    ["lakefeed.odf", "lakefeed.query"],
    ["lakefeed.manifests"],
    ["lakefeed.pipeline"],
    ["lakefeed.intake"],
    ["lakefeed.ops"],
]
RANK = {room: i for i, rooms in enumerate(RANKS) for room in rooms}
ENTRY_POINTS = {"lakefeed.__main__"}  # `python -m lakefeed`: the CLI's entry, above every room


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in ROOTS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def room_of(module: str) -> str:
    for room in sorted(RANK, key=len, reverse=True):
        if room != "kernel" and (module == room or module.startswith(room + ".")):
            return room
    return "kernel"


def imports_of(path: Path, known: dict[str, Path]) -> set[str]:
    """The lakefeed modules a file imports (a `from package import name` counts the submodule when it is one)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif node.module in known:
                    out.add(node.module)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    # a package's __init__ is imported with each of its modules, but it holds only a docstring
    return {m: imports_of(p, known) - {m} for m, p in known.items()}


def test_every_module_has_a_room_and_every_room_a_docstring(graph: dict[str, set[str]]) -> None:
    rooms = {room_of(m) for m in graph if m not in ENTRY_POINTS}
    assert rooms == set(RANK), f"rooms on disk {sorted(rooms)} differ from the ranks {sorted(RANK)}"
    for room in RANK.keys() - {"kernel"}:
        init = modules()[room]
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and " in" in doc and "out" in doc, f"{init} should say what comes in and what goes out"
    kernel = sorted(m for m in graph if room_of(m) == "kernel" and m not in ENTRY_POINTS)
    assert kernel == ["lakefeed", "lakefeed.clock", "lakefeed.connectors", "lakefeed.errors", "lakefeed.failpoints",
                      "lakefeed.log"]


def test_rooms_import_only_rooms_below_them(graph: dict[str, set[str]]) -> None:
    upward = []
    for module, deps in graph.items():
        if module in ENTRY_POINTS:
            continue
        mine = room_of(module)
        for dep in deps:
            theirs = room_of(dep)
            if theirs != mine and RANK[theirs] >= RANK[mine]:
                upward.append(f"{module} ({mine}) imports {dep} ({theirs})")
    assert not upward, "imports that go up or sideways between rooms:\n" + "\n".join(sorted(upward))


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    cycles, state = [], {}

    def visit(module: str, stack: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == "open":
                cycles.append(" -> ".join([*stack[stack.index(dep):], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checks_see_an_upward_import_and_a_cycle() -> None:
    """The rules above would pass on an empty graph; a planted violation must fail them."""
    planted = {"lakefeed.batch.read": {"lakefeed.ops.cli"}, "lakefeed.ops.cli": {"lakefeed.batch.read"}}
    with pytest.raises(AssertionError, match="imports lakefeed.ops.cli"):
        test_rooms_import_only_rooms_below_them(planted)
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycles(planted)
