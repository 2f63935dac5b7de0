"""A finished Ray task folder read back: its manifest and index as a ``ShardSource``.

A task of ``pack --engine ray`` packs its range into a folder of its own (a small shards pack);
placing it into the pack, joining it into an LMDB file, or placing a task staged on an object store
(downloaded first) all start from what that folder holds. Kept apart from the tasks themselves so
that the local tasks (``ray_tasks``) and the URL ones (``ray_url_tasks``) both use it and neither
imports the other's module for it.
"""

from __future__ import annotations

from pathlib import Path

from packload.core.format import INDEX_NAME, MANIFEST_NAME, decode_index
from packload.core.manifest import decode_manifest
from packload.packer.combine import ShardSource


def task_source(folder: Path) -> ShardSource:
    """The task pack in ``folder`` (its ``manifest.json`` and index; the shards stay where they are)
    as the source ``place_shards`` renumbers and the LMDB join copies from."""
    manifest = decode_manifest((folder / MANIFEST_NAME).read_bytes(), str(folder / MANIFEST_NAME))
    entries, paths = decode_index((folder / INDEX_NAME).read_bytes(), str(folder / INDEX_NAME))
    return ShardSource(folder, manifest.shards, entries, paths)
