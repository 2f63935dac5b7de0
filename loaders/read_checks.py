"""What a reader checks of a pack's index before it trusts it: that it agrees with the manifest
(counts, labels inside the classes) and with itself, and, where asked, its sha256."""

from __future__ import annotations

import hashlib

import numpy as np

from packload.core.errors import ChecksumError, PackFormatError
from packload.core.format import check_entries
from packload.core.manifest import Manifest


def check_index_agrees(manifest: Manifest, entries: np.ndarray, where: str) -> None:
    """The index ``entries`` must agree with ``manifest`` (counts, labels) and with itself."""
    records = len(entries)
    classes = list(manifest.classes)
    if records != manifest.records:
        raise PackFormatError(f"{where}: manifest says {manifest.records} records, "
                              f"index holds {records}; the pack is damaged")
    labels = entries["label"]
    unlabelled = not classes or not manifest.labelled
    if records and (int(labels.min()) < -1 or int(labels.max()) >= max(1, len(classes))
                    or (unlabelled and int(labels.max()) != -1)
                    or (not unlabelled and int(labels.min()) < 0)):
        raise PackFormatError(f"{where}: index holds labels outside the manifest's "
                              f"{len(classes)} classes; the pack is damaged")
    check_entries(entries, manifest.encoding, where)


def check_index_digest(manifest: Manifest, index: bytes, where: str) -> None:
    """The index's bytes must have the sha256 the manifest lists."""
    if hashlib.sha256(index).hexdigest() != manifest.index.get("sha256"):
        raise ChecksumError(f"{where}: the index does not match the sha256 in the manifest; the pack "
                            "is damaged: re-copy it, or run `packload verify` on it")
