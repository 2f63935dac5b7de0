"""The house's floors: imports go one way, shared ground → writers and readers → diagnostics → the
command line, and no module uses another's private names.

Each module's floor comes from where it lives. A test, not a convention: a new import that climbs a
floor, or a writer that reaches into a reader, fails here with the line that does it.
"""

from __future__ import annotations

import ast
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
    "packload.cli_parser": 5,
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
    names = {name for name, _ in modules()}
    assert {"packload.core.format", "packload.packer.pipeline", "packload.loaders.read", "packload.cli"} <= names


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
