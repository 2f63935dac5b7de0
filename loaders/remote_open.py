"""Opening a shards pack at a URL: its listing, manifest and index, read as one pack and checked.

The manifest is read first (always from the store: it says which pack is there now), then the
index (from the cache when it holds this pack's, else fetched pinned to the version listed). What
was read is of one pack, or the open is made again from a new listing (a pack being written again
right now); each shard listed is checked against the manifest.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from packload.core.display import pack_phrase
from packload.core.errors import IncompletePackError, PackChangedError, PackFormatError, UsageError
from packload.core.format import (
    INDEX_NAME,
    MANIFEST_NAME,
    PROGRESS_NAME,
    check_entries_fit,
    check_parts_reached,
    decode_index,
    shard_number,
)
from packload.core.manifest import MANIFEST_LIMIT, Manifest, decode_manifest, shard_parts
from packload.core.remote import ObjectChangedError, RemoteMissingError, RemoteStore, content_matches_tag
from packload.loaders.read_cache import BlockCache, pack_folder_name
from packload.loaders.remote_pin import ChangedWhileOpening, PackPin

OPEN_ATTEMPTS = 3  # opens of a pack that changed while it was being opened, before giving up


@dataclass
class OpenedPack:
    """What an open of a shards pack at a URL read, all of one pack."""

    pin: PackPin  # the versions read, and the manifest's hash
    listed: dict[str, dict[str, Any]]  # the listing's own entries, by name
    manifest: Manifest
    key: str  # the cache's folder of this pack (by its manifest)
    part_names: list[str]
    part_sizes: np.ndarray  # int64, each shard's size as listed and as the manifest says
    index: bytes
    entries: np.ndarray
    paths: bytes


def open_pinned(store: RemoteStore, cache: BlockCache, listing: dict[str, int],
                manifest_head: bytes | None) -> OpenedPack:
    """The pack at ``store`` as ``listing`` (and ``manifest_head``, the manifest's bytes read with
    it, if any) found it; opened again from a new listing while what was read is not of one pack."""
    for _ in range(OPEN_ATTEMPTS):
        try:
            return _open(store, cache, listing, manifest_head)
        except ChangedWhileOpening:
            listing, manifest_head = store.listing(), None
    raise PackChangedError(f"{store.shown}: the pack changed while it was being opened (it is being packed "
                           "again?); open it again once it is written")


def _open(store: RemoteStore, cache: BlockCache, listing: dict[str, int], manifest_head: bytes | None) -> OpenedPack:
    tags = dict(store.tags)  # the version of each object, as this listing found it
    listed = dict(store.listed)
    if MANIFEST_NAME not in listing:
        _refuse_without_manifest(store, listing)
    size = listing[MANIFEST_NAME]
    tag = tags.get(MANIFEST_NAME)
    if size > MANIFEST_LIMIT:
        raw = b"x" * (MANIFEST_LIMIT + 1)  # refused as too large by decode_manifest
    elif manifest_head is not None and len(manifest_head) == size and \
            content_matches_tag(tag, manifest_head, listed.get(MANIFEST_NAME)) is not False:
        raw = manifest_head
    else:
        try:
            raw = store.read_range(MANIFEST_NAME, 0, size, tag)
        except ObjectChangedError:
            raise ChangedWhileOpening from None
    pin = PackPin(store, tags, hashlib.sha256(raw).hexdigest())
    manifest = decode_manifest(raw, store.shown_of(MANIFEST_NAME))
    if manifest.backend != "shards":
        raise PackFormatError(f"{store.shown_of(MANIFEST_NAME)}: manifest is for {pack_phrase(manifest.backend)}")
    key = pack_folder_name("pack", pin.manifest_sha256)
    part_names, sizes = _shard_list(store, manifest, listing, pin)
    part_sizes = np.array(sizes, dtype=np.int64)
    index = _read_index(store, cache, key, manifest, listing, pin)
    where = store.shown_of(INDEX_NAME)
    entries, paths = decode_index(index, where, manifest.records, sum(sizes))
    check_entries_fit(entries, part_sizes.astype(np.uint64), where)
    check_parts_reached(entries, part_sizes, part_names, store.shown)  # no tail to fetch
    return OpenedPack(pin, listed, manifest, key, part_names, part_sizes, index, entries, paths)


def _refuse_without_manifest(store: RemoteStore, listing: dict[str, int]) -> None:
    url = store.shown
    if not listing:
        if store.kind() is None:
            store.check_bucket()
            raise RemoteMissingError(f"{url}: no such pack (nothing is stored under it); give the URL "
                                     "`pack` wrote to")
    if PROGRESS_NAME in listing or any(shard_number(name) is not None for name in listing):
        raise IncompletePackError(f"{url}: no {MANIFEST_NAME}: this pack did not finish (or is being "
                                  "written now); pack it again, or wait for the pack to finish")
    raise UsageError(f"{url}: not a pack (no {MANIFEST_NAME}); give a shards folder that `pack` wrote")


def _shard_list(store: RemoteStore, manifest: Manifest, listing: dict[str, int],
                pin: PackPin) -> tuple[list[str], list[int]]:
    """The shards' names and sizes from the manifest, each checked against the store's listing."""
    parts = shard_parts(manifest, str(store.shown_of(MANIFEST_NAME)))
    names, sizes = [], []
    for part in parts:
        name = part["name"]
        if name not in listing or listing[name] != part.get("size"):
            pin.refuse_if_changed_while_opening()
        if name not in listing:
            raise PackFormatError(f"{store.shown_of(name)}: shard missing; the pack is incomplete, upload it again")
        if listing[name] != part.get("size"):
            raise PackFormatError(f"{store.shown_of(name)}: {listing[name]} bytes, the manifest says "
                                  f"{part.get('size')}; the shard is truncated or changed, upload it again")
        names.append(name)
        sizes.append(listing[name])
    return names, sizes


def _read_index(store: RemoteStore, cache: BlockCache, key: str, manifest: Manifest, listing: dict[str, int],
                pin: PackPin) -> bytes:
    """The index, from the cache when it holds this pack's (its record and sha256 checked), else
    fetched (pinned to the version listed) and kept there."""
    where = store.shown_of(INDEX_NAME)
    if INDEX_NAME not in listing:
        pin.refuse_if_changed_while_opening()
        raise PackFormatError(f"{where}: missing; the pack is incomplete, upload it again")
    size = listing[INDEX_NAME]
    expected = manifest.index
    if size == 0 or ("size" in expected and size != expected["size"]):
        pin.refuse_if_changed_while_opening()
        raise PackFormatError(f"{where}: {size} bytes, the manifest says {expected.get('size')}; the pack "
                              "is damaged")
    identity = f"{INDEX_NAME}\0{size}"
    cached = cache.read(key, identity, size)
    if cached is not None:
        data = bytes(cached)
        cached.close()
        if hashlib.sha256(data).hexdigest() == expected.get("sha256"):
            return data
    try:
        data = store.read_all(INDEX_NAME, size, pin.tags.get(INDEX_NAME))
    except ObjectChangedError:
        raise ChangedWhileOpening from None
    if hashlib.sha256(data).hexdigest() != expected.get("sha256"):
        pin.refuse_if_changed_while_opening()  # else damaged on the store: check_index says so
        return data
    cache.put(key, identity, data)
    return data
