"""packload's writer side: turn a folder of images into a pack (an LMDB file or shards folder).

``pack(src, dst)`` is the whole job, ``pack_ray`` the same on Ray tasks; ``packload.core.format``
defines what they write.
"""

from __future__ import annotations

from packload.packer.encode import EncodeOptions
from packload.packer.pipeline import pack
from packload.packer.ray_engine import pack_ray

__all__ = ["EncodeOptions", "pack", "pack_ray"]
