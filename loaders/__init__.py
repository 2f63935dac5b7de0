"""packload's reader side: datasets, samplers and batch helpers over a pack.

``PackedImageFolder(path)`` is a drop-in for torchvision's ``ImageFolder``; ``ds.sampler()`` keeps
reads sequential while shuffling well; ``PackLoader`` builds whole batches in threads.
"""

from __future__ import annotations

from packload.loaders.batches import PackBatches, batch_loader
from packload.loaders.collate import collate_uint8
from packload.loaders.crop import CenterCrop
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.decode import fast_jpeg_available
from packload.loaders.pack_loader import PackLoader
from packload.loaders.random_crop import RandomResizedCrop
from packload.loaders.read import PackReader
from packload.loaders.sampler import PackSampler
from packload.loaders.shuffle_quality import shuffle_quality

__all__ = [
    "CenterCrop",
    "PackBatches",
    "PackLoader",
    "PackReader",
    "PackSampler",
    "PackedImageFolder",
    "RandomResizedCrop",
    "batch_loader",
    "collate_uint8",
    "fast_jpeg_available",
    "shuffle_quality",
]
