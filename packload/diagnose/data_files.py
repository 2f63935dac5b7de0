"""The files a dataset reads, and how much of them the page cache holds: what lets ``tune`` say whether
the data came from memory or from storage, instead of guessing."""

from __future__ import annotations

from typing import Any

from packload.core.remote import is_url
from packload.diagnose.page_cache import resident_fraction
from packload.diagnose.stall import pack_files
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.folder import FolderImages


def dataset_files(dataset: Any) -> list[str] | None:
    """The local files ``dataset`` reads: a pack's files, an image folder's images (through a
    ``Subset``'s ``dataset`` too); None for any other dataset or a pack at a URL."""
    if isinstance(dataset, PackedImageFolder):
        return None if is_url(dataset.root) else pack_files(dataset.root)
    if isinstance(dataset, FolderImages):
        return [path for path, _ in dataset.samples]
    inner = getattr(dataset, "dataset", None)
    return dataset_files(inner) if inner is not None and inner is not dataset else None


def cached_share(files: list[str] | None) -> float | None:
    """The share of ``files``' pages in the page cache (a sample of them); None when unknown."""
    if not files:
        return None
    try:
        return resident_fraction(files)
    except OSError:  # no mincore here
        return None
