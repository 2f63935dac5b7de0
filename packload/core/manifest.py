"""The manifest of a pack, defined once: the JSON object that describes the whole pack, how every
writer builds it (``build_manifest``), how it is written (``encode_manifest``) and how every reader
checks it before trusting anything in it (``decode_manifest``). ``docs/FORMAT.md`` lists its fields.

In Python a manifest is a ``Manifest``: the JSON object as a ``dict`` (so it is encoded, compared and
subscripted as before), with a typed, read-only property for each field, which gives the field's
default where an older pack lacks it. This module is the only one that spells a manifest's keys:
everywhere else reads ``manifest.records``, ``manifest.skipped_count``, ``manifest.shards``, and
writers add what they write after the records through ``manifest.parts``, ``manifest.index`` and
``manifest.fields`` (``tests/core/test_manifest.py`` holds the rest of the code to it)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
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


class Manifest(dict[str, Any]):
    """A pack's manifest: the JSON object itself (a ``dict``, so ``json``, ``==`` and
    ``manifest["records"]`` work as on the object read), with a typed property for every field
    ``docs/FORMAT.md`` lists. A property gives the field's documented default when the manifest lacks
    it (an older pack's); a field with no default gives None (or an empty object or list where that
    says the same). ``decode_manifest`` has checked each field's type before any of them is read.

    Writers set what they write after ``build_manifest``: ``parts``, ``index`` and ``fields``."""

    __slots__ = ()

    def copy(self) -> Manifest:
        """A shallow copy, itself a ``Manifest`` (``dict.copy`` would give a plain dict)."""
        return Manifest(self)

    # -- what the pack is ----------------------------------------------------------------------
    @property
    def format(self) -> str:
        """Always ``FORMAT_NAME`` in a manifest of packload's."""
        return str(self["format"])

    @property
    def version(self) -> int:
        """The format version (``FORMAT_VERSION``)."""
        return int(self["version"])

    @property
    def backend(self) -> str:
        """``"shards"`` or ``"lmdb"``."""
        return str(self["backend"])

    @property
    def encoding(self) -> str:
        """How the payloads were made: ``"keep"``, ``"jpeg"``, ``"png"`` or ``"raw"``."""
        return str(self["encoding"])

    @property
    def id(self) -> str | None:
        """New for every pack written (32 hex digits); None in a pack written before it existed."""
        return self.get("id")

    @property
    def created(self) -> str | None:
        """UTC time of packing, ISO 8601; None where it is not noted."""
        return self.get("created")

    @property
    def packload_version(self) -> str | None:
        """The version of packload that wrote the pack; None where it is not noted."""
        return self.get("packload_version")

    @property
    def source(self) -> dict[str, Any]:
        """``{name, files, bytes}`` of the source packed; ``{}`` where it is not noted."""
        return self.get("source", {})

    @property
    def options(self) -> dict[str, Any]:
        """How the pack was packed (``backend``, ``encoding``, ``quality``, ...); ``{}`` where not noted."""
        return self.get("options", {})

    @property
    def merged_from(self) -> list[dict[str, Any]]:
        """A merged pack's inputs, in order, ``{name, records, classes, index_sha256}``; ``[]`` otherwise."""
        return self.get("merged_from", [])

    # -- the records ---------------------------------------------------------------------------
    @property
    def records(self) -> int:
        """The number of records (the index's count)."""
        return int(self["records"])

    @property
    def classes(self) -> list[str]:
        """The class names a record's label indexes (``[]`` in an unlabelled pack)."""
        return self["classes"]

    @property
    def labelled(self) -> bool:
        """False when the source had no class folders (every label is -1); without the field, a pack
        is labelled when it has classes."""
        return bool(self.get("labelled", bool(self.classes)))

    @property
    def class_counts(self) -> dict[str, int] | None:
        """Records per class name; None where the manifest does not count them (nothing to check)."""
        return self.get("class_counts")

    @property
    def payload_bytes(self) -> int | None:
        """The sum of the records' payload lengths; None where it is not noted."""
        return self.get("payload_bytes")

    # -- what was not packed ---------------------------------------------------------------------
    @property
    def skipped(self) -> list[dict[str, Any]]:
        """Image files found but not packed, ``{path, reason}``, in scan order (at most ``SKIPPED_LISTED``)."""
        return self["skipped"]

    @property
    def skipped_count(self) -> int:
        """How many source files were skipped as broken (``skipped`` lists at most ``SKIPPED_LISTED``);
        without the field, as many as ``skipped`` lists."""
        return int(self.get("skipped_count", len(self.skipped)))

    @property
    def ignored(self) -> list[dict[str, Any]]:
        """Entries of the source left out (not images, hidden, ...), ``{path, reason}``, sorted by path
        (at most ``IGNORED_LISTED``); ``[]`` where they are not noted."""
        return self.get("ignored", [])

    @property
    def ignored_count(self) -> int:
        """How many entries were left out; without the field, as many as ``ignored`` lists."""
        return int(self.get("ignored_count", len(self.ignored)))

    @property
    def ignored_by_reason(self) -> dict[str, int]:
        """Entries left out, counted by reason; without the field, counted from ``ignored``."""
        counted = self.get("ignored_by_reason")
        if isinstance(counted, dict):
            return {str(reason): int(count) for reason, count in counted.items()}
        counts: dict[str, int] = {}
        for item in self.ignored:
            reason = str(item.get("reason", ""))
            counts[reason] = counts.get(reason, 0) + 1
        return counts

    # -- the parts, index and fields, which writers add after building --------------------------
    @property
    def parts(self) -> list[dict[str, Any]] | dict[str, Any] | None:
        """A shards pack's list of shards (see ``shards``), an LMDB pack's ``{chunks, chunk_size}``
        (see ``chunks``); None before a writer has set it."""
        return self.get("parts")

    @parts.setter
    def parts(self, value: list[dict[str, Any]] | dict[str, Any]) -> None:
        self["parts"] = value

    @property
    def shards(self) -> list[dict[str, Any]]:
        """A shards pack's shards, in part order: ``{name, size, sha256, records}`` each; ``[]`` when
        ``parts`` is not a list (an LMDB pack). ``shard_parts`` checks each names a plain file."""
        parts = self.parts
        return parts if isinstance(parts, list) else []

    @property
    def chunks(self) -> int | None:
        """An LMDB pack's number of chunks; None when ``parts`` is not an object (a shards pack)."""
        parts = self.parts
        return int(parts["chunks"]) if isinstance(parts, dict) and "chunks" in parts else None

    @property
    def chunk_size(self) -> int | None:
        """An LMDB pack's target bytes per chunk; None when ``parts`` is not an object."""
        parts = self.parts
        return int(parts["chunk_size"]) if isinstance(parts, dict) and "chunk_size" in parts else None

    @property
    def index(self) -> dict[str, Any]:
        """``{name, size, sha256}`` of the index (see ``index_entry``); ``{}`` where it is missing."""
        return self.get("index", {})

    @index.setter
    def index(self, value: dict[str, Any]) -> None:
        self["index"] = value

    @property
    def fields(self) -> dict[str, Any]:
        """A pack made from a table: its fields part's ``{name, size, sha256, columns, ...}``
        (docs/FORMAT.md, Fields); ``{}`` for a pack without a table."""
        return self.get("fields", {})

    @fields.setter
    def fields(self, value: dict[str, Any]) -> None:
        self["fields"] = value


def is_packload_manifest(value: Any) -> bool:
    """Whether the parsed JSON ``value`` is a manifest of packload's (an object whose ``format`` is
    ours): what tells a pack of ours from anything else before replacing it."""
    return isinstance(value, dict) and value.get("format") == FORMAT_NAME


def index_entry(name: str, index: bytes) -> dict[str, Any]:
    """The manifest's ``index`` object for the index ``index`` stored as ``name``."""
    return {"name": name, "size": len(index), "sha256": hashlib.sha256(index).hexdigest()}


def encode_manifest(manifest: Mapping[str, Any]) -> bytes:
    """The manifest as UTF-8 JSON bytes (sorted keys, so equal packs give equal manifests)."""
    return (json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def decode_manifest(raw: bytes, where: str) -> Manifest:
    """Parse and check a manifest: it must be ours, of a version we read, and well formed (and no
    larger than ``MANIFEST_LIMIT``: checked before parsing). Every field the ``Manifest``'s
    properties read is checked here, so that none of them meets a value of the wrong type."""
    if len(raw) > MANIFEST_LIMIT:
        raise PackFormatError(f"{where}: manifest of {len(raw):,} bytes, more than the {MANIFEST_LIMIT:,} a "
                              "packload manifest may take; the pack is damaged or not a packload pack")
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, integers too long
        raise PackFormatError(f"{where}: manifest is not valid JSON ({type(exc).__name__}); "
                              "the pack is damaged") from None
    if not is_packload_manifest(manifest):
        raise PackFormatError(f"{where}: not a packload manifest (format is "
                              f"{manifest.get('format') if isinstance(manifest, dict) else type(manifest).__name__!r})")
    manifest = Manifest(manifest)
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
    if len(manifest.skipped) > manifest.skipped_count or len(manifest.ignored) > manifest.ignored_count:
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


def shard_parts(manifest: Manifest, where: str) -> list[dict[str, Any]]:
    """The manifest's shard list (``parts``), each entry checked to name a plain file, for a shards
    pack's reader wherever the pack lies; a PackFormatError names ``where`` otherwise."""
    parts = manifest.parts
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


def build_manifest(*, backend: str, encoding: str, source: dict[str, Any], labelled: bool, classes: list[str],
                   labels: np.ndarray, payload_bytes: int, skipped: Sequence[dict[str, Any]],
                   ignored: Sequence[dict[str, Any]], options: dict[str, Any],
                   skipped_count: int | None = None, ignored_count: int | None = None,
                   ignored_by_reason: dict[str, int] | None = None,
                   merged_from: list[dict[str, Any]] | None = None) -> Manifest:
    """The manifest of a new pack (before its writer adds ``parts`` and ``index``), built the same
    way by every writer: ``pack``, ``merge`` and the Ray engine.

    ``labels`` are the records' class indices; ``skipped`` and ``ignored`` are ``{path, reason}``
    entries (other keys are dropped). Long lists are cut to ``SKIPPED_LISTED`` / ``IGNORED_LISTED``
    entries with their full counts beside them (left-out files also counted by reason), so that the
    manifest stays small enough for every reader to parse. ``id`` is new for every pack written: a
    reader that reopens a path notices when it holds another pack than the one it opened.

    ``merge`` gives the counts itself (``skipped_count``, ``ignored_count``, ``ignored_by_reason``:
    its inputs' lists were cut already, their counts are summed) and its inputs (``merged_from``)."""
    ignored = list(ignored)
    by_reason: dict[str, int] = {}
    for item in ignored:
        by_reason[str(item.get("reason", ""))] = by_reason.get(str(item.get("reason", "")), 0) + 1
    manifest = Manifest({
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
        "skipped_count": len(skipped) if skipped_count is None else skipped_count,
        "ignored": [{"path": i["path"], "reason": i["reason"]} for i in ignored[:IGNORED_LISTED]],
        "ignored_count": len(ignored) if ignored_count is None else ignored_count,
        "ignored_by_reason": dict(sorted((by_reason if ignored_by_reason is None else ignored_by_reason).items())),
        "options": options,
    })
    if merged_from is not None:
        manifest["merged_from"] = merged_from
    return manifest
