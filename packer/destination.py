"""Where ``pack``, ``pack --engine ray`` and ``merge`` write, and what they may replace there.

Every one of them writes ``DEST.partial`` and renames it to ``DEST`` once it is complete. Before
anything at ``DEST`` is looked at it takes the destination's lock (``DestinationLock``): one
writer per destination, any other is refused at once. ``check_destination`` then decides whether
``DEST`` may be written:

* ``DEST`` must have a name (not ``.``, ``..`` or ``/``), in a folder that exists and can be written.
* ``DEST`` (and every name beside it that the command writes) must not be any input, lie inside
  one or hold one, compared as real paths: a link to the source, or a source reached through a
  link, counts as the source.
* An existing ``DEST`` needs ``--overwrite``, which replaces only *a pack*: a shards folder that
  holds only pack files (``manifest.json``, ``index.bin``, ``shard-NNNNN.bin``, ``progress.json``)
  and a manifest or progress record of packload's, or an LMDB file that holds packload's
  ``#manifest`` or ``#progress`` key. A symbolic link, any other folder or file (a user's own LMDB
  database among them) is refused, never deleted.
* An existing ``DEST.partial`` must be an unfinished pack of packload's (the same files, or task
  folders of them; an LMDB file of packload's keys only); anything else there is refused.

``publish`` checks again, just before the rename, that what it moves aside is a pack.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from packload.core.errors import PackFormatError, UsageError, WriteError
from packload.core.format import (
    FIELDS_NAME,
    INDEX_NAME,
    LMDB_CHUNK_PREFIX,
    LMDB_FIELDS_KEY,
    LMDB_INDEX_KEY,
    LMDB_MANIFEST_KEY,
    MANIFEST_NAME,
    PARTIAL_SUFFIX,
    PROGRESS_KEY,
    PROGRESS_NAME,
    RAY_RUN_NAME,
    SHARD_NAME_PATTERN,
    TASK_DONE_NAME,
    TASK_PLACED_NAME,
)
from packload.core.lmdb_meta import starts_as_lmdb
from packload.core.lmdb_pages import file_keys
from packload.core.manifest import MANIFEST_LIMIT, is_packload_manifest
from packload.core.safe_files import read_regular
from packload.core.storage import unwritable_reason
from packload.packer.write_shards import fsync_dir

LOCK_SUFFIX = ".lock"
LMDB_LOCK_SUFFIX = "-lock"  # the lock file LMDB keeps beside a file it writes
_OUR_FILES = (MANIFEST_NAME, INDEX_NAME, FIELDS_NAME, PROGRESS_NAME, RAY_RUN_NAME, TASK_DONE_NAME, TASK_PLACED_NAME)
_PACK_FILE = re.compile(f"({'|'.join(map(re.escape, _OUR_FILES))}|{SHARD_NAME_PATTERN})"
                        r"(\.tmp)?")
_TASK_DIR = re.compile(r"task-\d{5,}|\.input-\d+")  # Ray's task folders, merge's staging folders
_OUR_KEYS = (LMDB_MANIFEST_KEY, LMDB_INDEX_KEY, LMDB_FIELDS_KEY, PROGRESS_KEY)


def partial_path(dst: Path) -> Path:
    """Where an unfinished pack of ``dst`` is written: ``DEST.partial``."""
    return dst.with_name(dst.name + PARTIAL_SUFFIX)


def lock_path(dst: Path) -> Path:
    """The lock file of ``dst``: ``DEST.lock``, beside it."""
    return dst.with_name(dst.name + LOCK_SUFFIX)


def lmdb_lock_path(path: Path) -> Path:
    return Path(str(path) + LMDB_LOCK_SUFFIX)


def system_reason(exc: BaseException) -> str:
    """The operating system's (or LMDB's) words for ``exc``, without the path it repeats."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip() or type(exc).__name__
    head, sep, tail = text.partition(": ")
    return tail if sep and os.sep in head else text  # py-lmdb writes "PATH: reason"


def creation_error(path: Path, exc: BaseException) -> WriteError:
    """The one-line error for a destination that could not be created."""
    why = unwritable_reason(path.parent if str(path.parent) else ".")
    if why:
        return WriteError(f"{path}: cannot create it: {why}; choose a destination on a disk you can write to")
    return WriteError(f"{path}: cannot create it ({system_reason(exc)}); choose a destination in a folder you "
                      "can write to, on a disk with free space")


# -- names and places -------------------------------------------------------------------------
def check_name(dst: Path) -> None:
    """Refuse a destination without a name of its own: ``.``, ``..``, ``/``, ``dir/..``."""
    if dst.name in ("", ".", "..") or os.path.basename(os.path.normpath(dst)) in ("", ".", ".."):
        raise UsageError(f"{dst}: names an existing folder, not a new pack; give the pack a name of its own, "
                         "for example out/images.shards")


def check_parent(dst: Path) -> None:
    """The folder ``dst`` goes into must exist and be writable."""
    parent = dst.parent if str(dst.parent) else Path(".")
    why = unwritable_reason(parent)
    if why:
        raise UsageError(f"{dst}: cannot be written there: {why}; choose a destination on a disk you can write to")
    if not parent.is_dir():
        raise UsageError(f"{dst}: the folder {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{dst}: cannot write in {parent}; choose a destination you can write to")


def real_place(path: Path) -> Path:
    """``path`` as a real path, its last component not followed (the name itself is what is replaced)."""
    parent = path.parent if str(path.parent) else Path(".")
    return parent.resolve() / path.name


def written_names(dst: Path) -> list[Path]:
    """Every name beside ``dst`` that writing it may create, replace or delete."""
    tmp = partial_path(dst)
    return [dst, tmp, dst.with_name(dst.name + ".partial-tasks"), lock_path(dst), lmdb_lock_path(tmp)]


def _identities(path: Path) -> list[tuple[int, int] | None]:
    """(device, inode) of ``path`` and of each folder above it, nearest first (None where absent)."""
    out: list[tuple[int, int] | None] = []
    for place in (path, *path.parents):
        try:
            info = os.stat(place)
            out.append((info.st_dev, info.st_ino))
        except OSError:
            out.append(None)
    return out


def _relation(place: Path, real: Path) -> str | None:
    """How the name ``place`` stands to the input ``real`` (both real paths): "is", "inside",
    "holds", or None. Compared by path, then by (device, inode), which also sees through bind
    mounts and file systems that ignore case."""
    if place == real:
        return "is"
    if place.is_relative_to(real):
        return "inside"
    if real.is_relative_to(place):
        return "holds"
    mine, theirs = _identities(place), _identities(real)
    if os.path.lexists(place) and not os.path.islink(place) and mine[0] is not None:
        if mine[0] == theirs[0]:
            return "is"
        if mine[0] in theirs[1:]:
            return "holds"
    if theirs[0] is not None and theirs[0] in mine[1:]:
        return "inside"
    return None


def check_apart(dst: Path, inputs: Sequence[Path], role: str) -> None:
    """Refuse a destination that is one of ``inputs`` (``role``: "the source folder", "the input
    pack"), lies inside one, or holds one, or where any name written beside it would: compared as
    real paths and as files, so links, ``..`` and relative paths do not hide it."""
    for written in written_names(dst):
        place = real_place(written)
        for given in inputs:
            relation = _relation(place, Path(os.path.realpath(given)))
            shown = f"{dst}" if written == dst else f"{dst} (its {written.name})"
            if relation == "is":
                raise UsageError(f"{shown}: is {role} {given} itself; write the pack somewhere else")
            if relation == "inside":
                raise UsageError(f"{shown}: is inside {role} {given}; nothing may be written inside it: "
                                 "write the pack somewhere else")
            if relation == "holds":
                raise UsageError(f"{shown}: holds {role} {given}; replacing it would delete it: write the pack "
                                 "somewhere else")


# -- what is a pack ---------------------------------------------------------------------------
def _is_our_json(path: Path, ours: Callable[[bytes], bool]) -> bool:
    """Whether the file ``path`` is a JSON object of packload's, as ``ours`` tells from its bytes: a
    manifest (``is_our_manifest``) or a progress record (``is_our_progress``)."""
    try:
        raw = read_regular(path, limit=MANIFEST_LIMIT)
    except OSError:
        return False
    return ours(raw)


def _folder_problem(folder: Path, partial: bool) -> str | None:
    """Why the folder ``folder`` is not a shards pack of packload's (None when it is)."""
    names: set[str] = set()
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_symlink():
                    return f"holds a symbolic link, {entry.name!r}"
                if entry.is_dir(follow_symlinks=False):
                    if not partial or not _TASK_DIR.fullmatch(entry.name):
                        return f"holds a folder, {entry.name!r}, which no pack holds"
                    problem = _folder_problem(Path(entry.path), partial=True)
                    if problem:
                        return f"{entry.name}/ {problem}"
                elif not entry.is_file(follow_symlinks=False) or not _PACK_FILE.fullmatch(entry.name):
                    return f"holds {entry.name!r}, which is not a pack file"
                names.add(entry.name)
    except OSError as exc:
        return f"cannot be read ({system_reason(exc)})"
    if partial:
        return None
    if MANIFEST_NAME in names and _is_our_json(folder / MANIFEST_NAME, is_our_manifest):
        return None
    if PROGRESS_NAME in names and _is_our_json(folder / PROGRESS_NAME, is_our_progress):
        return None
    return "holds no manifest.json of packload's"


def _lmdb_problem(path: Path, size: int, partial: bool) -> str | None:
    """Why the file ``path`` is not an LMDB pack of packload's (None when it is)."""
    if size == 0:
        return None if partial else "is an empty file"
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as exc:
        return f"cannot be read ({system_reason(exc)})"
    if not starts_as_lmdb(head):
        return "is a file but not an LMDB file"
    import lmdb

    try:
        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, create=False, readahead=False)
    except lmdb.Error as exc:  # open in this process already (a dataset reads it), or not LMDB after all
        return _keys_problem(path, partial, exc)
    try:
        with env.begin(buffers=True) as txn:
            manifest = txn.get(LMDB_MANIFEST_KEY)
            if manifest is not None and _is_manifest_bytes(bytes(manifest)):
                return None
            if txn.get(PROGRESS_KEY) is not None:
                return None
            if partial and all(_our_key(bytes(key)) for key in txn.cursor().iternext(keys=True, values=False)):
                return None
    except lmdb.Error as exc:
        return f"cannot be read as LMDB ({system_reason(exc)})"
    finally:
        env.close()
    return "is an LMDB database without packload's #manifest (someone else's database)"


def _keys_problem(path: Path, partial: bool, error: Exception) -> str | None:
    """``_lmdb_problem`` from the file's keys alone, read from its pages (``lmdb_pages.file_keys``):
    for a file that py-lmdb would not open (``error``)."""
    try:
        keys = set(file_keys(str(path)))
    except (OSError, PackFormatError) as exc:
        return f"cannot be opened as LMDB ({system_reason(error)}; {exc})"
    if LMDB_MANIFEST_KEY in keys or PROGRESS_KEY in keys or (partial and all(map(_our_key, keys))):
        return None
    return "is an LMDB database without packload's #manifest (someone else's database)"


def is_pack_file_name(name: str) -> bool:
    """Whether ``name`` is one that packload writes in a pack folder (a temporary one included)."""
    return bool(_PACK_FILE.fullmatch(name))


def is_task_folder_name(name: str) -> bool:
    """Whether ``name`` is one of the folders an unfinished pack holds (Ray's tasks, merge's inputs)."""
    return bool(_TASK_DIR.fullmatch(name))


def is_our_manifest(raw: bytes) -> bool:
    """Whether ``raw`` is a manifest of packload's (JSON whose ``format`` is ours)."""
    return _is_manifest_bytes(raw)


def is_our_progress(raw: bytes) -> bool:
    """Whether ``raw`` is a progress record of packload's (a JSON object with ``options``)."""
    try:
        record = json.loads(raw) if len(raw) <= MANIFEST_LIMIT else None
    except (ValueError, RecursionError):
        return False
    return isinstance(record, dict) and "options" in record


def is_our_lmdb_key(key: bytes) -> bool:
    """Whether ``key`` is one that packload writes in an LMDB pack."""
    return _our_key(key)


def _is_manifest_bytes(raw: bytes) -> bool:
    try:
        record = json.loads(raw) if len(raw) <= MANIFEST_LIMIT else None
    except (ValueError, RecursionError):
        return False
    return is_packload_manifest(record)


def _our_key(key: bytes) -> bool:
    return key in _OUR_KEYS or (len(key) == len(LMDB_CHUNK_PREFIX) + 8 and key.startswith(LMDB_CHUNK_PREFIX))


def not_a_pack(path: Path, partial: bool = False) -> str | None:
    """Why ``path`` (which exists; not followed if it is a link) is not a pack of packload's, in a
    few words; None when it is one. ``partial``: judge it as an unfinished ``DEST.partial``, which
    may lack a manifest but must still hold nothing but what packload writes."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot be examined ({system_reason(exc)})"
    if stat.S_ISLNK(info.st_mode):
        return f"is a symbolic link (to {os.readlink(path)})"
    if stat.S_ISDIR(info.st_mode):
        return _folder_problem(path, partial)
    if stat.S_ISREG(info.st_mode):
        return _lmdb_problem(path, info.st_size, partial)
    return "is not a regular file or folder"


def exists(path: Path) -> bool:
    """Whether anything is at ``path``, a dangling link included."""
    return os.path.lexists(path)


def check_destination(dst: Path, overwrite: bool) -> None:
    """Refuse an existing ``dst`` without ``overwrite``, and with it anything there but a pack.
    Call with the destination's lock held."""
    if not exists(dst):
        return
    if not overwrite:
        raise UsageError(f"{dst}: already exists; add --overwrite to replace it, or choose another name")
    problem = not_a_pack(dst)
    if problem:
        raise UsageError(f"{dst}: {problem}: not a pack, so --overwrite leaves it alone (it replaces only packs "
                         "written by packload); remove it yourself, or choose another name")


def check_partial(tmp: Path) -> bool:
    """Whether an unfinished pack of ours is at ``tmp``; refuses anything else there."""
    lock = lmdb_lock_path(tmp)
    if os.path.islink(lock) or (exists(lock) and not os.path.isfile(lock)):
        raise UsageError(f"{lock}: is not an LMDB lock file; move it away, or choose another name for the pack")
    if not exists(tmp):
        lock.unlink(missing_ok=True)  # LMDB's lock file of a partial that is gone: nothing to keep
        return False
    problem = not_a_pack(tmp, partial=True)
    if problem:
        raise UsageError(f"{tmp}: {problem}: not an unfinished pack of packload's, so it is left alone; move it "
                         "away, or choose another name for the pack")
    return True


# -- replacing and removing -------------------------------------------------------------------
def remove_ours(path: Path) -> None:
    """Delete the pack or unfinished pack at ``path`` (already recognised) and its LMDB lock file."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif exists(path):
        os.unlink(path)
    lmdb_lock_path(path).unlink(missing_ok=True)


def _aside_name(dst: Path) -> Path:
    for k in range(1000):
        old = dst.with_name(f"{dst.name}.old-{os.getpid()}" + (f"-{k}" if k else ""))
        if not exists(old):
            return old
    raise UsageError(f"{dst}: too many {dst.name}.old-* names beside it; remove them")


def publish(tmp: Path, dst: Path) -> None:
    """Rename the finished pack ``tmp`` to ``dst``, replacing an old pack there only once the new one
    is whole, and only if it is a pack (checked again now: it may have changed since the start)."""
    old = None
    if exists(dst):
        problem = not_a_pack(dst)
        if problem:
            raise UsageError(f"{dst}: {problem} (it changed while the pack was written): not a pack, so it is "
                             f"left alone; the new pack is at {tmp}: move it into place yourself")
        old = _aside_name(dst)
        os.replace(dst, old)
    os.replace(tmp, dst)
    fsync_dir(dst.parent if str(dst.parent) else Path("."))
    if old is not None:
        remove_ours(old)
