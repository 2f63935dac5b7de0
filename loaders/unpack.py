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
from packload.core.errors import PackFormatError, UsageError, WriteError
from packload.core.pack_download import download_pack
from packload.core.progress import progress_bar
from packload.core.remote import is_url
from packload.core.storage import unwritable_reason
from packload.loaders.fields import table_text
from packload.loaders.read import PackReader

_SUFFIX = {"JPEG": ".jpg", "PNG": ".png", "raw": ".png"}
_FITTING = {"JPEG": {".jpg", ".jpeg", ".jpe", ".jfif"}, "PNG": {".png"}, "raw": {".png"}}  # kept as they are
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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
    os.close(os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd))
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


# -- writing without following links ----------------------------------------------------------
def _open_dir(parent_fd: int, name: str, shown: Path) -> int:
    """Folder ``name`` in ``parent_fd``, created if missing; never through a link. ``shown``: its
    path as the user knows it, for errors."""
    for _ in range(2):  # a second try if it appears between the open and the mkdir
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            try:
                os.mkdir(name, 0o777, dir_fd=parent_fd)
            except FileExistsError:
                pass
            except OSError as exc:
                raise WriteError(f"{shown}: could not create it ({exc.strerror}); fix permissions, or unpack "
                                 "into another folder") from None
        except OSError as exc:
            try:
                mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
            except OSError:
                mode = stat.S_IFDIR
            if stat.S_ISDIR(mode):
                raise WriteError(f"{shown}: could not open it ({exc.strerror}); fix permissions, or unpack "
                                 "into another folder") from None
            what = "is a symbolic link" if stat.S_ISLNK(mode) else "exists and is not a folder"
            raise UsageError(f"{shown}: {what}, and a record needs a folder there; remove it, or unpack into "
                             "a new folder") from None
    raise UsageError(f"{shown}: changed while it was being created; unpack again")


class _Tree:
    """The folders below one root, opened one component at a time through their parent's
    descriptor. Records come grouped by folder, so only the current chain is kept open."""

    def __init__(self, root_fd: int, shown: Path) -> None:
        self.root_fd = root_fd
        self.shown = shown
        self._chain: list[tuple[str, int]] = []  # open folders below the root, outermost first

    def enter(self, folders: tuple[str, ...]) -> int:
        """The descriptor of ``root/folders...``, creating what is missing."""
        common = 0
        while common < min(len(folders), len(self._chain)) and self._chain[common][0] == folders[common]:
            common += 1
        self._drop(common)
        for depth in range(common, len(folders)):
            parent = self._chain[-1][1] if self._chain else self.root_fd
            shown = self.shown.joinpath(*folders[: depth + 1])
            self._chain.append((folders[depth], _open_dir(parent, folders[depth], shown)))
        return self._chain[-1][1] if self._chain else self.root_fd

    def _drop(self, keep: int) -> None:
        while len(self._chain) > keep:
            os.close(self._chain.pop()[1])

    def close(self) -> None:
        self._drop(0)


def _write_file(dir_fd: int, name: str, data: memoryview, shown: Path, written: set[tuple[int, int]]) -> None:
    """Write ``data`` to ``name`` in ``dir_fd`` through a temporary name and a rename, which replaces
    a file or link there without following it. ``written``: (device, inode) of the files this unpack
    wrote; replacing one of them would lose a record, so that is an error."""
    while True:
        tmp = f".packload-{secrets.token_hex(8)}.tmp"  # short: the final name may be at the length limit
        try:
            fd = os.open(tmp, _NEW_FILE_FLAGS, 0o666, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            st = os.fstat(f.fileno())
        try:
            old = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise UsageError(f"{shown}: is a folder, and a record is a file of that name; remove it, or unpack "
                             "into a new folder")
        if old is not None and (old.st_dev, old.st_ino) in written:
            raise UsageError(f"{shown}: two records map to this one file on this file system (it does not tell "
                             "their names apart); unpack onto another file system")
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as exc:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise WriteError(f"{shown}: could not write it ({exc.strerror or exc}); free space or fix "
                             "permissions, or unpack into another folder") from exc
        raise
    written.add((st.st_dev, st.st_ino))


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
    tree = _Tree(root_fd, shown)
    written: set[tuple[int, int]] = set()
    size = 0
    try:
        for i in progress_bar(order, unit="img", desc=f"unpack {terminal_safe(reader.path.name)}", disable=not progress):
            parts = targets[i].path.parts
            data = _image_bytes(reader, i)
            _write_file(tree.enter(parts[:-1]), parts[-1], data, shown.joinpath(*parts), written)
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
            stage_fd = os.open(stage, _DIR_FLAGS, dir_fd=parent_fd)
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
        fd = os.open(out, _DIR_FLAGS)
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
                "skipped_at_pack_time": reader.manifest["skipped"], "renamed": renamed, "table": table}


def _write_table(reader: PackReader, targets: list[Target], root_fd: int, shown: Path) -> str | None:
    """A pack made from a table: write the table back beside the images, as CSV named after the
    one packed (``labels.csv``), its paths the files as written; returns its name (None: no table)."""
    fields = reader.manifest.get("fields")
    if not isinstance(fields, dict):
        return None
    packed = str(fields.get("table", {}).get("name") or "labels.csv")
    stem = PurePosixPath(packed).stem if "/" not in packed and "\\" not in packed else ""
    name = f"{stem}.csv" if stem and not stem.startswith(".") and "\0" not in stem else "labels.csv"
    text = table_text(reader, [str(target.path) for target in targets])
    _write_file(root_fd, name, memoryview(text.encode("utf-8")), shown / name, set())
    return name
