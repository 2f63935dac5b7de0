"""The house's floors: imports go one way, shared ground → writers and readers → diagnostics → the
command line, and no module uses another's private names.

Each module's floor comes from where it lives. A test, not a convention: a new import that climbs a
floor, or a writer that reaches into a reader, fails here with the line that does it; so does an
import cycle, named module by module with the lines that close it.
"""

from __future__ import annotations

import ast
import warnings
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Package folder in the checkout → the name it is installed under.
SOURCES = {"packload": "packload", "packer": "packload.packer", "loaders": "packload.loaders"}
# Floors, lowest first; a module may import only from its own floor or lower ones.
FLOORS = {
    "packload.core": 0,
    "packload.packer": 1,
    "packload.loaders": 1,
    "packload.merger": 2,  # reads packs and writes one
    "packload.diagnose": 3,
    "packload.demo": 4,
    "packload.cli": 5,
    "packload.cli_diagnose": 5,
    "packload.cli_pack": 5,
    "packload.cli_parser": 5,
    "packload.cli_read": 5,
    "packload.cli_report": 5,
    "packload.__main__": 6,
    "packload": 6,  # the public names, gathered from every floor
}
# Writers and readers stand side by side: neither imports the other.
APART = {("packload.packer", "packload.loaders"), ("packload.loaders", "packload.packer")}


def modules() -> list[tuple[str, Path]]:
    found = []
    for folder, package in SOURCES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found.append((".".join([package, *parts]), path))
    return found


def area(module: str) -> str:
    """The most specific key of ``FLOORS`` that ``module`` falls under."""
    return max((key for key in FLOORS if module == key or module.startswith(key + ".")), key=len)


def imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of every import of packload's modules in ``path``, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "packload":
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names if alias.name.split(".")[0] == "packload"]
    return found


def test_the_sources_are_found() -> None:
    found = [name for name, _ in modules()]
    assert {"packload.core.format", "packload.packer.pipeline", "packload.loaders.read", "packload.cli"} <= set(found)
    assert len(found) == len(set(found)), "a module found twice (a folder reached by two paths)"


# the compiled extension modules and the one wrapper that loads each
COMPILED = {("packload.core.resize_kernel", "packload.core", "_resize"),
            ("packload.core.jpeg_kernel", "packload.core", "_jpeg_boxes")}


@pytest.mark.parametrize("module,path", modules(), ids=[name for name, _ in modules()])
def test_imports_go_down_the_floors(module: str, path: Path) -> None:
    here = area(module)
    wrong = []
    for line, target, name in imports(path):
        there = area(target)
        if (module, target, name) in COMPILED:
            continue  # a compiled module, loaded by its wrapper
        if FLOORS[there] > FLOORS[here] or (here, there) in APART:
            wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target} (floor {there}) from {here}")
        if name and name.startswith("_") and name != "__version__":
            wrong.append(f"{path.relative_to(ROOT)}:{line} imports the private {target}.{name}")
    assert not wrong, "\n".join(wrong)


def test_the_floors_catch_a_climbing_import(tmp_path: Path) -> None:
    """The check itself: an import from the command line inside the format module is reported."""
    climbing = tmp_path / "format.py"
    climbing.write_text("from packload.cli import main\nfrom packload.loaders.read import _private\n")
    [(_, target, _), (_, _, name)] = imports(climbing)
    assert FLOORS[area(target)] > FLOORS[area("packload.core.format")] and name.startswith("_")


# ---------------------------------------------------------------- cycles

# Import edges known to close a cycle, each being taken out by a change of its own. One edge per
# cycle (the one that goes back), so that the rest of the graph is still checked; remove an entry
# once its cycle is gone. Nothing new belongs here: break a new cycle instead.
KNOWN_CYCLE_EDGES: set[tuple[str, str]] = set()

Graph = dict[str, dict[str, str]]  # module -> {a module it imports: "path:line" of its first import}


def import_graph(found: list[tuple[str, Path]], root: Path = ROOT) -> Graph:
    """Which of packload's modules each module imports, and where.

    Every import statement counts, at any depth: a function-level import runs when the function
    does, and one under ``if TYPE_CHECKING`` is followed by type checkers and editors; a cycle
    hidden in a function body is still two modules that each need the other, the knot the floors
    exist to prevent. ``from package import name`` goes to the submodule when ``name`` is one, else
    to the package. The parent packages Python imports first (``packload/__init__.py`` gathers the
    public names, lazily) are not edges: every module would close a cycle through them.
    """
    names = {name for name, _ in found}
    graph: Graph = {name: {} for name in names}
    for module, path in found:
        for line, target, name in imports(path):
            there = f"{target}.{name}" if name and f"{target}.{name}" in names else target
            while there not in names and "." in there:  # a compiled module: its package
                there = there.rpartition(".")[0]
            if there in names and there != module:
                graph[module].setdefault(there, f"{path.relative_to(root)}:{line}")
    return graph


def find_cycles(graph: Graph) -> list[list[str]]:
    """A cycle (its modules in import order, the first repeated last) in each group of modules of
    ``graph`` that import each other, directly or not; empty when there is none."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []
    for start in sorted(graph):  # Tarjan's strongly connected components, without recursion
        if start in order:
            continue
        order[start] = low[start] = len(order)
        stack.append(start)
        work = [(start, iter(sorted(graph[start])))]
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in order:
                    order[target] = low[target] = len(order)
                    stack.append(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in stack:
                    low[node] = min(low[node], order[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == order[node]:
                    group = {stack.pop()}
                    while node not in group:
                        group.add(stack.pop())
                    if len(group) > 1:
                        groups.append(group)
    return sorted(_cycle_within(graph, group) for group in groups)


def _cycle_within(graph: Graph, group: set[str]) -> list[str]:
    """A shortest cycle through the first (by name) module of ``group``, whose modules all reach
    each other."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node]):
            if target == start:
                return paths[node] + [start]
            if target in group and target not in paths:
                paths[target] = paths[node] + [target]
                queue.append(target)
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


def describe(graph: Graph, cycle: list[str]) -> str:
    """``a (path:line) -> b (path:line) -> a``: each module with the line that imports the next."""
    return " -> ".join(f"{a} ({graph[a][b]})" for a, b in pairwise(cycle)) + f" -> {cycle[-1]}"


def test_no_import_cycles() -> None:
    graph = import_graph(modules())
    for module, target in sorted(KNOWN_CYCLE_EDGES):
        if graph.get(module, {}).pop(target, None) is None:  # fixed: say so, without failing
            warnings.warn(f"KNOWN_CYCLE_EDGES: {module} no longer imports {target}; remove the entry", stacklevel=1)
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe(graph, cycle) for cycle in cycles)


def test_the_cycle_check_names_a_cycle(tmp_path: Path) -> None:
    """The check itself, on modules written here: a cycle through a function-level import and one
    through a TYPE_CHECKING import are both found and named with their lines; a compiled module is
    its package, and a chain with no way back is no cycle."""
    sources = {
        "packload.core.a": "from packload.core.b import x\n",
        "packload.core.b": "def f():\n    import packload.core.c\n",
        "packload.core.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from packload.core import a\n",
        "packload.core.d": "from packload.core.a import y\nfrom packload.core import _compiled\n",
        "packload.core.e": "from packload.core.f import z\n",
        "packload.core.f": "import packload.core.e\n",
        "packload.core": "",
    }
    found = []
    for name, text in sources.items():
        (tmp_path / f"{name}.py").write_text(text)
        found.append((name, tmp_path / f"{name}.py"))
    graph = import_graph(found, root=tmp_path)
    assert graph["packload.core.d"] == {"packload.core.a": "packload.core.d.py:1", "packload.core": "packload.core.d.py:2"}
    cycles = find_cycles(graph)
    assert cycles == [["packload.core.a", "packload.core.b", "packload.core.c", "packload.core.a"],
                      ["packload.core.e", "packload.core.f", "packload.core.e"]]
    assert describe(graph, cycles[0]) == ("packload.core.a (packload.core.a.py:1) -> packload.core.b "
                                          "(packload.core.b.py:2) -> packload.core.c (packload.core.c.py:3) "
                                          "-> packload.core.a")
    del graph["packload.core.c"]["packload.core.a"]
    assert find_cycles(graph) == [["packload.core.e", "packload.core.f", "packload.core.e"]]
