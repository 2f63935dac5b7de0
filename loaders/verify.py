"""Describe a pack (``info``) and check every byte of it against its checksums (``verify``).

The checks are also offered one by one (``file_problems``, ``manifest_problems``,
``record_problem``), so that ``merge`` refuses exactly what ``verify`` reports as damaged without
a second copy of them."""

from __future__ import annotations

import hashlib
import os
import tempfile
import zlib
from typing import Any

import numpy as np
from PIL import Image

from packload.core.display import terminal_safe
from packload.core.errors import PackFormatError
from packload.core.file_hash import LARGER_THAN_LISTED, sha256_file
from packload.core.format import (
    LMDB_MANIFEST_KEY,
    MANIFEST_NAME,
    PAYLOAD_FORMATS,
    decode_record_header,
    entry_path,
)
from packload.core.pack_download import download_pack
from packload.core.progress import progress_bar
from packload.core.remote import is_url
from packload.core.urls import display_url
from packload.loaders.decode import decode_pil
from packload.loaders.fields import fields_info, verify_fields
from packload.loaders.read import PackReader


def info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a pack holds: counts, classes, sizes, encoding, and what was skipped or left out."""
    with PackReader(path) as reader:
        manifest = reader.manifest
        return {
            "path": str(reader.path),
            "backend": reader.backend,
            "encoding": manifest.encoding,
            "format_version": manifest.version,
            "records": reader.records,
            "classes": manifest.classes,
            "class_counts": manifest.class_counts or {},
            "labelled": manifest.labelled,
            "pack_bytes": _remote_size(reader) if reader.remote else reader.pack_bytes(),
            "payload_bytes": manifest.payload_bytes,
            "source": manifest.source,
            "skipped": manifest.skipped,
            "skipped_count": manifest.skipped_count,
            "ignored": manifest.ignored,
            "ignored_count": manifest.ignored_count,
            "options": manifest.options,
            "created": manifest.created,
            "packload_version": manifest.packload_version,
            "fields": fields_info(manifest),
        }


def _remote_size(reader: PackReader) -> int:
    """Bytes a pack at a URL takes on the store: its shards and index (as the manifest lists and the
    store's listing checked them), or the LMDB object (as fetched)."""
    if reader.backend == "lmdb":
        return reader.local_path.stat().st_size
    return sum(int(part["size"]) for part in reader.manifest.shards) + len(reader.index_bytes())


def file_problems(reader: PackReader, shards: bool = True, index: bool = True) -> list[dict[str, str]]:
    """Whole-file checksums against the manifest: every shard (of a shards pack; unless ``shards``
    is False) and the index (unless ``index`` is False). Each problem names the file. No shard is
    read past the size the manifest lists (the reader checked each against it, and against where
    its records end, when the pack was opened)."""
    problems = []
    manifest = reader.manifest
    if reader.backend == "shards" and shards:
        for part in manifest.shards:
            size = int(part.get("size", 0))
            try:
                digest = sha256_file(reader.path / part["name"], size)
            except PackFormatError:  # grown since the pack was opened
                problems.append({"file": part["name"], "problem": LARGER_THAN_LISTED.format(size=size)})
                continue
            if digest != part.get("sha256"):
                problems.append({"file": part["name"], "problem": "sha256 differs from the manifest"})
    if reader.backend == "lmdb" and not reader.remote:  # a tail past LMDB's pages is never read: say it is there
        size, used = reader.path.stat().st_size, reader.pack_bytes()
        if size > used:
            problems.append({"file": reader.path.name, "problem": f"{size:,} bytes, but LMDB's pages end at {used:,}: "
                             f"{size - used:,} bytes past them are no part of the pack (never read); the pack is "
                             "damaged or appended to: copy the pack again"})
    if not index:
        return problems
    index_digest = hashlib.sha256(reader.index_bytes()).hexdigest()
    if index_digest != manifest.index.get("sha256"):
        problems.append({"file": manifest.index.get("name", "index"),
                         "problem": "sha256 differs from the manifest"})
    return problems


def manifest_problems(reader: PackReader) -> list[dict[str, str]]:
    """The manifest's counts must agree with the index (the manifest has no checksum of its own)."""
    manifest, entries = reader.manifest, reader.entries
    name = MANIFEST_NAME if reader.backend == "shards" else LMDB_MANIFEST_KEY.decode()
    problems = []
    labels = entries["label"].astype(np.int64)
    per_class = np.bincount(labels[labels >= 0], minlength=len(reader.classes)).tolist()
    if manifest.class_counts is not None and manifest.class_counts != dict(zip(reader.classes, per_class, strict=True)):
        problems.append("class_counts disagree with the index")
    if manifest.payload_bytes is not None and manifest.payload_bytes != int(entries["payload_len"].sum()):
        problems.append("payload_bytes disagrees with the index")
    files = manifest.source.get("files")
    if files is not None and files != reader.records + manifest.skipped_count:
        problems.append("source files disagree with the records and skipped files")
    # Counted with unique, not bincount: a damaged part number must not size an array.
    numbers, counts = np.unique(entries["part"], return_counts=True)
    per_part = dict(zip(numbers.tolist(), counts.tolist(), strict=True))
    if reader.backend == "shards":
        listed = [part.get("records") for part in manifest.shards]
        if any(n is not None for n in listed) and per_part != {p: n for p, n in enumerate(listed) if n}:
            problems.append("shard record counts disagree with the index")
    elif manifest.chunks is None:
        problems.append("parts (chunks, chunk_size) missing")
    elif len(per_part) != manifest.chunks or sorted(per_part) != list(range(len(per_part))):
        problems.append("chunk count disagrees with the index")
    if not manifest.index:
        problems.append("index (name, size, sha256) missing")
    elif manifest.index.get("size") != len(reader.index_bytes()):
        problems.append("index size disagrees with the index")
    return [{"file": name, "problem": problem} for problem in problems]


def record_problem(reader: PackReader, i: int, decode: bool = False, payload: bool = True) -> str | None:
    """What is wrong with record ``i``, or None: its header must agree with the index, its payload
    with its CRC-32 (unless ``payload`` is False), and (with ``decode``) the image must decode
    completely."""
    entry = reader.entries[i]
    part = reader.part_view(int(entry["part"]))
    try:
        meta, payload_start, payload_len, crc = decode_record_header(part, int(entry["record_offset"]))
    except PackFormatError as exc:
        return f"record header damaged ({exc})"
    try:
        path = entry_path(reader.entries, reader.paths, i)
    except PackFormatError as exc:
        return f"index path damaged ({exc})"
    described = (meta.record, payload_start, payload_len, crc, meta.label, meta.width, meta.height, meta.format,
                 meta.mode, meta.orientation, meta.path)
    if described != (i, int(entry["payload_offset"]), int(entry["payload_len"]), int(entry["payload_crc32"]),
                     int(entry["label"]), int(entry["width"]), int(entry["height"]),
                     PAYLOAD_FORMATS[int(entry["format"])], bytes(entry["mode"]).rstrip(b"\0").decode("ascii", "replace"),
                     int(entry["orientation"]), path):
        return "record header disagrees with the index"
    if not payload:
        return None
    data = part[payload_start : payload_start + payload_len]
    if zlib.crc32(data) != crc:
        return "payload checksum mismatch: the stored bytes are damaged"
    if decode:
        try:
            image = decode_pil(data, PAYLOAD_FORMATS[int(entry["format"])], int(entry["width"]),
                               int(entry["height"]))
            image.load()
        except Image.DecompressionBombError as exc:
            return (f"decompression bomb ({exc}); if the image is genuine, raise PIL.Image.MAX_IMAGE_PIXELS "
                    "on purpose before reading")
        except (OSError, ValueError, SyntaxError) as exc:
            return f"does not decode: {exc}"
    return None


def verify(path: str | os.PathLike[str], decode: bool = False, progress: bool = True) -> dict[str, Any]:
    """Check the whole pack: file checksums, then every record's header and payload CRC-32
    (and a full decode with ``decode=True``). Returns a report; ``ok`` is False if anything failed.
    A pack at a URL is copied whole into a temporary folder first (every byte is read anyway)."""
    if is_url(path):
        with tempfile.TemporaryDirectory(prefix="packload-verify-") as folder:
            report = verify(download_pack(str(path), folder, progress=progress), decode, progress)
        return dict(report, path=display_url(str(path).rstrip("/")))
    with PackReader(path) as reader:
        damaged_files = file_problems(reader) + manifest_problems(reader) + verify_fields(reader)
        bad = []
        for i in progress_bar(range(reader.records), unit="rec", desc=f"verify {terminal_safe(reader.path.name)}",
                      disable=not progress):
            problem = record_problem(reader, i, decode)
            if problem:
                part = int(reader.entries["part"][i])
                bad.append({"record": i, "path": reader.path_of(i), "problem": problem,
                            "part": reader.part_names[part] if reader.backend == "shards" else f"chunk {part}"})
        return {
            "path": str(reader.path),
            "ok": not bad and not damaged_files,
            "records": reader.records,
            "bad_records": bad,
            "bad_files": damaged_files,
            "decoded": decode,
        }
