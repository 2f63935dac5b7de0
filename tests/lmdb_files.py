"""LMDB files for the tests of packload's LMDB reader: written by py-lmdb, one transaction, as LMDB
lays them out on this machine (pages of the system's size)."""

from __future__ import annotations

from pathlib import Path

import lmdb


def lmdb_file(path: Path, items: dict[bytes, bytes]) -> bytes:
    """Write ``items`` to a new LMDB file at ``path`` in one transaction; its bytes."""
    env = lmdb.open(str(path), subdir=False, map_size=1 << 26, lock=False)
    with env.begin(write=True) as txn:
        for key, value in items.items():
            txn.put(key, value)
    env.close()
    return path.read_bytes()
