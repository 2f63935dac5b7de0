"""The walk over the block cache's folders that finds what its entries take, and the deletions that make room.

Only what the cache recorded is ever counted as an entry and deleted (a ``.blk`` with its ``.rec``,
in a pack folder of the cache), and the unfinished writes of processes that are gone; a write under
way is counted, never deleted. The least recently used entries (by their bytes' modification time,
which a read touches) go first.
"""

from __future__ import annotations

import os
import stat
import time

from packload.loaders.cache_entries import DATA_SUFFIX, ENTRY, RECORD_SUFFIX, TMP, read_record
from packload.loaders.cache_folder import CacheFolder

STALE_SECONDS = 600  # an unfinished write of a process that is gone, this old, is deleted

Entry = tuple[float, str, str, int]  # (last use, pack folder, name, bytes)


def recorded_entries(place: CacheFolder) -> list[Entry]:
    """(last use, pack folder, name, bytes) of every entry the cache recorded (its bytes and its
    record), and of every unfinished write of a process that is gone (name with its suffix)."""
    found: list[Entry] = []
    for pack, folder in place.pack_folders():
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        present = set(names)
        for item in names:
            if item.endswith(RECORD_SUFFIX) and ENTRY.fullmatch(item[: -len(RECORD_SUFFIX)]):
                found += _recorded(folder, pack, item[: -len(RECORD_SUFFIX)], present)
            elif TMP.fullmatch(item):
                found += _abandoned(folder, pack, item)
    return found


def writing_bytes(place: CacheFolder) -> int:
    """Bytes of the writes under way now (their temporary files, room already claimed): counted
    by a walk, never deleted by it."""
    total = 0
    for _, folder in place.pack_folders():
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for item in names:
            match = TMP.fullmatch(item)
            if match and match.group(2) == "blk":
                try:
                    info = os.stat(item, dir_fd=folder, follow_symlinks=False)
                except OSError:
                    continue
                if _alive(int(match.group(3))) or time.time() - info.st_mtime < STALE_SECONDS:
                    total += info.st_size
    return total


def delete_oldest(place: CacheFolder, entries: list[Entry], total: int, target: int) -> int:
    """Delete the least recently used of ``entries`` (which take ``total`` bytes with the writes
    under way) until ``target`` bytes or fewer are left; the bytes left."""
    for _, pack, name, length in sorted(entries):
        if total <= target:
            break
        folder = place.pack_fd(pack, create=False)
        if folder is None:
            continue
        gone = False
        for suffix in (DATA_SUFFIX, RECORD_SUFFIX) if ENTRY.fullmatch(name) else ("",):
            try:
                os.unlink(name + suffix, dir_fd=folder)
                gone = True
            except FileNotFoundError:
                gone = True
            except OSError:
                pass
        if gone:
            total -= length
    return total


def _recorded(folder: int, pack: str, name: str, present: set[str]) -> list[Entry]:
    record = read_record(folder, name)
    if record is None:
        return []
    try:
        kept = os.stat(name + RECORD_SUFFIX, dir_fd=folder, follow_symlinks=False).st_size
    except OSError:
        return []
    if name + DATA_SUFFIX not in present:  # the writer died between its record and its bytes
        return [(0.0, pack, name, kept)]
    try:
        info = os.stat(name + DATA_SUFFIX, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return []
    if not stat.S_ISREG(info.st_mode):
        return []
    return [(info.st_mtime, pack, name, info.st_size + kept)]


def _abandoned(folder: int, pack: str, item: str) -> list[Entry]:
    """An unfinished write ``item`` whose process is gone and which is old: (0, pack, item, bytes)."""
    match = TMP.fullmatch(item)
    assert match is not None
    pid = int(match.group(3))
    try:
        info = os.stat(item, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return []
    if not stat.S_ISREG(info.st_mode) or time.time() - info.st_mtime < STALE_SECONDS or _alive(pid):
        return []
    return [(0.0, pack, item, info.st_size)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
