"""packload's reader side: datasets, samplers and batch helpers over a pack.

``PackedImageFolder(path)`` is a drop-in for torchvision's ``ImageFolder``; ``ds.sampler()`` keeps
reads sequential while shuffling well.
"""

from __future__ import annotations

from .batches import PackBatches, batch_loader
from .collate import collate_uint8
from .dataset import PackedImageFolder
from .decode import fast_jpeg_available
from .read import PackReader
from .sampler import PackSampler, shuffle_quality

__all__ = [
    "PackBatches",
    "PackReader",
    "PackSampler",
    "PackedImageFolder",
    "batch_loader",
    "collate_uint8",
    "fast_jpeg_available",
    "shuffle_quality",
]
