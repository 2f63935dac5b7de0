"""The tests mirror the packages: the tests of ``packload/core/x.py`` are ``tests/core/test_x.py``, of
``loaders/x.py`` ``tests/loaders/test_x.py``, of ``packer/x.py`` ``tests/packer/test_x.py``, of
``packload/diagnose/x.py`` ``tests/diagnose/test_x.py``, of ``packload/x.py`` ``tests/test_x.py``; every
library module with behaviour of its own has that file, and no test file lies outside the folders of
this layout (docs/CONTRIBUTING.md, Layout)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

# library folder -> the tests' folder beside it
PACKAGES = {
    "packload": TESTS,
    "packload/core": TESTS / "core",
    "loaders": TESTS / "loaders",
    "packer": TESTS / "packer",
    "packload/diagnose": TESTS / "diagnose",
}
# test folders that mirror no library package: the benchmarks' tests, and the reliability
# campaigns' tests beside their helpers (RELIABILITY.md)
OTHER_TEST_FOLDERS = {TESTS / "benchmarks", TESTS / "reliability"}

# Modules with no behaviour of their own to test apart from their callers, and why.
NO_TEST_FILE = {
    "packload/__main__.py": "runs the command line (`python -m packload`): tests/test_cli.py runs it",
}


def _modules() -> list[Path]:
    return sorted(path for folder in PACKAGES for path in (ROOT / folder).glob("*.py") if path.name != "__init__.py")


def test_every_module_has_its_test_file() -> None:
    missing = []
    for module in _modules():
        rel = module.relative_to(ROOT).as_posix()
        expected = PACKAGES[module.parent.relative_to(ROOT).as_posix()] / f"test_{module.stem}.py"
        if rel not in NO_TEST_FILE and not expected.is_file():
            missing.append(f"{rel}: no {expected.relative_to(ROOT)}")
    assert not missing, "modules without their test file:\n" + "\n".join(missing)


def test_modules_exempted_exist_and_still_have_no_test_file() -> None:
    for rel in NO_TEST_FILE:
        module = ROOT / rel
        assert module.is_file(), f"{rel} is exempted but does not exist: take it out of NO_TEST_FILE"
        expected = PACKAGES[module.parent.relative_to(ROOT).as_posix()] / f"test_{module.stem}.py"
        assert not expected.is_file(), f"{rel} has {expected.relative_to(ROOT)} now: take it out of NO_TEST_FILE"


def test_test_files_lie_in_the_mirrored_folders() -> None:
    allowed = set(PACKAGES.values()) | OTHER_TEST_FOLDERS
    stray = [path.relative_to(ROOT).as_posix() for path in TESTS.rglob("test_*.py") if path.parent not in allowed]
    assert not stray, f"test files outside the layout: {stray}"
    for folder in allowed:
        assert (folder / "__init__.py").is_file(), f"{folder.relative_to(ROOT)} needs an __init__.py"
