"""Hostile packs made by hand: copies, rewritten indexes and manifests (checksums kept in step),
packs of chosen records, JPEG bombs, and the address-space cap they are read under."""

from __future__ import annotations

import contextlib
import io
import resource
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tests.reliability.packs import MEMORY_HEADROOM, SHARD_SIZE, small_chunk_writer


@contextlib.contextmanager
def address_space_cap(headroom: int = MEMORY_HEADROOM) -> Iterator[None]:
    """Cap this process's address space at its size now plus ``headroom`` while the block runs, so
    an absurd allocation raises MemoryError instead of exhausting the machine."""
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + headroom, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def copy_pack(pack: Path, dst: Path) -> Path:
    """A copy of ``pack`` at ``dst`` (a folder or a file)."""
    if pack.is_dir():
        shutil.copytree(pack, dst)
    else:
        shutil.copyfile(pack, dst)
    return dst


def _lmdb_put(pack: Path, values: dict[bytes, bytes]) -> None:
    import lmdb

    env = lmdb.open(str(pack), subdir=False, map_size=max(1 << 24, 4 * pack.stat().st_size), lock=False)
    try:
        with env.begin(write=True) as txn:
            for key, value in values.items():
                txn.put(key, value)
        env.sync(True)
    finally:
        env.close()


def rewrite(pack: Path, index: bytes | None = None, manifest: dict[str, Any] | bytes | None = None,
            fix_sha: bool = True) -> None:
    """Replace a pack's index and/or manifest, keeping the manifest's index sha256 and size in
    step with the new index (so only the damage meant is there)."""
    import hashlib

    from packload import PackReader
    from packload.core.format import LMDB_INDEX_KEY, LMDB_MANIFEST_KEY
    from packload.core.manifest import encode_manifest

    with PackReader(pack) as reader:
        old_manifest = dict(reader.manifest)
        old_index = reader.index_bytes()
    index_bytes = old_index if index is None else index
    if isinstance(manifest, bytes):
        manifest_bytes = manifest
    else:
        new = dict(old_manifest if manifest is None else manifest)
        if fix_sha and isinstance(new.get("index"), dict):
            new["index"] = dict(new["index"], sha256=hashlib.sha256(index_bytes).hexdigest(), size=len(index_bytes))
        manifest_bytes = encode_manifest(new)
    if pack.is_dir():
        (pack / "index.bin").write_bytes(index_bytes)
        (pack / "manifest.json").write_bytes(manifest_bytes)
    else:
        _lmdb_put(pack, {LMDB_INDEX_KEY: index_bytes, LMDB_MANIFEST_KEY: manifest_bytes})


def index_with(pack: Path, **fields: Any) -> bytes:
    """The pack's index with entry fields replaced: ``field=(record, value)``; ``count=N`` or
    ``version=V`` set the header."""
    from packload import PackReader
    from packload.core.format import INDEX_ENTRY, INDEX_HEADER

    with PackReader(pack) as reader:
        raw = bytearray(reader.index_bytes())
    header = np.frombuffer(bytes(raw[: INDEX_HEADER.itemsize]), INDEX_HEADER).copy()
    count = int(header[0]["count"])
    entries = np.frombuffer(bytes(raw), INDEX_ENTRY, count=count, offset=INDEX_HEADER.itemsize).copy()
    for name, value in fields.items():
        if name in INDEX_HEADER.names:
            header[0][name] = value
        else:
            record, new = value
            entries[record][name] = new
    return header.tobytes() + entries.tobytes() + bytes(raw[INDEX_HEADER.itemsize + count * INDEX_ENTRY.itemsize :])


def craft_pack(dst: Path, items: list[tuple[str, int, bytes]], classes: list[str] | None = None,
               encoding: str = "keep") -> Path:
    """A pack whose every checksum is right but whose content is chosen by the caller: ``items``
    are (path, label, image file bytes), written as-is (hostile paths, bombs...)."""
    from PIL import Image

    from packload.packer.encode import Encoded
    from packload.packer.write_shards import ShardsWriter

    classes = ["a"] if classes is None else classes
    backend = "lmdb" if dst.suffix == ".lmdb" else "shards"
    if backend == "lmdb":
        writer: Any = small_chunk_writer()(dst, 1 << 24)
    else:
        dst.mkdir()
        writer = ShardsWriter(dst, SHARD_SIZE)
    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None  # a bomb's header is recorded as it claims
    for path, label, payload in items:
        try:
            image = Image.open(io.BytesIO(payload))
            size, mode, fmt = image.size, image.mode, image.format or "other"
        except Exception:  # noqa: BLE001 - junk: a size no reader may trust
            size, mode, fmt = (1, 1), "RGB", "other"
        writer.write(Encoded(path, label, payload, size[0], size[1], mode, fmt, 0, len(payload), zlib.crc32(payload)))
    Image.MAX_IMAGE_PIXELS = limit
    writer.finish({"format": "packload", "version": 1, "backend": backend, "encoding": encoding,
                   "records": writer.index.count, "classes": classes, "skipped": [], "labelled": True,
                   "class_counts": {c: sum(1 for _, lab, _ in items if lab == k) for k, c in enumerate(classes)},
                   "payload_bytes": sum(len(p) for _, _, p in items)})
    return dst


def jpeg_bytes(size: tuple[int, int] = (48, 40), seed: int = 0) -> bytes:
    """A small real JPEG."""
    from PIL import Image

    from tests.image_factory import textured_rgb

    out = io.BytesIO()
    Image.fromarray(textured_rgb(size, seed)).save(out, "JPEG", quality=85)
    return out.getvalue()


def jpeg_bomb(width: int = 60000, height: int = 60000) -> bytes:
    """A small JPEG whose frame header claims ``width`` x ``height`` pixels."""
    data = bytearray(jpeg_bytes())
    at = data.find(b"\xff\xc0")
    data[at + 5 : at + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}
