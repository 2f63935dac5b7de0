"""packload: pack folders of small images into one LMDB file or a folder of shards, and read them in
PyTorch at the speed of the disk.

    import packload
    packload.pack("./images", "./train.shards")
    ds = packload.PackedImageFolder("./train.shards", transform=tf)      # as ImageFolder
    loader = packload.PackLoader(ds, 256, crop=packload.CenterCrop(224))  # whole uint8 batches

The names below are the public surface. Each is imported from its module on first use, so that the
``pack`` command starts without importing torch (the readers need it, the writer does not).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from packload.core.errors import (
    ChecksumError,
    IncompletePackError,
    PackChangedError,
    PackFormatError,
    PackloadError,
    SkippedFileError,
    SplitTwiceError,
    UsageError,
    WriteError,
)
from packload.core.version import __version__

# Public name -> the module that defines it.
_EXPORTS = {
    "pack": "packload.packer.pipeline",
    "pack_ray": "packload.packer.ray_engine",
    "EncodeOptions": "packload.packer.encode",
    "merge": "packload.merger",
    "PackedImageFolder": "packload.loaders.dataset",
    "PackLoader": "packload.loaders.pack_loader",
    "PackReader": "packload.loaders.read",
    "PackSampler": "packload.loaders.sampler",
    "mix": "packload.loaders.mix",
    "MixedPacks": "packload.loaders.mix",
    "MixSampler": "packload.loaders.mix_sampler",
    "shuffle_quality": "packload.loaders.shuffle_quality",
    "CenterCrop": "packload.loaders.crop",
    "RandomResizedCrop": "packload.loaders.random_crop",
    "PackBatches": "packload.loaders.batches",
    "batch_loader": "packload.loaders.batches",
    "collate_uint8": "packload.loaders.collate",
    "fast_jpeg_available": "packload.loaders.decode",
    "info": "packload.loaders.verify",
    "verify": "packload.loaders.verify",
    "unpack": "packload.loaders.unpack",
    "tune": "packload.diagnose.tune",
    "TuneResult": "packload.diagnose.tune",
    "load_loader_config": "packload.diagnose.loader_config",
    "doctor": "packload.diagnose.doctor",
    "DummyStep": "packload.diagnose.gpu_step",
    "watch": "packload.diagnose.watch",
}

__all__ = [
    "CenterCrop",
    "ChecksumError",
    "DummyStep",
    "EncodeOptions",
    "IncompletePackError",
    "MixSampler",
    "MixedPacks",
    "PackBatches",
    "PackChangedError",
    "PackFormatError",
    "PackLoader",
    "PackReader",
    "PackSampler",
    "PackedImageFolder",
    "PackloadError",
    "RandomResizedCrop",
    "SkippedFileError",
    "SplitTwiceError",
    "TuneResult",
    "UsageError",
    "WriteError",
    "__version__",
    "batch_loader",
    "collate_uint8",
    "doctor",
    "fast_jpeg_available",
    "info",
    "load_loader_config",
    "merge",
    "mix",
    "pack",
    "pack_ray",
    "shuffle_quality",
    "tune",
    "unpack",
    "verify",
    "watch",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'packload' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups find it directly
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from packload.diagnose.doctor import doctor
    from packload.diagnose.gpu_step import DummyStep
    from packload.diagnose.loader_config import load_loader_config
    from packload.diagnose.tune import TuneResult, tune
    from packload.diagnose.watch import watch
    from packload.loaders.batches import PackBatches, batch_loader
    from packload.loaders.collate import collate_uint8
    from packload.loaders.crop import CenterCrop
    from packload.loaders.dataset import PackedImageFolder
    from packload.loaders.decode import fast_jpeg_available
    from packload.loaders.mix import MixedPacks, mix
    from packload.loaders.mix_sampler import MixSampler
    from packload.loaders.pack_loader import PackLoader
    from packload.loaders.random_crop import RandomResizedCrop
    from packload.loaders.read import PackReader
    from packload.loaders.sampler import PackSampler
    from packload.loaders.shuffle_quality import shuffle_quality
    from packload.loaders.unpack import unpack
    from packload.loaders.verify import info, verify
    from packload.merger import merge
    from packload.packer.encode import EncodeOptions
    from packload.packer.pipeline import pack
    from packload.packer.ray_engine import pack_ray
