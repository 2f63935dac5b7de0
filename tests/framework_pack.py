"""Helpers (not tests) for the framework tests: a tiny pack whose every image carries its own id, and
the check that an epoch over several ranks saw every image exactly once, in equal shares.

Each image is one flat colour whose red level is its id (PNG, so the id survives packing and
decoding exactly): ``ids_of(images)`` reads the ids back from a uint8 batch (B×3×H×W).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from packload import EncodeOptions, pack

NUM_IMAGES = 60
CLASSES = ("a", "b", "c")
SIDE = 8


def make_id_pack(root: Path) -> Path:
    """Write NUM_IMAGES images (ids 0..NUM_IMAGES-1, three classes) and pack them raw; return the pack."""
    source = root / "src"
    for image_id in range(NUM_IMAGES):
        folder = source / CLASSES[image_id % len(CLASSES)]
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.zeros((SIDE, SIDE, 3), dtype=np.uint8)
        pixels[..., 0] = image_id
        pixels[..., 1] = 255 - image_id  # not a grey image
        Image.fromarray(pixels).save(folder / f"img_{image_id:03d}.png")
    dst = root / "ids.shards"
    pack(source, dst, options=EncodeOptions(encoding="raw"), workers=1, progress=False, shard_size=1 << 16)
    return dst


def ids_of(images: torch.Tensor) -> list[int]:
    """The ids of a uint8 batch (B×3×H×W, any memory format) of images made by ``make_id_pack``."""
    return images[:, 0, 0, 0].tolist()


def write_seen(out_dir: Path, rank: int, seen: dict) -> None:
    """Write what one rank saw (``{loader: {epoch: [ids...]}}``) as JSON for the test to gather."""
    Path(out_dir, f"seen{rank}.json").write_text(json.dumps(seen))


def read_seen(out_dir: Path, world_size: int) -> list[dict]:
    """Every rank's ``write_seen`` record, rank 0 first."""
    return [json.loads(Path(out_dir, f"seen{rank}.json").read_text()) for rank in range(world_size)]


def check_epoch(per_rank: list[list[int]], padded: int = 0) -> None:
    """Assert that the ranks' ids of one epoch cover every image, each exactly once apart from
    ``padded`` repeats (padding to equal shares), and that every rank saw as many as the others."""
    counts = [len(ids) for ids in per_rank]
    assert len(set(counts)) == 1, f"unequal counts per rank: {counts}"
    seen = Counter(i for ids in per_rank for i in ids)
    assert set(seen) == set(range(NUM_IMAGES)), f"missing ids: {sorted(set(range(NUM_IMAGES)) - set(seen))}"
    assert sum(counts) == NUM_IMAGES + padded, f"{sum(counts)} samples for {NUM_IMAGES} images: {seen}"
