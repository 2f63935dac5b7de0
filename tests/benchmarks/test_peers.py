"""Round-trip checks for the benchmark peer adapters (benchmarks/peers.py).

Peers that are not installed are skipped with the reason from ``unavailable()``; the ImageFolder
baseline needs nothing extra and always runs.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.utils.data as tud
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.peers import PEERS, Sample  # noqa: E402

CLASSES = ("cat", "dog", "eel")
PER_CLASS = 5


def _identity(b: bytes) -> bytes:
    return b


def _collate(batch: list[Any]) -> list[Any]:
    return batch


def _read_all(loader: tud.DataLoader) -> Counter[tuple[bytes, int]]:
    """Multiset of (image bytes, label) from a loader; the adapter must hand back real bytes and ints."""
    items = [item for batch in loader for item in batch]
    assert all(type(img) is bytes and isinstance(label, int) for img, label in items)
    return Counter((img, int(label)) for img, label in items)


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> list[Sample]:
    """3 classes x 5 images, a mix of JPEG and PNG, in ImageFolder order (sorted classes, sorted files)."""
    root = tmp_path_factory.mktemp("imagefolder")
    rng = np.random.default_rng(0)
    for cls in CLASSES:
        (root / cls).mkdir()
        for i in range(PER_CLASS):
            pixels = rng.integers(0, 256, size=(24 + i, 32, 3), dtype=np.uint8)
            ext = "png" if i % 2 else "jpg"
            Image.fromarray(pixels).save(root / cls / f"img{i:02d}.{ext}")
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir())
    return [(f, idx) for idx, d in enumerate(class_dirs) for f in sorted(d.iterdir())]


@pytest.mark.parametrize("name", sorted(PEERS))
def test_peer_round_trip(name: str, image_folder: list[Sample], tmp_path: Path) -> None:
    peer = PEERS[name]()
    reason = peer.unavailable()
    if reason is not None:
        pytest.skip(reason)
    assert peer.name == name

    out = tmp_path / name
    peer.write(image_folder, out)
    expected = Counter((p.read_bytes(), label) for p, label in image_folder)
    assert len(expected) == len(image_folder)

    for workers in (0, 2):
        ds = peer.dataset(out, _identity)
        loader = tud.DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=_collate)
        assert _read_all(loader) == expected, f"{name} with num_workers={workers}"


@pytest.mark.parametrize("name", sorted(PEERS))
def test_peer_spawn_workers(name: str, image_folder: list[Sample], tmp_path: Path) -> None:
    """Datasets also survive pickling into spawned workers (macOS default, or a harness's choice)."""
    peer = PEERS[name]()
    reason = peer.unavailable()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / name
    peer.write(image_folder, out)
    loader = tud.DataLoader(
        peer.dataset(out, _identity),
        batch_size=4,
        num_workers=2,
        collate_fn=_collate,
        multiprocessing_context="spawn",
    )
    assert _read_all(loader) == Counter((p.read_bytes(), label) for p, label in image_folder)
