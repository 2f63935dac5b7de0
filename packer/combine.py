"""Join already-written records into one pack without re-encoding: used by ``merge`` and by the
Ray engine.

A shard can be reused as it is only where nothing in it changes. Otherwise it is moved or copied,
then patched in place: the shard header's part number, and in each record header the record
number and (when classes are remapped) the label, with the header CRC recomputed; the payload
bytes never change. Records can also be copied one by one into any writer (an LMDB destination,
or an LMDB source).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packload.core.errors import PackFormatError
from packload.core.file_hash import HASH_BLOCK, sha256_file
from packload.core.format import (
    HEADER_BODY_AT,
    HEADER_CRC_AT,
    I32,
    INDEX_ENTRY,
    PAYLOAD_FORMATS,
    RECORD_HEADER,
    RECORD_LABEL_AT,
    RECORD_MAGIC,
    RECORD_NUMBER_AT,
    SHARD_HEADER,
    SHARD_PART_AT,
    U32,
    U64,
    decode_shard_header,
    encode_index,
    shard_name,
)
from packload.packer.encode import Encoded

_HEAD = RECORD_HEADER.itemsize


@dataclass
class ShardSource:
    """Shards written elsewhere, to become parts of a new pack: their folder, their manifest
    entries (``name``, ``size``, ``sha256``, ``records``), their index and a label map
    (``label_map[old] == new``; None keeps the labels)."""

    folder: Path
    parts: list[dict[str, Any]]
    entries: np.ndarray
    paths: bytes
    label_map: np.ndarray | None = None

    def mapped_labels(self) -> np.ndarray:
        """The labels the records get in the new pack (-1 stays -1)."""
        labels = self.entries["label"].astype(np.int64)
        if self.label_map is None:
            return labels
        return np.where(labels >= 0, self.label_map[np.maximum(labels, 0)], labels)


def label_map(old: list[str], new: list[str]) -> np.ndarray | None:
    """``old`` class indices → indices into ``new`` (a superset); None when nothing moves."""
    position = {name: i for i, name in enumerate(new)}
    mapping = np.array([position[name] for name in old], dtype=np.int64)
    return None if np.array_equal(mapping, np.arange(len(old))) else mapping


def _patch_shard(path: Path, part: int, rows: np.ndarray, first_record: int, new_first: int,
                 mapping: np.ndarray | None, check: bool = True) -> str:
    """Renumber shard ``path`` in place as part ``part`` whose records start at ``new_first``
    (they were numbered from ``first_record``), mapping labels; return its new SHA-256. With
    ``check`` each header is checked (magic, CRC, number) before it is rewritten."""
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as data:
        if decode_shard_header(data[: SHARD_HEADER.itemsize]) is None:
            raise PackFormatError(f"{path}: not a packload shard; the pack is damaged")
        U32.pack_into(data, SHARD_PART_AT, part)
        offsets, path_lens = rows["record_offset"].tolist(), rows["path_len"].tolist()
        for i, (offset, path_len) in enumerate(zip(offsets, path_lens, strict=True)):
            end = offset + _HEAD + path_len
            body = bytearray(data[offset + HEADER_BODY_AT : end])
            if check and (data[offset : offset + len(RECORD_MAGIC)] != RECORD_MAGIC
                          or U64.unpack_from(body, RECORD_NUMBER_AT - HEADER_BODY_AT)[0] != first_record + i
                          or zlib.crc32(body) != U32.unpack_from(data, offset + HEADER_CRC_AT)[0]):
                raise PackFormatError(f"{path}: record header at offset {offset} is damaged; "
                                      "run `packload verify` on this pack and copy or re-pack it")
            U64.pack_into(body, RECORD_NUMBER_AT - HEADER_BODY_AT, new_first + i)
            if mapping is not None:
                label, = I32.unpack_from(body, RECORD_LABEL_AT - HEADER_BODY_AT)
                if label >= 0:
                    I32.pack_into(body, RECORD_LABEL_AT - HEADER_BODY_AT, int(mapping[label]))
            data[offset + HEADER_CRC_AT : end] = U32.pack(zlib.crc32(body)) + body
        data.flush()
        digest = hashlib.sha256(data).hexdigest()
        os.fsync(f.fileno())
    return digest




def _copy_hashed(src: Path, dst: Path) -> str:
    """Copy ``src`` to a new file ``dst`` (durable on return); the SHA-256 of the bytes copied."""
    digest = hashlib.sha256()
    with open(src, "rb") as source, open(dst, "xb") as target:
        while block := source.read(HASH_BLOCK):
            digest.update(block)
            target.write(block)
        target.flush()
        os.fsync(target.fileno())
    return digest.hexdigest()


def _link_or_copy(src: Path, dst: Path) -> str:
    """Hard-link ``src`` as ``dst`` (copied across file systems); the SHA-256 of what ``dst`` holds."""
    try:
        os.link(src, dst)
    except OSError:  # another file system: a copy, durable before any manifest names it
        return _copy_hashed(src, dst)
    return sha256_file(dst)


def place_shards(source: ShardSource, out: Path, part_base: int, record_base: int,
                 move: bool = False) -> list[dict[str, Any]]:
    """Put ``source``'s shards into ``out`` as parts ``part_base``, ``part_base + 1``, … holding
    records from ``record_base`` on. ``move`` renames the files (they are ours to change, just
    written: they are not checked again; a shard already moved by an interrupted placement is
    renumbered again, which gives the same bytes); otherwise a shard that needs no change is hard-linked
    (copied across file systems) and any other is copied and patched, so the source pack is never
    modified, and each one's SHA-256 (of the link, or of the bytes as they are copied) must be the
    one in the source's manifest: ``PackFormatError`` names a damaged shard. Returns the new
    manifest entries."""
    placed = []
    first = 0
    bounds = np.searchsorted(source.entries["part"], np.arange(len(source.parts) + 1))  # parts ascend
    for k, part in enumerate(source.parts):
        rows = source.entries[bounds[k] : bounds[k + 1]]
        src, dst = source.folder / part["name"], out / shard_name(part_base + k)
        unchanged = part_base + k == k and record_base == 0 and source.label_map is None
        if move:
            unchanged = unchanged and bool(part.get("sha256"))  # written unhashed: hash it when patching
            if os.path.exists(src) or not os.path.exists(dst):  # a placement resumed finds some moved already
                os.replace(src, dst)
        else:
            digest = _link_or_copy(src, dst) if unchanged else _copy_hashed(src, dst)
            if digest != part.get("sha256"):
                raise PackFormatError(f"{src}: sha256 differs from the manifest; the pack is damaged: run "
                                      f"`packload verify {source.folder}`, then re-copy or re-pack it")
        sha = part["sha256"] if unchanged else _patch_shard(
            dst, part_base + k, rows, first, record_base + first, source.label_map, check=not move)
        placed.append({"name": dst.name, "records": int(len(rows)), "sha256": sha, "size": dst.stat().st_size})
        first += len(rows)
    return placed


def joined_index(sources: Iterable[ShardSource], part_bases: Iterable[int]) -> tuple[bytes, np.ndarray]:
    """The index of the joined pack (parts renumbered, labels mapped, paths concatenated), and the
    labels of all its records."""
    tables, blobs = [], []
    paths_len = 0
    for source, base in zip(sources, part_bases, strict=True):
        table = np.array(source.entries, dtype=INDEX_ENTRY, copy=True)
        table["part"] += base
        table["label"] = source.mapped_labels()
        table["path_offset"] += paths_len
        tables.append(table)
        blobs.append(source.paths)
        paths_len += len(source.paths)
    entries = np.concatenate(tables) if tables else np.zeros(0, INDEX_ENTRY)
    return encode_index(entries, b"".join(blobs)), entries["label"].astype(np.int64)


def copy_records(entries: np.ndarray, paths: bytes, payload: Callable[[int], Any], write: Callable[[Encoded], None],
                 mapping: np.ndarray | None = None) -> int:
    """Hand every record to ``write`` (a backend writer's ``write``) in order, payload bytes as
    stored, labels mapped; returns the payload bytes copied. ``payload(i)`` gives record ``i``'s."""
    copied = 0
    columns = {name: entries[name].tolist() for name in
               ("label", "width", "height", "format", "orientation", "mode", "path_offset", "path_len",
                "payload_crc32")}
    for i in range(len(entries)):
        label = columns["label"][i]
        if mapping is not None and label >= 0:
            label = int(mapping[label])
        start = columns["path_offset"][i]
        data = bytes(payload(i))
        write(Encoded(path=paths[start : start + columns["path_len"][i]].decode("utf-8"), label=label,
                      payload=data, width=columns["width"][i], height=columns["height"][i],
                      mode=columns["mode"][i].rstrip(b"\0").decode("ascii"),
                      format=PAYLOAD_FORMATS[columns["format"][i]], orientation=columns["orientation"][i],
                      source_bytes=0, crc32=columns["payload_crc32"][i]))
        copied += len(data)
    return copied


class ShardPayloads:
    """``payload(i)`` over a :class:`ShardSource`, through read-only maps of its shards."""

    def __init__(self, source: ShardSource) -> None:
        self.source = source
        self._maps: dict[int, mmap.mmap] = {}
        self._part = source.entries["part"].tolist()
        self._start = source.entries["payload_offset"].tolist()
        self._len = source.entries["payload_len"].tolist()

    def __call__(self, i: int) -> bytes:
        part = self._part[i]
        data = self._maps.get(part)
        if data is None:
            with open(self.source.folder / self.source.parts[part]["name"], "rb") as f:
                data = self._maps[part] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return data[self._start[i] : self._start[i] + self._len[i]]

    def close(self) -> None:
        for data in self._maps.values():
            data.close()
        self._maps.clear()
