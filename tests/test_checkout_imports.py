"""The checkout imports as it stands, and builds as it should.

``packer/`` and ``loaders/`` are top-level folders of the repository and the packages
``packload.packer`` and ``packload.loaders`` once installed. Links inside ``packload/``
(``packload/packer -> ../packer``, ``packload/loaders -> ../loaders``) make the checkout's own
``packload/`` the whole package: from the repository root, ``import packload`` finds it first
whether packload is installed or not (and how), and it has every part; editors, type checkers and
structure viewers follow the links. A build packs the linked folders as plain ones: each module
lands in the wheel once, under ``packload/``, and the sdist holds folders, not links.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINKED = ("packer", "loaders")  # top-level folder -> packload/<folder>
# what a build reads: the project's metadata, its readme, and the package folders
BUILD_INPUTS = ("pyproject.toml", "setup.py", "README.md", "packload", *LINKED)
NOT_SOURCES = shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.egg-info", "build")

IMPORT_CHECK = """
import sys
sys.path += sys.argv[1:]  # the environment's packages, with no .pth file run: packload is not installed
assert not [f for f in sys.meta_path if "editable" in repr(f).lower()], sys.meta_path
import packload
missing = [name for name in packload.__all__ if getattr(packload, name, None) is None]
assert not missing, missing
import packload.loaders, packload.packer
print(packload.__file__, packload.loaders.__file__, packload.packer.__file__, packload.PackLoader.__module__)
"""


def checkout_modules(root: Path) -> set[str]:
    """The module files of packload in a checkout at ``root``, as paths inside the installed package."""
    found = {f"packload/{path.relative_to(root / 'packload')}" for path in (root / "packload").rglob("*.py")}
    for folder in LINKED:
        found |= {f"packload/{folder}/{path.relative_to(root / folder)}" for path in (root / folder).rglob("*.py")}
    return found


def test_the_links_lead_to_the_top_level_folders() -> None:
    for folder in LINKED:
        link = ROOT / "packload" / folder
        assert link.is_symlink(), f"packload/{folder} should be a link to ../{folder}"
        assert os.readlink(link) == f"../{folder}"  # relative: valid wherever the checkout lives
        assert link.resolve() == ROOT / folder


@pytest.mark.parametrize("how", ["from the root", "on PYTHONPATH"])
def test_the_checkout_imports_without_being_installed(how: str, tmp_path: Path) -> None:
    """``python -S`` runs no .pth file, so no install (editable or not) takes part: the checkout alone
    gives packload, its writer and reader sides, and every public name."""
    site_dirs = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    if how == "on PYTHONPATH":
        env["PYTHONPATH"] = str(ROOT)
    cwd = ROOT if how == "from the root" else tmp_path
    run = subprocess.run([sys.executable, "-S", "-c", IMPORT_CHECK, *sorted(site_dirs)], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    init, loaders, packer, loader_module = run.stdout.split()
    assert Path(init) == ROOT / "packload" / "__init__.py"
    assert Path(loaders) == ROOT / "packload" / "loaders" / "__init__.py"
    assert Path(packer) == ROOT / "packload" / "packer" / "__init__.py"
    assert loader_module == "packload.loaders.pack_loader"


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What a build reads, copied with its links (links kept as links), so that no build output
    lands in the checkout."""
    copy = tmp_path_factory.mktemp("checkout")
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, copy / name, symlinks=True, ignore=NOT_SOURCES)
        else:
            shutil.copy2(ROOT / name, copy / name)
    assert all((copy / "packload" / folder).is_symlink() for folder in LINKED)
    return copy


def build(hook: str, source: Path, out: Path) -> Path:
    """Run setuptools' PEP 517 ``hook`` in ``source`` and return what it made in ``out``. The C kernels
    are optional and left out (no compiler: CC=false): the Python packages are what is checked here."""
    out.mkdir()
    code = f"from setuptools import build_meta; print(build_meta.{hook}({str(out)!r}))"
    env = dict(os.environ, CC="false")
    run = subprocess.run([sys.executable, "-c", code], cwd=source, env=env, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    return out / run.stdout.split()[-1]


def test_the_wheel_holds_each_module_once_under_packload(source_copy: Path, tmp_path: Path) -> None:
    wheel = build("build_wheel", source_copy, tmp_path / "wheel")
    names = zipfile.ZipFile(wheel).namelist()
    assert len(names) == len(set(names))
    [metadata] = {name.split("/")[0] for name in names} - {"packload"}  # nothing else at the top
    assert metadata.endswith(".dist-info")
    assert {name for name in names if name.endswith(".py")} == checkout_modules(source_copy)
    assert "packload/loaders/pack_loader.py" in names and "packload/packer/pipeline.py" in names


def test_the_sdist_holds_plain_folders_and_builds_the_same_wheel(source_copy: Path, tmp_path: Path) -> None:
    sdist = build("build_sdist", source_copy, tmp_path / "sdist")
    with tarfile.open(sdist) as tar:
        members = tar.getmembers()
        assert all(member.isfile() or member.isdir() for member in members), \
            [member.name for member in members if member.issym() or member.islnk()]
        tar.extractall(tmp_path / "unpacked", filter="data")
    [unpacked] = (tmp_path / "unpacked").iterdir()
    assert not any((unpacked / "packload" / folder).is_symlink() for folder in LINKED)
    assert {f"packload/{p.relative_to(unpacked / 'packload')}" for p in (unpacked / "packload").rglob("*.py")} \
        == checkout_modules(source_copy)
    wheel = build("build_wheel", unpacked, tmp_path / "wheel")
    assert {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")} \
        == checkout_modules(source_copy)
