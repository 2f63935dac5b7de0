"""``packload merge OUT PACK1 PACK2 ...``: join packs made separately into one, without re-encoding.

Records keep their order (PACK1's, then PACK2's, …). Labels are remapped to the sorted union of
the inputs' classes, as ImageFolder would number the classes of the combined folder. Into a shards
OUT, shards of shards inputs are reused: hard-linked when nothing in them changes, else copied and
renumbered in place (``packer.combine``); records of LMDB inputs are copied into new shards.
Into an LMDB OUT every record is copied, chunked as ``pack`` would. OUT is written as
``OUT.partial`` and published by rename, as ``pack`` does.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from . import __version__
from .combine import ShardSource, copy_records, joined_index, label_map, place_shards
from .errors import UsageError
from .format import FORMAT_NAME, FORMAT_VERSION, INDEX_NAME, MANIFEST_NAME, decode_index, encode_manifest
from .pipeline import LMDB_MAP_PER_FILE, _publish, _remove, backend_for, pack_size, partial_path
from .write_lmdb import LmdbWriter
from .write_shards import ShardsWriter, fsync_dir, write_file_atomic

# Options that change what the payloads are: packs must agree on them to share one manifest.
PAYLOAD_OPTIONS = ("encoding", "quality", "max_side", "size")


def _check_inputs(out: Path, inputs: list[Path]) -> None:
    """Refuse a pack given twice, and an OUT that is one of the inputs or inside one."""
    seen: dict[Path, Path] = {}
    for path in inputs:
        real = path.resolve()
        if real in seen:
            raise UsageError(f"{path}: given twice (as {seen[real]} too); give each pack once")
        seen[real] = path
        out_real = out.resolve()
        if out_real == real or real in out_real.parents:
            raise UsageError(f"{out}: is the input pack {path} or inside it; write the merged pack elsewhere")


def _payload_options(manifest: dict[str, Any]) -> dict[str, Any]:
    options = dict(manifest.get("options") or {}, encoding=manifest["encoding"])
    if options["encoding"] == "keep":  # the original bytes whatever the other options said
        return {"encoding": "keep"}
    return {key: options.get(key) for key in PAYLOAD_OPTIONS}


def _check_compatible(readers: list[Any]) -> None:
    """Refuse packs whose payloads cannot share one manifest, and a pack given twice under two names."""
    first = readers[0]
    seen: dict[str, Any] = {}
    for reader in readers:
        digest = hashlib.sha256(reader.index_bytes()).hexdigest()
        if digest in seen:
            raise UsageError(f"{reader.path}: holds the same records as {seen[digest].path} (a copy of it?); "
                             "give each pack once")
        seen[digest] = reader
    want = _payload_options(first.manifest)
    for reader in readers[1:]:
        got = _payload_options(reader.manifest)
        if got != want:
            diff = ", ".join(f"{k} {want.get(k)!r} vs {got.get(k)!r}" for k in sorted(set(want) | set(got))
                             if want.get(k) != got.get(k))
            raise UsageError(f"{reader.path}: packed with other payload options than {first.path} ({diff}); "
                             "a pack has one encoding, so these cannot be mixed: re-pack one of them to match")
        if bool(reader.manifest.get("labelled", True)) != bool(first.manifest.get("labelled", True)):
            raise UsageError(f"{reader.path}: one of {first.path} and {reader.path} is labelled and the other "
                             "is not; merge only labelled packs or only unlabelled ones")


def merge(out: str | os.PathLike[str], inputs: list[str | os.PathLike[str]], *, backend: str | None = None,
          overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Join the complete packs ``inputs`` into ``out`` (an LMDB file or shards folder; the suffix
    picks, as for ``pack``). Classes become the sorted union; records keep their order.
    Returns a summary."""
    from loaders.read import PackReader  # the reading side, needed only here

    started = time.perf_counter()
    out_path, paths = Path(out), [Path(p) for p in inputs]
    if not paths:
        raise UsageError("merge: give at least one pack to merge")
    backend = backend_for(out_path, backend)
    _check_inputs(out_path, paths)
    parent = out_path.parent if str(out_path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{out_path}: the folder {parent} does not exist; create it first")
    if (out_path.exists() or out_path.is_symlink()) and not overwrite:
        raise UsageError(f"{out_path}: already exists; add --overwrite to replace it, or choose another name")
    tmp = partial_path(out_path)
    if tmp.exists() or Path(str(tmp) + "-lock").exists():
        if not overwrite:
            raise UsageError(f"{tmp}: an unfinished pack or merge is there; add --overwrite to replace it")
        _remove(tmp)

    readers: list[Any] = []
    try:
        for path in paths:
            readers.append(PackReader(path))
        _check_compatible(readers)
        labelled = bool(readers[0].manifest.get("labelled", True)) and any(r.classes for r in readers)
        classes = sorted({name for r in readers for name in r.classes}) if labelled else []
        maps = [label_map(r.classes, classes) if labelled else None for r in readers]
        total = sum(r.records for r in readers)
        bar = tqdm(total=total, unit="rec", disable=not progress, dynamic_ncols=True, desc=f"merge {out_path.name}")
        try:
            if backend == "shards":
                tmp.mkdir()
                index, labels, parts, linked = _merge_shards(readers, maps, tmp, bar)
            else:
                writer = LmdbWriter(tmp, max(1 << 30, total * LMDB_MAP_PER_FILE))
                try:
                    for reader, mapping in zip(readers, maps, strict=True):
                        copy_records(reader.entries, reader.paths, reader.payload, writer.write, mapping)
                        bar.update(reader.records)
                    labels = np.concatenate([_labels(r, m) for r, m in zip(readers, maps, strict=True)])
                    manifest = _manifest(readers, classes, labelled, labels, backend)
                    manifest = writer.finish(manifest)
                finally:
                    writer.close()
                linked = 0
        finally:
            bar.close()
        if backend == "shards":
            manifest = _manifest(readers, classes, labelled, labels, backend)
            write_file_atomic(tmp / INDEX_NAME, index)
            manifest.update(parts=parts, index={"name": INDEX_NAME, "size": len(index),
                                                "sha256": hashlib.sha256(index).hexdigest()})
            write_file_atomic(tmp / MANIFEST_NAME, encode_manifest(manifest))
            fsync_dir(tmp)
    except BaseException:
        if tmp.exists():
            _remove(tmp)
        raise
    finally:
        for reader in readers:
            reader.close()
    _publish(tmp, out_path)
    return {
        "destination": str(out_path),
        "backend": backend,
        "encoding": manifest["encoding"],
        "inputs": [str(p) for p in paths],
        "records": manifest["records"],
        "classes": len(classes),
        "remapped": sum(m is not None for m in maps),
        "shards_linked": linked,
        "pack_bytes": pack_size(out_path),
        "seconds": round(time.perf_counter() - started, 3),
    }


def _labels(reader: Any, mapping: np.ndarray | None) -> np.ndarray:
    labels = reader.labels()
    return labels if mapping is None else np.where(labels >= 0, mapping[np.maximum(labels, 0)], labels)


def _merge_shards(readers: list[Any], maps: list[np.ndarray | None], tmp: Path,
                  bar: tqdm) -> tuple[bytes, np.ndarray, list[dict[str, Any]], int]:
    """Place every input's shards (LMDB inputs first rewritten as shards) into ``tmp``."""
    sources: list[ShardSource] = []
    bases: list[int] = []
    parts: list[dict[str, Any]] = []
    linked = 0
    record_base = 0
    for k, (reader, mapping) in enumerate(zip(readers, maps, strict=True)):
        if reader.backend == "shards":
            source = ShardSource(reader.path, reader.manifest["parts"], reader.entries, reader.paths, mapping)
            placed = place_shards(source, tmp, len(parts), record_base)
        else:  # an LMDB input: its records into shards of their own, then moved into place
            staging = tmp / f".input-{k}"
            staging.mkdir()
            writer = ShardsWriter(staging, 256 << 20)
            copy_records(reader.entries, reader.paths, reader.payload, writer.write)
            writer.finish({})
            entries, paths = decode_index((staging / INDEX_NAME).read_bytes(), str(staging / INDEX_NAME))
            source = ShardSource(staging, writer.parts, entries, paths, mapping)
            placed = place_shards(source, tmp, len(parts), record_base, move=True)
            for name in (INDEX_NAME, MANIFEST_NAME):
                (staging / name).unlink(missing_ok=True)
            staging.rmdir()
        linked += sum(before["sha256"] == after["sha256"] for before, after in zip(source.parts, placed, strict=True)
                      if reader.backend == "shards")
        sources.append(source)
        bases.append(len(parts))
        parts += placed
        record_base += reader.records
        bar.update(reader.records)
    index, labels = joined_index(sources, bases)
    return index, labels, parts, linked


def _manifest(readers: list[Any], classes: list[str], labelled: bool, labels: np.ndarray,
              backend: str) -> dict[str, Any]:
    """The merged pack's manifest: counts summed, lists joined, options of the first input."""
    manifests = [r.manifest for r in readers]
    names = list(dict.fromkeys(str(m.get("source", {}).get("name", r.path.name)) for m, r in zip(manifests, readers,
                                                                                                 strict=True)))
    options = dict(manifests[0].get("options") or {}, backend=backend)
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "backend": backend,
        "encoding": manifests[0]["encoding"],
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "packload_version": __version__,
        "source": {"name": "+".join(names), "files": sum(int(m.get("source", {}).get("files", 0)) for m in manifests),
                   "bytes": sum(int(m.get("source", {}).get("bytes", 0)) for m in manifests)},
        "labelled": labelled,
        "classes": classes,
        "class_counts": {name: int((labels == i).sum()) for i, name in enumerate(classes)},
        "records": sum(r.records for r in readers),
        "payload_bytes": sum(int(r.entries["payload_len"].sum()) for r in readers),
        "skipped": [s for m in manifests for s in m["skipped"]],
        "ignored": sorted((i for m in manifests for i in m.get("ignored", [])), key=lambda item: item["path"]),
        "options": options,
        "merged_from": [{"name": str(m.get("source", {}).get("name", r.path.name)), "records": r.records,
                         "classes": r.classes, "index_sha256": hashlib.sha256(r.index_bytes()).hexdigest()}
                        for m, r in zip(manifests, readers, strict=True)],
    }
