"""An LMDB pack at a URL, fetched whole into the cache folder (LMDB needs a local file).

The object is fetched by ranged requests in flight at once, pinned to the version it has when the
fetch starts; the cache's entry of it is named by its URL, size and version, so a pack replaced at
the URL is fetched again, and the same version is fetched once across processes.
"""

from __future__ import annotations

import errno

from packload.core.errors import PackChangedError, UsageError
from packload.core.remote import ObjectChangedError, RemoteStore, tag_of
from packload.loaders.cache_folder import CacheUnusableError
from packload.loaders.read_cache import BlockCache, pack_folder_name


def fetch_lmdb(store: RemoteStore, cache: BlockCache) -> str:
    """The local path of the LMDB pack at ``store``: fetched whole into the cache, by ranged requests
    in flight at once pinned to the version it has now, unless the cache holds this very version
    (checked against its record). One process fetches it; others opening it meanwhile wait."""
    info = store.info()
    if info.get("type") == "directory":
        raise UsageError(f"{store.shown}: a folder without a pack manifest; give a shards pack or an .lmdb object")
    size = int(info["size"])
    tag = tag_of(info)
    version = tag or f"{info.get('LastModified') or info.get('mtime') or info.get('updated') or ''}"
    pack = pack_folder_name("lmdb", f"{store.url}\0{size}\0{version}")
    identity = f"lmdb\0{size}"
    found = cache.path(pack, identity, size)
    if found is not None:
        return str(found)
    problem = cache.problem()
    if problem:
        raise _cache_unusable(store, problem)
    if size + 4096 > cache.limit:
        raise UsageError(f"{store.shown}: an LMDB pack of {size:,} bytes does not fit the cache of "
                         f"{cache.limit:,} bytes at {cache.folder} (LMDB packs are fetched whole); raise "
                         "cache_limit, or pack the images as shards")
    free = cache.free_bytes()
    if free is not None and free < size:
        raise UsageError(f"{store.shown}: an LMDB pack of {size:,} bytes is fetched whole into the cache folder "
                         f"{cache.folder}, whose disk has {free:,} bytes free; free space there, or give cache_dir "
                         "a folder on a larger disk")
    try:
        fetching = cache.fetching(pack, identity)
    except CacheUnusableError as exc:  # e.g. a file of the user's where the pack's folder goes
        raise _cache_unusable(store, str(exc)) from None
    with fetching:
        found = cache.path(pack, identity, size)  # fetched meanwhile by another process
        if found is not None:
            return str(found)
        _download_into_cache(store, cache, pack, identity, size, tag)
    found = cache.path(pack, identity, size)
    if found is None:
        raise UsageError(f"{store.shown}: the cache at {cache.folder} made room for other files while the LMDB pack "
                         "was fetched; raise cache_limit and retry")
    return str(found)


def _cache_unusable(store: RemoteStore, why: str) -> UsageError:
    return UsageError(f"{store.shown}: an LMDB pack at a URL is fetched whole into the cache folder, and that "
                      f"cannot be used: {why}; give cache_dir (or PACKLOAD_CACHE) a folder you can write to")


def _download_into_cache(store: RemoteStore, cache: BlockCache, pack: str, identity: str, size: int,
                         tag: str | None) -> None:
    try:
        writing = cache.reserve(pack, identity, size)
    except OSError as exc:
        raise UsageError(f"{store.shown}: cannot keep the LMDB pack in the cache folder {cache.folder} "
                         f"({exc.strerror or exc}); give cache_dir a folder you can write to") from None
    try:
        store.download("", size, writing.fd, tag)
        writing.commit()
    except ObjectChangedError:
        writing.abort()
        raise PackChangedError(f"{store.shown}: the pack changed while it was fetched (it is being packed again?); "
                               "open it again once it is written") from None
    except OSError as exc:
        writing.abort()
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UsageError(f"{store.shown}: the cache folder {cache.folder} ran out of space while the LMDB pack was "
                             "fetched; free space there, or give cache_dir a folder on a larger disk") from None
        raise
    except BaseException:
        writing.abort()
        raise
