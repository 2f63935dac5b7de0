"""``packload merge OUT PACK1 PACK2 ...``: join packs made separately into one, without re-encoding.

Records keep their order (PACK1's, then PACK2's, …). Labels are remapped to the sorted union of
the inputs' classes, as ImageFolder would number the classes of the combined folder. Into a shards
OUT, shards of shards inputs are reused: hard-linked when nothing in them changes, else copied and
renumbered in place (``packload.packer.combine``); records of LMDB inputs are copied into new shards.
Into an LMDB OUT every record is copied, chunked as ``pack`` would. OUT is written as
``OUT.partial`` and published by rename, under OUT's lock, as ``pack`` does; ``overwrite``
replaces only a pack (``packload.packer.destination``).

A merged pack is written afresh (new index, manifest, header checksums), so it would hide any
damage in what it copies. Merge therefore checks its inputs as ``verify`` does and refuses a
damaged one, naming it and the problem: each index against its manifest's sha256 and the manifest's
counts against the index, before anything is written; then each shard it links or copies against
the manifest's sha256 (hashed as it is copied), and every record it copies one by one (header
against the index, payload against its CRC-32). A refused merge leaves no OUT behind.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from packload.core.display import terminal_safe
from packload.core.errors import PackFormatError, UsageError
from packload.core.format import INDEX_NAME, MANIFEST_NAME, decode_index, pack_size
from packload.core.manifest import Manifest, build_manifest, encode_manifest, index_entry
from packload.core.pack_download import download_pack
from packload.core.progress import progress_bar
from packload.core.remote import is_url
from packload.core.urls import display_url
from packload.packer.combine import ShardSource, copy_records, joined_index, label_map, place_shards
from packload.packer.destination import creation_error, system_reason
from packload.packer.pack_destination import PackDestination
from packload.packer.pipeline import LMDB_MAP_PER_FILE, backend_for
from packload.packer.upload import upload_pack
from packload.packer.url_destination import UrlDestination
from packload.packer.write_lmdb import LmdbWriter
from packload.packer.write_shards import ShardsWriter, fsync_dir, write_file_atomic

# Options that change what the payloads are: packs must agree on them to share one manifest.
PAYLOAD_OPTIONS = ("encoding", "quality", "max_side", "size")


def _check_inputs(inputs: list[Path]) -> None:
    """Refuse a pack given twice (under any two names of it)."""
    seen: dict[Path, Path] = {}
    for path in inputs:
        real = path.resolve()
        if real in seen:
            raise UsageError(f"{path}: given twice (as {seen[real]} too); give each pack once")
        seen[real] = path


def damaged(reader: Any, where: str, problem: str) -> PackFormatError:
    """The one-line refusal of a damaged input: the pack, where in it, what is wrong, what to do."""
    return PackFormatError(f"{reader.path}: {where}: {problem}; the pack is damaged, and merge does not copy "
                           f"damage: run `packload verify {reader.path}`, then re-copy or re-pack it")


def _open_checked(path: Path) -> Any:
    """Open input ``path``, its index checked against the manifest's sha256 and the manifest's
    counts against the index (``packload.loaders.verify``)."""
    from packload.loaders.read import PackReader  # the reading side, needed only here
    from packload.loaders.verify import manifest_problems

    try:
        reader = PackReader(path, check_index=True)
    except lmdb.Error as exc:
        raise PackFormatError(f"{path}: cannot be read as LMDB ({system_reason(exc)}); the pack is damaged: run "
                              f"`packload verify {path}`, then re-copy or re-pack it") from None
    try:
        problems = manifest_problems(reader)
        if problems:
            raise damaged(reader, problems[0]["file"], problems[0]["problem"])
        if reader.manifest.fields:  # merged, its fields would be lost: refused rather than dropped
            raise UsageError(f"{path}: a pack made from a table (it has fields); merge does not join fields yet: "
                             "pack the images together from one table instead")
    except BaseException:
        reader.close()
        raise
    return reader


def checked_payloads(reader: Any, payload: bool = True) -> Callable[[int], memoryview]:
    """``payload(i)`` for ``copy_records`` that first checks record ``i`` as ``verify`` does (header
    against the index, payload against its CRC-32) and refuses a damaged one."""
    from packload.loaders.verify import record_problem

    def checked(i: int) -> memoryview:
        try:
            problem = record_problem(reader, i, payload=payload)
            data = reader.payload(i)
        except lmdb.Error as exc:  # LMDB's own pages damaged
            problem = f"LMDB could not read it ({system_reason(exc)})"
        if problem:
            raise damaged(reader, f"record {i} ({terminal_safe(_path_or_number(reader, i))})", problem)
        return data

    return checked


def _path_or_number(reader: Any, i: int) -> str:
    try:
        return reader.path_of(i)
    except PackFormatError:
        return f"record {i}"


def _check_shard_files(reader: Any) -> None:
    """Every shard of a shards input against the manifest's sha256 (before its records are copied)."""
    from packload.loaders.verify import file_problems

    problems = file_problems(reader, index=False)
    if problems:
        raise damaged(reader, problems[0]["file"], problems[0]["problem"])


def _check_headers(reader: Any) -> None:
    """Every record header of a shards input against its index (its shards are reused, not copied
    record by record; their bytes are checked by their sha256 as they are placed)."""
    check = checked_payloads(reader, payload=False)
    for i in range(reader.records):
        check(i)


def _payload_options(manifest: Manifest) -> dict[str, Any]:
    options = dict(manifest.options, encoding=manifest.encoding)
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
        if reader.manifest.labelled != first.manifest.labelled:
            raise UsageError(f"{reader.path}: one of {first.path} and {reader.path} is labelled and the other "
                             "is not; merge only labelled packs or only unlabelled ones")


def merge(out: str | os.PathLike[str], inputs: list[str | os.PathLike[str]], *, backend: str | None = None,
          overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Join the complete packs ``inputs`` into ``out`` (an LMDB file or shards folder; the suffix
    picks, as for ``pack``). Classes become the sorted union; records keep their order. Damaged
    inputs are refused (see the module's notes). Returns a summary. Inputs at URLs are copied
    whole into a temporary folder first; an ``out`` URL is merged there, then uploaded (the
    manifest last)."""
    if is_url(out) or any(is_url(p) for p in inputs):
        return _merge_remote(out, inputs, backend=backend, overwrite=overwrite, progress=progress)
    started = time.perf_counter()
    out_path, paths = Path(out), [Path(p) for p in inputs]
    if not paths:
        raise UsageError("merge: give at least one pack to merge")
    backend = backend_for(out_path, backend)
    _check_inputs(paths)
    with PackDestination(out_path, paths, "the input pack", overwrite) as destination:
        tmp = destination.partial
        if destination.leftover():
            if not overwrite:
                raise UsageError(f"{tmp}: an unfinished pack or merge is there; add --overwrite to replace it")
            destination.discard()
        readers: list[Any] = []
        try:
            for path in paths:
                readers.append(_open_checked(path))
            _check_compatible(readers)
            manifest, maps, linked = _merge_into(readers, destination, backend, progress)
        finally:
            for reader in readers:
                reader.close()
        destination.publish()
    return {
        "destination": str(out_path),
        "backend": backend,
        "encoding": manifest.encoding,
        "inputs": [str(p) for p in paths],
        "records": manifest.records,
        "classes": len(manifest.classes),
        "remapped": sum(m is not None for m in maps),
        "shards_linked": linked,
        "pack_bytes": pack_size(out_path),
        "seconds": round(time.perf_counter() - started, 3),
    }


def _merge_remote(out: str | os.PathLike[str], inputs: list[str | os.PathLike[str]], *, backend: str | None,
                  overwrite: bool, progress: bool) -> dict[str, Any]:
    """``merge`` with inputs or ``out`` at URLs, through a temporary folder. An ``out`` URL is checked
    first (``packer.url_destination``: anything there but a pack of ours is refused, a pack needs
    ``overwrite``), before any input is fetched, and replaced only once the merged pack is ready."""
    started = time.perf_counter()
    destination = UrlDestination(str(out), overwrite) if is_url(out) else None
    if destination is not None:
        destination.check()
    with tempfile.TemporaryDirectory(prefix="packload-merge-") as folder:
        local_inputs: list[str | os.PathLike[str]] = []
        for k, item in enumerate(inputs):
            if is_url(item):
                os.mkdir(os.path.join(folder, f"input-{k}"))
                local_inputs.append(download_pack(str(item), os.path.join(folder, f"input-{k}"), progress=progress))
            else:
                local_inputs.append(item)
        if destination is None:
            result = merge(out, local_inputs, backend=backend, overwrite=overwrite, progress=progress)
        else:
            local_out = Path(folder) / destination.name
            result = merge(local_out, local_inputs, backend=backend, overwrite=False, progress=progress)
            upload_pack(local_out, str(out), overwrite, progress=progress)
            result["destination"] = destination.shown
    shown = [display_url(str(p)) if is_url(p) else str(p) for p in inputs]
    return dict(result, inputs=shown, seconds=round(time.perf_counter() - started, 3))


def _merge_into(readers: list[Any], destination: PackDestination, backend: str,
                progress: bool) -> tuple[Manifest, list[np.ndarray | None], int]:
    """Write the merged pack into the destination's unfinished pack (removed again on any error); its
    manifest, the label maps and the number of shards hard-linked."""
    tmp, out_path = destination.partial, destination.path
    labelled = readers[0].manifest.labelled and any(r.classes for r in readers)
    classes = sorted({name for r in readers for name in r.classes}) if labelled else []
    maps = [label_map(r.classes, classes) if labelled else None for r in readers]
    total = sum(r.records for r in readers)
    bar = progress_bar(total=total, unit="rec", disable=not progress, dynamic_ncols=True,
               desc=f"merge {terminal_safe(out_path.name)}")
    try:
        if backend == "shards":
            _create(tmp, lambda: tmp.mkdir())
            index, labels, parts, linked = _merge_shards(readers, maps, tmp, bar)
            manifest = _manifest(readers, classes, labelled, labels, backend)
            write_file_atomic(tmp / INDEX_NAME, index)
            manifest.parts, manifest.index = parts, index_entry(INDEX_NAME, index)
            write_file_atomic(tmp / MANIFEST_NAME, encode_manifest(manifest))
            fsync_dir(tmp)
        else:
            manifest = _merge_lmdb(readers, maps, tmp, classes, labelled, total, bar)
            linked = 0
    except lmdb.Error as exc:  # an input's LMDB file damaged where LMDB itself reads it
        destination.discard()
        raise PackFormatError(f"{out_path}: an input could not be read ({system_reason(exc)}); run `packload "
                              "verify` on each input, then re-copy or re-pack the damaged one") from None
    except BaseException:
        destination.discard()
        raise
    finally:
        bar.close()
    return manifest, maps, linked


def _create(path: Path, make: Callable[[], Any]) -> Any:
    """``make()``, which creates ``path``; one line naming it if that fails."""
    try:
        return make()
    except (OSError, lmdb.Error) as exc:
        raise creation_error(path, exc) from None


def _merge_lmdb(readers: list[Any], maps: list[np.ndarray | None], tmp: Path, classes: list[str], labelled: bool,
                total: int, bar: Any) -> Manifest:
    """Copy every input's records, checked, into the LMDB file ``tmp``; its manifest."""
    writer = _create(tmp, lambda: LmdbWriter(tmp, max(1 << 30, total * LMDB_MAP_PER_FILE)))
    try:
        for reader, mapping in zip(readers, maps, strict=True):
            if reader.backend == "shards":
                _check_shard_files(reader)
            copy_records(reader.entries, reader.paths, checked_payloads(reader), writer.write, mapping)
            bar.update(reader.records)
        labels = np.concatenate([_labels(r, m) for r, m in zip(readers, maps, strict=True)])
        return writer.finish(_manifest(readers, classes, labelled, labels, "lmdb"))
    finally:
        writer.close()


def _labels(reader: Any, mapping: np.ndarray | None) -> np.ndarray:
    labels = reader.labels()
    return labels if mapping is None else np.where(labels >= 0, mapping[np.maximum(labels, 0)], labels)


def _merge_shards(readers: list[Any], maps: list[np.ndarray | None], tmp: Path,
                  bar: Any) -> tuple[bytes, np.ndarray, list[dict[str, Any]], int]:
    """Place every input's shards (LMDB inputs first rewritten as shards) into ``tmp``."""
    sources: list[ShardSource] = []
    bases: list[int] = []
    parts: list[dict[str, Any]] = []
    linked = 0
    record_base = 0
    for k, (reader, mapping) in enumerate(zip(readers, maps, strict=True)):
        if reader.backend == "shards":
            _check_headers(reader)
            source = ShardSource(reader.path, reader.manifest.shards, reader.entries, reader.paths, mapping)
            placed = place_shards(source, tmp, len(parts), record_base)  # each shard checked by its sha256
        else:  # an LMDB input: its records, checked, into shards of their own, then moved into place
            staging = tmp / f".input-{k}"
            staging.mkdir()
            writer = ShardsWriter(staging, 256 << 20)
            copy_records(reader.entries, reader.paths, checked_payloads(reader), writer.write)
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
              backend: str) -> Manifest:
    """The merged pack's manifest: counts summed, lists joined (and capped, as ``build_manifest``
    does, with the inputs' full counts summed), options of the first input."""
    manifests: list[Manifest] = [r.manifest for r in readers]
    names = [str(m.source.get("name", r.path.name)) for m, r in zip(manifests, readers, strict=True)]
    skipped = [_entry(s) for m in manifests for s in m.skipped]
    ignored = sorted((_entry(i) for m in manifests for i in m.ignored), key=lambda item: item["path"])
    by_reason: dict[str, int] = {}
    for m in manifests:
        for reason, count in m.ignored_by_reason.items():
            by_reason[reason] = by_reason.get(reason, 0) + count
    return build_manifest(
        backend=backend, encoding=manifests[0].encoding,
        source={"name": "+".join(dict.fromkeys(names)),
                "files": sum(r.records + r.manifest.skipped_count for r in readers),  # as each input's verify checks it
                "bytes": sum(int(m.source.get("bytes", 0)) for m in manifests)},
        labelled=labelled, classes=classes, labels=labels,
        payload_bytes=sum(int(r.entries["payload_len"].sum()) for r in readers), skipped=skipped, ignored=ignored,
        options=dict(manifests[0].options, backend=backend),
        skipped_count=sum(m.skipped_count for m in manifests),
        ignored_count=sum(m.ignored_count for m in manifests),
        ignored_by_reason=by_reason,
        merged_from=[{"name": name, "records": r.records, "classes": r.classes,
                      "index_sha256": hashlib.sha256(r.index_bytes()).hexdigest()}
                     for name, r in zip(names, readers, strict=True)])


def _entry(item: dict[str, Any]) -> dict[str, str]:
    return {"path": item["path"], "reason": str(item.get("reason", ""))}

