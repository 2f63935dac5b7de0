"""Write a pack's images back out as an ImageFolder tree.

For a ``keep`` pack every file comes back byte for byte under its original relative path. For a
re-encoded pack the stored images come back (``raw`` ones as lossless PNG), with the file suffix
changed to match the stored format (a suffix that already names it, such as ``.JPEG``, is kept).

Every record becomes its own file, or nothing is written:

* Names are worked out for all records before anything is written. When a changed suffix would
  give a record the name another record has or gets (``a.jpg`` stored as PNG and ``a.png``), the
  record whose suffix changes keeps its whole original name and gains the new suffix
  (``a.jpg.png``); such records are listed under ``renamed`` in the summary. Names that still
  collide (two records with one stored path, in a crafted pack) are refused with one line.
* On a file system that folds case (``A.png`` and ``a.png`` are one file) names are compared
  case-insensitively: suffix changes are renamed as above, and records whose original names
  differ only in case are refused (there is no name that keeps both). A second guard catches
  what the comparison cannot foresee (a folder that folds case on its own, Unicode forms): no
  file written by this unpack is ever replaced by a later record of it; that is an error.

Nothing is written outside ``OUT`` whatever it holds: record paths that would escape it are
refused, ``OUT`` must not be a symbolic link, and every folder below it is opened through its
parent's descriptor without following links (a link there is refused). Each file is written under
a temporary name in its folder and renamed over its final name, so a link at the final name is
replaced, never followed, and no half-written file ever has a final name.

A new ``OUT`` is written into a temporary sibling folder (``OUT.XXXXXXXX.partial``) that is renamed
into place when every record is written, and removed on error, so an interrupted unpack leaves no
folder that looks finished (only a process killed outright can leave the ``.partial`` folder).
An existing empty folder is written in place and emptied again on error; with ``overwrite`` an
existing non-empty folder is written in place, each same-named file replaced atomically.
"""

from __future__ import annotations

import io
import os
import secrets
import shutil
import stat
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from PIL import Image

from packload.core.display import terminal_safe
from packload.core.errors import PackFormatError, UsageError
from packload.core.pack_download import download_pack
from packload.core.progress import progress_bar
from packload.core.remote import is_url
from packload.core.storage import unwritable_reason
from packload.loaders.fields import table_text
from packload.loaders.no_follow_writes import DIR_FLAGS, NEW_FILE_FLAGS, FolderChain, write_replacing
from packload.loaders.read import PackReader

_SUFFIX = {"JPEG": ".jpg", "PNG": ".png", "raw": ".png"}
_FITTING = {"JPEG": {".jpg", ".jpeg", ".jpe", ".jfif"}, "PNG": {".png"}, "raw": {".png"}}  # kept as they are


def safe_relative_path(path: str) -> PurePosixPath:
    """``path`` if it stays inside the output folder; ``PackFormatError`` for absolute paths, ``..``
    or empty parts (a hostile or damaged pack)."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or "\\" in path or "\0" in path or any(
            part in ("", ".", "..") for part in path.split("/")):
        raise PackFormatError(f"record path {path!r} would escape the output folder; refusing to unpack it")
    return pure


@dataclass(frozen=True)
class Target:
    """Where one record is written: its relative path below ``OUT`` and whether the collision
    rule renamed it (its original name plus the new suffix)."""

    path: PurePosixPath
    renamed: bool = False


def _preferred(rel: PurePosixPath, fmt: str | None) -> PurePosixPath:
    """``rel`` with the suffix of the stored format ``fmt`` (None: a ``keep`` pack, as stored)."""
    if fmt is None or fmt not in _SUFFIX or rel.suffix.lower() in _FITTING[fmt]:
        return rel
    return rel.with_suffix(_SUFFIX[fmt])


def plan_targets(paths: Sequence[str], formats: Sequence[str] | None = None,
                 fold_case: bool = False) -> list[Target]:
    """The file each record is written to, every one distinct, or an error naming two records.

    ``paths``: the records' stored paths; ``formats``: their stored formats (None for a ``keep``
    pack: names as stored). A record whose suffix changes and whose new name is another record's
    new or original name keeps its original name and gains the new suffix (``a.jpg`` -> ``a.jpg.png``
    beside ``a.png``), so that no file is ever named after a different record's original.
    ``fold_case``: compare names as a case-insensitive file system does. ``PackFormatError`` for
    names that collide as stored (a crafted pack), ``UsageError`` for ones that collide only when
    case is folded (the output's file system cannot hold both)."""
    rels = [safe_relative_path(path) for path in paths]
    key: Callable[[PurePosixPath], str] = (lambda p: str(p).casefold()) if fold_case else str
    wanted = [_preferred(rel, None if formats is None else formats[i]) for i, rel in enumerate(rels)]
    claims = Counter(key(name) for name in wanted)
    originals = Counter(key(rel) for rel in rels)
    targets = []
    for rel, name in zip(rels, wanted, strict=True):
        changed = name != rel
        clash = changed and (claims[key(name)] > 1 or originals[key(name)] > 0)
        targets.append(Target(PurePosixPath(f"{rel}{name.suffix}"), True) if clash else Target(name))
    _check_distinct(rels, targets, key, fold_case)
    return targets


def _check_distinct(rels: list[PurePosixPath], targets: list[Target], key: Callable[[PurePosixPath], str],
                    fold_case: bool) -> None:
    """Raise naming two records written to one file, or one written where another needs a folder."""
    error = UsageError if fold_case else PackFormatError
    why = ("the output's file system ignores case, so these names are one file; unpack onto a case-sensitive "
           "file system" if fold_case else "the pack is damaged or crafted; re-pack the source")
    files: dict[str, int] = {}
    for i, target in enumerate(targets):
        first = files.setdefault(key(target.path), i)
        if first != i:
            raise error(f"records {rels[first]!r} and {rels[i]!r} would both be written to {str(target.path)!r}; "
                        f"{why}")
    for i, target in enumerate(targets):
        for folder in list(target.path.parents)[:-1]:  # every folder above the file, not the root
            other = files.get(key(folder))
            if other is not None:
                raise error(f"record {rels[other]!r} is written to {str(folder)!r}, which record {rels[i]!r} "
                            f"needs as a folder; {why}")


def _folds_case(dir_fd: int) -> bool:
    """Whether the file system of the folder ``dir_fd`` treats names that differ in case as one."""
    name = f".packload-case-{secrets.token_hex(6)}"
    os.close(os.open(name, NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd))
    try:
        os.stat(name.upper(), dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.unlink(name, dir_fd=dir_fd)


def _case_matters(paths: Sequence[str], formats: Sequence[str] | None, targets: list[Target]) -> bool:
    """Whether folding case would change ``targets`` (or make them collide): only then is the
    output's file system asked whether it folds case."""
    try:
        return plan_targets(paths, formats, fold_case=True) != targets
    except UsageError:
        return True


# -- checks before anything is written ---------------------------------------------------------
def _out_state(out: Path, overwrite: bool) -> str:
    """``new`` (absent), ``empty`` (an empty folder) or ``full`` (a folder with entries, only with
    ``overwrite``); ``UsageError`` for a link, a non-folder, or a non-empty folder without ``overwrite``."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        if out.name in ("", ".", ".."):
            raise UsageError(f"{out}: no such folder; give the name of the folder to create") from None
        _check_creatable(out)
        return "new"
    if stat.S_ISLNK(st.st_mode):
        raise UsageError(f"{out}: is a symbolic link; give the folder it points to ({os.path.realpath(out)}), "
                         "or a new folder")
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{out}: exists and is not a folder; choose a new folder, or remove it")
    with os.scandir(out) as entries:
        empty = next(entries, None) is None
    if not empty and not overwrite:
        raise UsageError(f"{out}: exists and is not empty; choose a new folder or add --overwrite")
    return "empty" if empty else "full"


def _check_creatable(out: Path) -> None:
    """``UsageError`` when the new folder ``out`` (its missing parents are made) lies where nothing
    can be written: a virtual or read-only file system."""
    parent = out.parent if str(out.parent) else Path(".")
    why = unwritable_reason(parent)
    if why:
        raise UsageError(f"{out}: cannot be written there: {why}; choose a folder on a disk you can write to")


def _check_apart(pack: Path, out: Path) -> None:
    """``UsageError`` when ``out`` is the pack, holds it, or lies inside it (real paths compared):
    writing there could replace or add to the pack's own files."""
    real_pack, real_out = Path(os.path.realpath(pack)), Path(os.path.realpath(out))
    if real_out == real_pack or real_out.is_relative_to(real_pack) or real_pack.is_relative_to(real_out):
        where = ("is the pack" if real_out == real_pack else
                 "is inside the pack" if real_out.is_relative_to(real_pack) else "holds the pack")
        raise UsageError(f"{out}: {where} {pack}; unpack into a folder outside the pack")


def _image_bytes(reader: PackReader, i: int) -> memoryview:
    """Record ``i``'s file bytes, its checksum checked: the payload, or a PNG of raw pixels."""
    payload = reader.payload(i, verify=True)
    if reader.format_of(i) != "raw":
        return payload
    entry = reader.entries[i]
    image = Image.frombytes("RGB", (int(entry["width"]), int(entry["height"])), bytes(payload))
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return memoryview(buffer.getvalue())


def _write_all(reader: PackReader, targets: list[Target], root_fd: int, shown: Path,
               progress: bool) -> tuple[int, int]:
    """Write every record below ``root_fd``, grouped by folder; (files written, bytes written)."""
    order = sorted(range(len(targets)), key=lambda i: targets[i].path.parts[:-1])
    tree = FolderChain(root_fd, shown)
    written: set[tuple[int, int]] = set()
    size = 0
    try:
        for i in progress_bar(order, unit="img", desc=f"unpack {terminal_safe(reader.path.name)}", disable=not progress):
            parts = targets[i].path.parts
            data = _image_bytes(reader, i)
            write_replacing(tree.enter(parts[:-1]), parts[-1], data, shown.joinpath(*parts), written)
            size += len(data)
    finally:
        tree.close()
    return len(written), size


@contextmanager
def _staged(out: Path) -> Iterator[int]:
    """A new temporary folder beside ``out``, as a descriptor; renamed to ``out`` when the block
    ends normally, removed when it raises."""
    out.parent.mkdir(parents=True, exist_ok=True)
    parent_fd = os.open(out.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        while True:
            stage = f"{out.name}.{secrets.token_hex(4)}.partial"
            try:
                os.mkdir(stage, 0o777, dir_fd=parent_fd)
                break
            except FileExistsError:
                continue
        try:
            stage_fd = os.open(stage, DIR_FLAGS, dir_fd=parent_fd)
            try:
                yield stage_fd
            finally:
                os.close(stage_fd)
            try:  # fails, rather than replacing it, if something else took the name meanwhile
                os.rename(stage, out.name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
            except OSError as exc:
                raise UsageError(f"{out}: appeared while unpacking ({exc.strerror}); remove it or choose a new "
                                 "folder, and unpack again") from None
        except BaseException:
            shutil.rmtree(stage, dir_fd=parent_fd, ignore_errors=True)
            raise
    finally:
        os.close(parent_fd)


@contextmanager
def _in_place(out: Path, was_empty: bool) -> Iterator[int]:
    """The existing folder ``out``, as a descriptor; emptied again when the block raises if it was
    empty before (so a failed unpack leaves it as it found it)."""
    try:
        fd = os.open(out, DIR_FLAGS)
    except OSError as exc:
        raise UsageError(f"{out}: cannot be opened as a folder ({exc.strerror}); give a real folder") from None
    try:
        yield fd
    except BaseException:
        if was_empty:
            for name in os.listdir(fd):
                try:
                    if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        shutil.rmtree(name, dir_fd=fd, ignore_errors=True)
                    else:
                        os.unlink(name, dir_fd=fd)
                except OSError:
                    pass
        raise
    finally:
        os.close(fd)


def unpack(path: str | os.PathLike[str], out: str | os.PathLike[str], overwrite: bool = False,
           progress: bool = True) -> dict[str, Any]:
    """Write every record of the pack at ``path`` into the folder ``out``, one file per record.

    ``out`` must be new or an empty folder; with ``overwrite`` it may hold files, and same-named
    ones are replaced. Refused (``UsageError``, nothing written): ``out`` a symbolic link, a
    non-folder, the pack itself, inside it or holding it. Returns ``path``, ``out``, ``files``
    (files written: one per record), ``bytes``, ``skipped_at_pack_time`` and ``renamed`` (the
    records the collision rule renamed: ``{"path", "written_as"}``; see the module's docstring).
    A pack at a URL is copied whole into a temporary folder first."""
    if is_url(path):
        with tempfile.TemporaryDirectory(prefix="packload-unpack-") as folder:
            result = unpack(download_pack(str(path), folder, progress=progress), out, overwrite, progress)
        return dict(result, path=str(path).rstrip("/"))
    out_dir = Path(out)
    state = _out_state(out_dir, overwrite)
    with PackReader(path) as reader:
        _check_apart(reader.path, out_dir)
        paths = [reader.path_of(i) for i in range(reader.records)]
        formats = None if reader.encoding == "keep" else [reader.format_of(i) for i in range(reader.records)]
        targets = plan_targets(paths, formats)
        place = _staged(out_dir) if state == "new" else _in_place(out_dir, was_empty=state == "empty")
        with place as root_fd:
            if _case_matters(paths, formats, targets) and _folds_case(root_fd):
                targets = plan_targets(paths, formats, fold_case=True)
            files, size = _write_all(reader, targets, root_fd, out_dir, progress)
            table = _write_table(reader, targets, root_fd, out_dir)
        renamed = [{"path": p, "written_as": str(t.path)} for p, t in zip(paths, targets, strict=True) if t.renamed]
        return {"path": str(reader.path), "out": str(out_dir), "files": files, "bytes": size,
                "skipped_at_pack_time": reader.manifest.skipped, "renamed": renamed, "table": table}


def _write_table(reader: PackReader, targets: list[Target], root_fd: int, shown: Path) -> str | None:
    """A pack made from a table: write the table back beside the images, as CSV named after the
    one packed (``labels.csv``), its paths the files as written; returns its name (None: no table)."""
    fields = reader.manifest.fields
    if not fields:
        return None
    packed = str(fields.get("table", {}).get("name") or "labels.csv")
    stem = PurePosixPath(packed).stem if "/" not in packed and "\\" not in packed else ""
    name = f"{stem}.csv" if stem and not stem.startswith(".") and "\0" not in stem else "labels.csv"
    text = table_text(reader, [str(target.path) for target in targets])
    write_replacing(root_fd, name, memoryview(text.encode("utf-8")), shown / name, set())
    return name
