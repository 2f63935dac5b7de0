"""The manifest of a pack, defined once: the JSON object that describes the whole pack, how every
writer builds it (``build_manifest``), how it is written (``encode_manifest``) and how every reader
checks it before trusting anything in it (``decode_manifest``). ``docs/FORMAT.md`` lists its fields."""

from __future__ import annotations

import datetime as _dt
import json
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from packload.core.errors import PackFormatError
from packload.core.fields import manifest_fields_ok
from packload.core.format import BACKENDS, ENCODINGS, FORMAT_NAME, FORMAT_VERSION, INDEX_NAME, LMDB_INDEX_KEY
from packload.core.version import __version__

# Manifest fields every reader checks before anything else.
MANIFEST_REQUIRED = ("format", "version", "backend", "encoding", "records", "classes", "skipped")
# A reader refuses a larger manifest before parsing it (every DataLoader worker parses its own):
# writers keep theirs far below by listing at most this many skipped and left-out files.
MANIFEST_LIMIT = 64 << 20
SKIPPED_LISTED = 100_000  # broken files named in the manifest; the rest are counted (``skipped_count``)
IGNORED_LISTED = 1_000  # files left out (not images, hidden) named; the rest counted by reason


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    """The manifest as UTF-8 JSON bytes (sorted keys, so equal packs give equal manifests)."""
    return (json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def decode_manifest(raw: bytes, where: str) -> dict[str, Any]:
    """Parse and check a manifest: it must be ours, of a version we read, and well formed (and no
    larger than ``MANIFEST_LIMIT``: checked before parsing)."""
    if len(raw) > MANIFEST_LIMIT:
        raise PackFormatError(f"{where}: manifest of {len(raw):,} bytes, more than the {MANIFEST_LIMIT:,} a "
                              "packload manifest may take; the pack is damaged or not a packload pack")
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, integers too long
        raise PackFormatError(f"{where}: manifest is not valid JSON ({type(exc).__name__}); "
                              "the pack is damaged") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise PackFormatError(f"{where}: not a packload manifest (format is "
                              f"{manifest.get('format') if isinstance(manifest, dict) else type(manifest).__name__!r})")
    if type(manifest.get("version")) is not int or manifest["version"] != FORMAT_VERSION:
        raise PackFormatError(f"{where}: pack format version {manifest.get('version')!r}; this packload "
                              f"reads version {FORMAT_VERSION}: upgrade packload or re-pack the images")
    missing = [key for key in MANIFEST_REQUIRED if key not in manifest]
    if missing:
        raise PackFormatError(f"{where}: manifest lacks {', '.join(missing)}; the pack is damaged")
    if manifest["backend"] not in BACKENDS or manifest["encoding"] not in ENCODINGS:
        raise PackFormatError(f"{where}: unknown backend or encoding in manifest "
                              f"({manifest['backend']!r}, {manifest['encoding']!r})")
    if type(manifest["records"]) is not int or manifest["records"] < 0:
        raise PackFormatError(f"{where}: manifest record count {manifest['records']!r} is not valid")
    if not isinstance(manifest["classes"], list) or not all(isinstance(c, str) for c in manifest["classes"]):
        raise PackFormatError(f"{where}: manifest classes must be a list of names")
    if not isinstance(manifest["skipped"], list) or not all(
            isinstance(s, dict) and isinstance(s.get("path"), str) for s in manifest["skipped"]):
        raise PackFormatError(f"{where}: manifest skipped must be a list of {{path, reason}} entries")
    _check_optional_fields(manifest, where)
    if len(manifest["skipped"]) > skipped_count(manifest) or len(manifest.get("ignored", [])) > ignored_count(manifest):
        raise PackFormatError(f"{where}: manifest lists more skipped or left-out files than it counts; "
                              "the pack is damaged")
    return manifest


def _is_int(value: Any) -> bool:
    return type(value) is int and value >= 0


# Optional manifest fields that readers use, and what each must be when present (a hostile or
# damaged manifest must give PackFormatError, not a TypeError deep inside ``info`` or ``verify``).
_OPTIONAL_FIELDS: dict[str, tuple[str, Any]] = {
    "class_counts": ("an object of counts", lambda v: isinstance(v, dict) and all(map(_is_int, v.values()))),
    "payload_bytes": ("a byte count", lambda v: v is None or _is_int(v)),
    "labelled": ("true or false", lambda v: isinstance(v, bool)),
    "ignored": ("a list of {path, reason} entries", lambda v: isinstance(v, list) and all(
        isinstance(s, dict) and isinstance(s.get("path"), str) for s in v)),
    "source": ("an object with a name, and counts of files and bytes", lambda v: isinstance(v, dict)
               and isinstance(v.get("name", ""), str) and _is_int(v.get("files", 0)) and _is_int(v.get("bytes", 0))),
    "options": ("an object", lambda v: isinstance(v, dict)),
    "index": ("an object with name, size and sha256", lambda v: isinstance(v, dict)
              and v.get("name") in (INDEX_NAME, LMDB_INDEX_KEY.decode()) and isinstance(v.get("sha256"), str)
              and _is_int(v.get("size"))),
    "created": ("a date string", lambda v: isinstance(v, str)),
    "packload_version": ("a version string", lambda v: isinstance(v, str)),
    "id": ("32 hexadecimal digits", lambda v: isinstance(v, str) and len(v) == 32
           and all(c in "0123456789abcdef" for c in v)),
    "skipped_count": ("a count", _is_int),
    "ignored_count": ("a count", _is_int),
    "ignored_by_reason": ("an object of counts", lambda v: isinstance(v, dict) and all(map(_is_int, v.values()))),
    "fields": ("an object with name, size, sha256 and columns (docs/FORMAT.md)", manifest_fields_ok),
}


def _check_optional_fields(manifest: dict[str, Any], where: str) -> None:
    for key, (expected, ok) in _OPTIONAL_FIELDS.items():
        if key in manifest and not ok(manifest[key]):
            raise PackFormatError(f"{where}: manifest {key} must be {expected}; the pack is damaged")
    if "parts" not in manifest:
        return
    parts = manifest["parts"]
    if manifest["backend"] == "shards":
        good = isinstance(parts, list) and all(
            isinstance(p, dict) and isinstance(p.get("name"), str) and _is_int(p.get("size", 0))
            and isinstance(p.get("sha256", ""), str) for p in parts)
        expected = "a list of {name, size, sha256} shards"
    else:
        good = isinstance(parts, dict) and _is_int(parts.get("chunks")) and _is_int(parts.get("chunk_size"))
        expected = "an object with chunks and chunk_size"
    if not good:
        raise PackFormatError(f"{where}: manifest parts must be {expected}; the pack is damaged")


def shard_parts(manifest: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The manifest's shard list (``parts``), each entry checked to name a plain file, for a shards
    pack's reader wherever the pack lies; a PackFormatError names ``where`` otherwise."""
    parts = manifest.get("parts")
    if not isinstance(parts, list) or not all(isinstance(p, dict) and isinstance(p.get("name"), str)
                                              for p in parts):
        raise PackFormatError(f"{where}: manifest has no valid shard list; the pack is damaged")
    for part in parts:
        name = part["name"]
        if "/" in name or "\\" in name or "\0" in name or name.startswith(".") or not name:
            raise PackFormatError(f"{where}: shard name {name!r} is not a plain file name")
    return parts


def check_listed_size(size: int, listed: int | None, where: str) -> None:
    """A file of the pack must be the size the manifest lists for it (when it lists one): checked
    before the file is read, so that a file grown or swapped for a sparse one of a terabyte is
    refused in one line, not read, mapped or hashed."""
    if listed is not None and size != listed:
        kind = "larger" if size > listed else "smaller"
        raise PackFormatError(f"{where}: {size:,} bytes, {kind} than the {listed:,} the manifest lists; the pack is "
                              "damaged, or the file is not this pack's: copy the pack again")


def skipped_count(manifest: dict[str, Any]) -> int:
    """How many source files were skipped as broken (the manifest lists at most ``SKIPPED_LISTED``)."""
    return int(manifest.get("skipped_count", len(manifest["skipped"])))


def ignored_count(manifest: dict[str, Any]) -> int:
    """How many files were left out as not images (the manifest lists at most ``IGNORED_LISTED``)."""
    return int(manifest.get("ignored_count", len(manifest.get("ignored", []))))


def build_manifest(*, backend: str, encoding: str, source: dict[str, Any], labelled: bool, classes: list[str],
                   labels: np.ndarray, payload_bytes: int, skipped: Sequence[dict[str, Any]],
                   ignored: Sequence[dict[str, Any]], options: dict[str, Any],
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of a new pack (before its writer adds ``parts`` and ``index``), built the same
    way by every writer: ``pack``, ``merge`` and the Ray engine.

    ``labels`` are the records' class indices; ``skipped`` and ``ignored`` are ``{path, reason}``
    entries (other keys are dropped). Long lists are cut to ``SKIPPED_LISTED`` / ``IGNORED_LISTED``
    entries with their full counts beside them (left-out files also counted by reason), so that the
    manifest stays small enough for every reader to parse. ``id`` is new for every pack written: a
    reader that reopens a path notices when it holds another pack than the one it opened."""
    ignored = list(ignored)
    by_reason: dict[str, int] = {}
    for item in ignored:
        by_reason[str(item.get("reason", ""))] = by_reason.get(str(item.get("reason", "")), 0) + 1
    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "id": uuid.uuid4().hex,
        "backend": backend,
        "encoding": encoding,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "packload_version": __version__,
        "source": source,
        "labelled": labelled,
        "classes": list(classes),
        "class_counts": {name: int(n) for name, n in
                         zip(classes, np.bincount(labels[labels >= 0], minlength=len(classes)).tolist(), strict=True)},
        "records": int(len(labels)),
        "payload_bytes": int(payload_bytes),
        "skipped": [{"path": s["path"], "reason": s["reason"]} for s in skipped[:SKIPPED_LISTED]],
        "skipped_count": len(skipped),
        "ignored": [{"path": i["path"], "reason": i["reason"]} for i in ignored[:IGNORED_LISTED]],
        "ignored_count": len(ignored),
        "ignored_by_reason": dict(sorted(by_reason.items())),
        "options": options,
    }
    manifest.update(extra or {})
    return manifest
