"""Cold-cache helpers: drop files from the page cache, and check that it worked.

:func:`evict` writes back dirty pages (``os.sync``) and asks the kernel to drop every file under a
path (``posix_fadvise(DONTNEED)``); it needs no root. :func:`residency` measures how much of each
file is still in memory with ``mincore(2)`` over a fresh read-only mapping. The kernel keeps pages
that a process has mapped (an open LMDB environment, a shard mmap), so a benchmark must close its
readers before evicting; :func:`evict_checked` reports the resident fraction before and after and
says plainly when eviction did not work.
"""

from __future__ import annotations

import mmap
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from packload.diagnose.page_cache import drop, resident_pages

PAGE = mmap.PAGESIZE
EVICTED_BELOW = 0.02  # eviction counts as done when under 2 % of the bytes stay resident

def supported() -> str | None:
    """None when eviction and the residency check can work here, else why not."""
    if not hasattr(os, "posix_fadvise"):
        return f"os.posix_fadvise is not available on {sys.platform}"
    if not sys.platform.startswith("linux"):
        return f"mincore residency check is only implemented for Linux, not {sys.platform}"
    return None


def files_under(paths: Iterable[str | os.PathLike[str]]) -> Iterator[Path]:
    """Every regular file at or under each path (symlinks not followed)."""
    for p in map(Path, paths):
        if p.is_file():
            yield p
        elif p.is_dir():
            for root, _dirs, names in os.walk(p):
                for name in names:
                    f = Path(root) / name
                    if f.is_file() and not f.is_symlink():
                        yield f


def file_residency(path: str | os.PathLike[str]) -> tuple[int, int]:
    """(resident pages, total pages) of one file (``mincore`` via ``packload.diagnose.page_cache``)."""
    return resident_pages(path)


def residency(paths: Iterable[str | os.PathLike[str]]) -> dict[str, Any]:
    """Resident fraction of all files under ``paths`` (by pages), with file and byte counts."""
    resident = total = files = size = 0
    for f in files_under(paths):
        r, t = file_residency(f)
        resident += r
        total += t
        files += 1
        size += f.stat().st_size
    return {"files": files, "bytes": size, "pages": total,
            "resident_fraction": resident / total if total else 0.0}


def evict(paths: Iterable[str | os.PathLike[str]]) -> int:
    """``os.sync()``, then ``POSIX_FADV_DONTNEED`` on every file under ``paths``; returns the file count."""
    os.sync()
    count = 0
    for f in files_under(paths):
        drop(f)
        count += 1
    return count


def evict_checked(paths: Iterable[str | os.PathLike[str]], check: bool = True) -> dict[str, Any]:
    """Evict every file under ``paths`` and report the resident fraction before and after.

    ``evicted`` is True only when under :data:`EVICTED_BELOW` of the pages stay resident; otherwise
    ``note`` says so (for the results, instead of pretending the run was cold).
    """
    paths = [Path(p) for p in paths]
    reason = supported()
    if reason is not None:
        return {"evicted": False, "note": f"cannot evict: {reason}"}
    before = residency(paths) if check else None
    files = evict(paths)
    out: dict[str, Any] = {"files": files}
    if not check:
        out.update(evicted=None, note="eviction not checked")
        return out
    after = residency(paths)
    out.update(bytes=after["bytes"], resident_before=before["resident_fraction"] if before else None,
               resident_after=after["resident_fraction"])
    out["evicted"] = after["resident_fraction"] < EVICTED_BELOW
    if not out["evicted"]:
        out["note"] = (f"eviction failed: {after['resident_fraction']:.0%} of the pages stayed in memory "
                       "(a process may still map these files); this run was NOT cold")
    return out


def warm(paths: Iterable[str | os.PathLike[str]]) -> dict[str, Any]:
    """Read every file under ``paths`` once (so it is in the page cache); returns the residency after."""
    buf = bytearray(8 << 20)
    for f in files_under(paths):
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
    return residency(paths) if supported() is None else {"note": supported()}
