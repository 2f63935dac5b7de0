"""The public surface of ``packload`` (``packload/__init__.py``): every name resolves to the object
its module defines, on first use, so that packing never imports torch."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import packload
from tests.image_factory import make_image_folder
from tests.reliability.packs import REPO, child_env


def test_every_public_name_is_its_modules_object() -> None:
    from packload.core import errors

    assert set(packload._EXPORTS) < set(packload.__all__)
    for name, module in packload._EXPORTS.items():
        assert getattr(packload, name) is getattr(importlib.import_module(module), name), name
    for name in set(packload.__all__) - set(packload._EXPORTS) - {"__version__"}:  # the errors, imported at once
        assert getattr(packload, name) is getattr(errors, name), name
    assert dir(packload) == packload.__all__
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        packload.nothing_here  # noqa: B018 - the lookup is the test


def test_packing_imports_no_torch(tmp_path: Path) -> None:
    """``pack`` from the top-level name, in a fresh interpreter: the pack is written and torch was
    never imported (the command starts fast)."""
    make_image_folder(tmp_path / "src", classes=("a", "b"), per_class=2, seed=3)
    script = ("import json, sys, packload\n"
              "summary = packload.pack(sys.argv[1], sys.argv[2], workers=1, progress=False)\n"
              "print(json.dumps({'records': summary['records'], 'torch': 'torch' in sys.modules}))")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "src"), str(tmp_path / "p.shards")],
                          cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"records": 4, "torch": False}
    assert (tmp_path / "p.shards" / "manifest.json").is_file()
