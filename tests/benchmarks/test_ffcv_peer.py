"""The FFCV benchmark adapter (benchmarks/ffcv_peer.py).

FFCV is benchmark-only and not installed in CI: there, only the "not installed" checks run and the
round trips skip with the adapter's reason. With FFCV installed (the peer venv), a tiny generated
folder goes through a ``.beton`` and back.
"""

from __future__ import annotations

import builtins
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import ffcv_peer  # noqa: E402

REASON = ffcv_peer.unavailable()
needs_ffcv = pytest.mark.skipif(REASON is not None, reason=f"FFCV {REASON}")
# Each FFCV Loader compiles fresh numba functions; when an old one is garbage-collected, numba's
# dispatcher finalizer may raise a KeyError that Python can only print ("unraisable"). Harmless.
numba_gc_noise = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

CLASSES = ("ant", "bee", "cat")


def test_module_imports_without_ffcv() -> None:
    """Importing the adapter must not import FFCV (it is optional and heavy)."""
    source = Path(ffcv_peer.__file__).read_text()
    top_level = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert not [line for line in top_level if "ffcv" in line]


def test_reports_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ffcv unimportable, ``unavailable()`` says so, with the reason and the recipe, and raises nothing."""
    real_import = builtins.__import__

    def no_ffcv(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "ffcv" or name.startswith("ffcv."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    for name in [m for m in sys.modules if m == "ffcv" or m.startswith("ffcv.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(builtins, "__import__", no_ffcv)
    reason = ffcv_peer.unavailable()
    assert reason is not None and reason.startswith("not installed (ffcv: ImportError")
    assert "pip install --no-deps ffcv==1.0.2" in reason


def _folder(root: Path, sizes: list[tuple[int, int]], per_class: int = 4) -> Path:
    """``CLASSES`` x ``per_class`` random RGB PNGs, sizes cycling through ``sizes`` (h, w)."""
    rng = np.random.default_rng(0)
    for cls in CLASSES:
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            h, w = sizes[i % len(sizes)]
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / cls / f"{i:03d}.png")
    return root


@needs_ffcv
@numba_gc_noise
@pytest.mark.parametrize("order", ["sequential", "random"])
def test_raw_round_trip(tmp_path: Path, order: str) -> None:
    """raw mode: every record comes back once, with its label and its exact pixels (BHWC uint8)."""
    src = _folder(tmp_path / "src", [(32, 32)])
    beton = tmp_path / "out" / "data.beton"
    w = ffcv_peer.write(src, beton, mode="raw", workers=2)
    assert w["samples"] == len(CLASSES) * 4 and w["bytes"] == beton.stat().st_size > 0

    r = ffcv_peer.read(beton, batch_size=5, workers=1, order=order, epochs=1)
    assert r["images_per_epoch"] == 12  # drop_last=False: the short last batch counts
    assert r["batch_shape"] == [5, 32, 32, 3] and r["batch_dtype"] == "torch.uint8"
    assert r["label_shape"] == [5, 1] and r["label_dtype"] == "torch.int64"

    items = ffcv_peer.samples(src)
    images, labels = ffcv_peer.pixels(beton, list(range(len(items))))
    assert labels.tolist() == [label for _, label in items] == [0] * 4 + [1] * 4 + [2] * 4
    for (path, _), img in zip(items, images, strict=True):
        np.testing.assert_array_equal(img, np.asarray(Image.open(path)))


@needs_ffcv
@numba_gc_noise
def test_jpg_center_crop(tmp_path: Path) -> None:
    """jpg mode with max_resolution on mixed sizes: long side bounded, 224x224 crops, labels kept."""
    src = _folder(tmp_path / "src", [(300, 400), (200, 120), (256, 256)], per_class=3)
    beton = tmp_path / "data.beton"
    ffcv_peer.write(src, beton, mode="jpg", max_resolution=256, quality=90, workers=1)
    meta = ffcv_peer.stored(beton)
    assert set(meta["mode"]) == {"jpg"}
    assert meta["height"][:3].tolist() == [192, 200, 256] and meta["width"][:3].tolist() == [256, 120, 256]

    r = ffcv_peer.read(beton, batch_size=4, workers=1, crop=224, epochs=1)
    assert r["images_per_epoch"] == 9 and r["batch_shape"] == [4, 224, 224, 3]
    images, labels = ffcv_peer.pixels(beton, [8, 0, 4], crop=224)
    assert images.shape == (3, 224, 224, 3) and images.dtype == np.uint8
    assert labels.tolist() == [2, 0, 1]
