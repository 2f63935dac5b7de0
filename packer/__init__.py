"""packload's writer side: turn a folder of images into a pack (an LMDB file or shards folder).

``pack(src, dst)`` is the whole job (``pack_ray`` the same on Ray tasks, ``merge`` joins packs);
``packer.format`` defines what it writes.
"""

from __future__ import annotations

from .encode import EncodeOptions  # noqa: E402
from .errors import (  # noqa: E402
    ChecksumError,
    IncompletePackError,
    PackFormatError,
    PackloadError,
    SkippedFileError,
    UsageError,
    WriteError,
)
from .merge import merge  # noqa: E402
from .pipeline import pack  # noqa: E402
from .ray_engine import pack_ray  # noqa: E402
from .version import __version__

__all__ = [
    "ChecksumError",
    "EncodeOptions",
    "IncompletePackError",
    "PackFormatError",
    "PackloadError",
    "SkippedFileError",
    "UsageError",
    "WriteError",
    "__version__",
    "merge",
    "pack",
    "pack_ray",
]
