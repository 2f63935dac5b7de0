"""packload's reader side: datasets, samplers and batch helpers over a pack.

``PackedImageFolder(path)`` is a drop-in for torchvision's ``ImageFolder``; ``ds.sampler()`` keeps
reads sequential while shuffling well.
"""

from __future__ import annotations

from .batches import PackBatches, batch_loader
from .collate import collate_uint8
from .crop import CenterCrop
from .dataset import PackedImageFolder
from .decode import fast_jpeg_available
from .gpu_step import DummyStep
from .pack_loader import PackLoader
from .read import PackReader
from .sampler import PackSampler, shuffle_quality
from .tune import TuneResult, load_loader_config, tune

__all__ = [
    "CenterCrop",
    "DummyStep",
    "PackBatches",
    "PackLoader",
    "PackReader",
    "PackSampler",
    "PackedImageFolder",
    "batch_loader",
    "collate_uint8",
    "fast_jpeg_available",
    "TuneResult",
    "load_loader_config",
    "shuffle_quality",
    "tune",
]
