"""Which backend a pack needs, and opening it: a local shards folder or LMDB file, or a pack at a URL
(a shards pack read through the cache folder, an LMDB object fetched whole into it first)."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from packload.core.errors import IncompletePackError, UsageError
from packload.core.format import MANIFEST_NAME, PARTIAL_SUFFIX
from packload.core.manifest import MANIFEST_LIMIT
from packload.core.remote import RemoteStore
from packload.loaders.prefetch import ParallelFetcher
from packload.loaders.read_backend import PackBackend
from packload.loaders.read_cache import BlockCache
from packload.loaders.read_lmdb import LmdbPack
from packload.loaders.read_remote import RemoteShardsPack
from packload.loaders.read_shards import ShardsPack
from packload.loaders.remote_lmdb import fetch_lmdb


def detect_backend(path: Path) -> str:
    """``shards`` for a folder, ``lmdb`` for a file; clear errors for anything else."""
    if path.is_dir():
        return "shards"
    if path.is_file():
        return "lmdb"
    partial = path.with_name(path.name + PARTIAL_SUFFIX)
    if partial.exists():
        raise IncompletePackError(f"{path}: not found, but an unfinished pack is at {partial}; "
                                  "finish it with `pack SRC DEST --resume`")
    if path.exists():
        raise UsageError(f"{path}: not a file or folder (a FIFO, device or socket?); give the .lmdb file or "
                         "shards folder that `pack` wrote")
    raise UsageError(f"{path}: no such pack; give the .lmdb file or shards folder that `pack` wrote")


def open_local(path: Path, backend: str, fetcher: ParallelFetcher) -> PackBackend:
    """The pack at ``path`` (``backend``: ``detect_backend``'s), reading ahead through ``fetcher``."""
    opener = ShardsPack if backend == "shards" else LmdbPack
    return opener(path, fetcher)


def open_at_url(url: str, fetcher: ParallelFetcher, cache_dir: str | os.PathLike[str] | None,
                cache_limit: int | None, block_size: int, storage_options: dict[str, Any] | None,
                timeout: float | None) -> tuple[str, PackBackend, Path | None]:
    """(backend, the open pack, the local file of an LMDB pack) of the pack at ``url``: a shards pack
    read in ranged requests of ``block_size`` bytes through the cache folder ``cache_dir`` (at most
    ``cache_limit`` bytes), an LMDB pack fetched whole into it first."""
    store = RemoteStore(url, storage_options, timeout)
    cache = BlockCache(cache_dir, cache_limit)
    # One listing tells a shards pack (its folder holds a manifest) without asking what the URL is
    # first, and the manifest is read while the folder is listed: round trips saved on every open,
    # in every DataLoader worker.
    listing, manifest_head = _listing_and_manifest(store)
    if MANIFEST_NAME not in listing and store.kind() == "object":
        local = Path(fetch_lmdb(store, cache))
        return "lmdb", LmdbPack(local, fetcher), local
    return "shards", RemoteShardsPack(store, cache, block_size, listing, manifest_head), None


def _listing_and_manifest(store: RemoteStore) -> tuple[dict[str, int], bytes | None]:
    """The listing of a pack's folder, and its manifest's bytes read at the same time (None where
    there is none to read: an LMDB object, a missing pack; the listing then says what it is)."""
    def manifest() -> bytes | None:
        try:
            return store.read_head(MANIFEST_NAME, MANIFEST_LIMIT + 1)
        except Exception:  # noqa: BLE001 - the listing, read next, decides and names the problem
            return None

    with ThreadPoolExecutor(1, thread_name_prefix="packload-manifest") as pool:
        head = pool.submit(manifest)
        listing = store.listing()
        return listing, head.result()
