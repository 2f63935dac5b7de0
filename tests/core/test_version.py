"""The version is written once (``packload/core/version.py``): the installed distribution, the package,
the command line and new manifests all give it."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import packload
from packload.core.manifest import build_manifest


def test_one_version_everywhere() -> None:
    assert importlib.metadata.version("packload") == packload.__version__
    shown = subprocess.run([sys.executable, "-m", "packload", "--version"], capture_output=True, text=True, timeout=60)
    assert packload.__version__ in shown.stdout + shown.stderr
    import numpy as np

    manifest = build_manifest(backend="shards", encoding="keep", source={}, labelled=False, classes=[],
                              labels=np.zeros(0, np.int64), payload_bytes=0, skipped=[], ignored=[], options={})
    assert manifest["packload_version"] == packload.__version__
