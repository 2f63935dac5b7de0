"""Whether a shards pack at a URL is still the one a reader opened.

An open notes the version of each object listed (``RemoteStore.tags``) and the manifest's hash.
Every later read is pinned to those versions; a read that finds another version, or a fetched
block whose records' CRC-32s are not the index's while the manifest there is another now, means
the pack was packed again (or its objects replaced) under the open reader: ``PackChangedError``,
never another pack's records and never a "damaged" message for what is a replacement. A CRC that
does not match while the manifest there is still the one opened is damage on the store: the block
is kept as it is, and the records' own checks (``verify=True``) report it, as for a local pack.
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np

from packload.core.errors import PackChangedError
from packload.core.format import MANIFEST_NAME
from packload.core.manifest import MANIFEST_LIMIT
from packload.core.remote import RemoteStore

RECORDS_CHECKED = 8  # records of a fetched block whose CRC-32 is compared with the index at most


class ChangedWhileOpening(Exception):
    """The listing, the manifest and the index read at open are not of one pack: open again."""


class PackPin:
    """What an open is pinned to: the version of each object its listing found (``tags``) and the
    sha256 of the manifest it read. ``store`` names the pack; a look at the store now is made
    through a connection of its own."""

    def __init__(self, store: RemoteStore, tags: dict[str, str], manifest_sha256: str) -> None:
        self.store = store
        self.tags = tags
        self.manifest_sha256 = manifest_sha256

    def changed_now(self) -> bool:
        """Whether the manifest at the URL now is another than the one this open read (or is gone):
        by the version listed, else by its bytes."""
        probe = RemoteStore(self.store.url, self.store.storage_options, self.store.timeout)
        listing = probe.listing()
        if MANIFEST_NAME not in listing:
            return True
        then, now = self.tags.get(MANIFEST_NAME), probe.tags.get(MANIFEST_NAME)
        if then and now:
            return then != now
        raw = probe.read_range(MANIFEST_NAME, 0, listing[MANIFEST_NAME]) if listing[MANIFEST_NAME] <= MANIFEST_LIMIT \
            else b""
        return hashlib.sha256(raw).hexdigest() != self.manifest_sha256

    def refuse_if_changed_while_opening(self) -> None:
        """Raise ``ChangedWhileOpening`` when the manifest listed now is not the one read (the
        listing read with it may be of another pack than the manifest)."""
        if self.changed_now():
            raise ChangedWhileOpening

    def error(self) -> PackChangedError:
        """The error of a read that found another pack at the URL than the one opened."""
        return PackChangedError(f"{self.store.shown}: the pack changed since it was opened (it was packed again, or "
                                "its objects replaced); open it again (create the dataset again) to read the pack "
                                "there now")


class BlockCheck:
    """The check of a fetched block of a shard against the index opened: the CRC-32s of a few
    records lying wholly in it."""

    def __init__(self, entries: np.ndarray, pin: PackPin) -> None:
        self.entries = entries
        self.pin = pin
        self._by_part: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def __call__(self, part: int, start: int, data: bytes) -> None:
        """Compare the CRC-32 of a few records lying wholly in a fetched block (``start``: its offset
        in the shard) with the index: bytes of another pack than the one opened raise the pin's
        error; a mismatch while the manifest is still the one opened is damage, left to the records'
        checks."""
        starts, ends, crcs = self._records_of(part)
        first = int(np.searchsorted(starts, start))
        last = int(np.searchsorted(starts, start + len(data)))
        inside = [k for k in range(first, last) if ends[k] <= start + len(data)]
        if len(inside) > RECORDS_CHECKED:
            inside = [inside[round(j * (len(inside) - 1) / (RECORDS_CHECKED - 1))] for j in range(RECORDS_CHECKED)]
        view = memoryview(data)
        for k in inside:
            if zlib.crc32(view[starts[k] - start : ends[k] - start]) != int(crcs[k]):
                if self.pin.changed_now():
                    raise self.pin.error()
                return

    def _records_of(self, part: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(payload starts, payload ends, CRC-32s) of shard ``part``'s records, by start."""
        found = self._by_part.get(part)
        if found is None:
            mine = np.flatnonzero(self.entries["part"] == part)
            starts = self.entries["payload_offset"][mine].astype(np.int64)
            order = np.argsort(starts, kind="stable")
            mine = mine[order]
            found = (starts[order], starts[order] + self.entries["payload_len"][mine].astype(np.int64),
                     self.entries["payload_crc32"][mine].astype(np.int64))
            self._by_part[part] = found
        return found
