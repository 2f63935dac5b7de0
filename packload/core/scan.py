"""Find the images of a folder the way torchvision's ``ImageFolder`` does.

Classes are the first-level sub-folders, sorted; files in deeper sub-folders belong to their
top-level class; only the ImageFolder extensions count (case-insensitive); hidden files and
folders are left out. A folder with images but no class sub-folders is scanned unlabelled.
Everything that is not packed is listed with the reason, so nothing is lost silently.

Only regular files are packed (after following links, as ImageFolder follows them): a FIFO named
``y.jpg`` would block its reader, a link to ``/dev/zero`` named ``x.jpg`` would give bytes without
end, so such entries are left out with the reason, decided from the folder listing's file types
(no extra system call for a plain file). Links into the system's special file systems (``/proc``,
``/sys``, ``/dev``) are not followed into.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import NamedTuple

from packload.core.errors import SkippedFileError, UsageError
from packload.core.samples import Sample, SampleList
from packload.core.special_files import NOT_REGULAR, not_regular_reason, special_reason

# The same list as torchvision.datasets.folder.IMG_EXTENSIONS.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


SPLIT_NAMES = frozenset({"train", "training", "val", "valid", "validation", "test", "testing", "eval",
                         "evaluation", "dev", "holdout"})  # folder names of dataset splits


@dataclass
class ScanResult:
    """What a folder holds: the images to pack, in order, and what was left out, with reasons."""

    root: Path
    classes: list[str]
    samples: Sequence[Sample]  # a SampleList: arrays, not an object per file
    ignored: list[dict[str, str]] = field(default_factory=list)

    @property
    def labelled(self) -> bool:
        return bool(self.classes)

    @property
    def not_regular(self) -> list[dict[str, str]]:
        """The left-out entries that are FIFOs, sockets or devices (``pack --strict`` may refuse them)."""
        return [item for item in self.ignored if NOT_REGULAR in item["reason"]]

    @property
    def split_folders(self) -> bool:
        """Whether every class folder is named as a dataset split (``train``, ``val``, ``test``...):
        the source is then most likely the folder above the ImageFolder trees, not one of them."""
        return bool(self.classes) and all(name.lower() in SPLIT_NAMES for name in self.classes)

    def check_splits(self, strict: bool) -> None:
        """Warn (an error under ``strict``) when the classes are dataset splits (``split_folders``)."""
        if not self.split_folders:
            return
        first = self.classes[0]
        message = (f"{self.root}: its only class folders are {', '.join(self.classes)}, which look like dataset "
                   f"splits, not classes; pack each split on its own (for example "
                   f"`pack {self.root / first} {first}.lmdb`)")
        if strict:
            raise UsageError(message + ", or pack without --strict to pack them as classes")
        warnings.warn(message, UserWarning, stacklevel=3)

    def check_unlabelled(self, strict: bool) -> None:
        """Warn (an error under ``strict``) when the folder has no class folders, so it would be packed
        unlabelled, while the folder above it holds other folders of images beside it: the source is
        then most likely one class of the dataset, given by mistake, and the folder above the dataset.
        A folder of images with no such siblings is packed unlabelled without a word."""
        if self.labelled:
            return
        siblings = sibling_image_folders(self.root)
        if not siblings:
            return
        parent = display_parent(self.root)
        names = [self.root.resolve().name, *siblings]
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        done = "it would be packed unlabelled (labels -1)" if strict else "packed unlabelled (labels -1)"
        message = (f"{self.root}: no class folders: {done}; did you mean {parent}, whose folders of images "
                   f"({shown}) would be the classes?")
        if strict:
            raise UsageError(message + " Give that folder, or pack without --strict to pack this one unlabelled")
        warnings.warn(message, UserWarning, stacklevel=3)

    def check_layout(self, strict: bool) -> None:
        """Both checks of the source's layout: dataset splits given as classes, one class given alone."""
        self.check_splits(strict)
        self.check_unlabelled(strict)

    def refuse_not_regular(self) -> None:
        """Under ``--strict``: an entry with an image's name that is not a regular file is an error."""
        if self.not_regular:
            item = self.not_regular[0]
            raise SkippedFileError(f"{self.root / item['path']}: {item['reason']}; remove it, or pack without "
                                   "--strict to leave it out and list it in the manifest")


SIBLINGS_CHECKED = 64  # folders beside the source looked into, at most
ENTRIES_CHECKED = 256  # entries of each looked at, at most, for an image


def sibling_image_folders(root: str | os.PathLike[str]) -> list[str]:
    """The names of the folders beside ``root`` (in its parent, hidden ones left out) that hold an
    image at their top level, sorted; a bounded look (``SIBLINGS_CHECKED`` folders, ``ENTRIES_CHECKED``
    entries each), and an empty list when the parent cannot be read."""
    here = Path(root).resolve()
    found: list[str] = []
    if not here.is_dir():  # a source at a URL: its siblings are not looked for
        return found
    try:
        with os.scandir(here.parent) as listing:
            folders = sorted(e.name for e in listing if not e.name.startswith(".") and e.name != here.name
                             and _is_dir(e))
    except OSError:
        return []
    for name in folders[:SIBLINGS_CHECKED]:
        try:
            with os.scandir(here.parent / name) as entries:
                for count, entry in enumerate(entries):
                    if count >= ENTRIES_CHECKED:
                        break
                    if is_image_name(entry.name) and not entry.name.startswith(".") and entry.is_file():
                        found.append(name)
                        break
        except OSError:
            continue
    return found


def display_parent(root: Path) -> str:
    """The folder above ``root`` as the user would write it: ``./photos`` for ``./photos/food``."""
    parent = root.parent
    if parent == root or str(root) in (".", ""):
        return str(root.resolve().parent)
    if parent.is_absolute() or parent.parts[:1] == ("..",):
        return str(parent)
    return "." if str(parent) == "." else f"./{parent}"


def is_image_name(name: str) -> bool:
    """True if ``name`` has one of the ImageFolder extensions (any case)."""
    return name.lower().endswith(IMG_EXTENSIONS)


_by_name = attrgetter("name")


def _is_dir(entry: os.DirEntry[str]) -> bool:
    """A folder, after following links (from the listing's type, no system call, for a plain entry)."""
    try:
        return entry.is_dir()
    except OSError:  # a link that cannot be followed: not a folder (as os.walk decides)
        return False


def _list_folder(dirpath: str) -> tuple[list[str], list[str], dict[str, os.DirEntry[str]]]:
    """What ``dirpath`` holds, links followed: its sub-folders' names, its regular files' names, and
    its other entries (FIFOs, devices, broken links...) by name. The types come from the listing:
    no system call for a plain file or folder."""
    dirs: list[str] = []
    files: list[str] = []
    others: dict[str, os.DirEntry[str]] = {}
    with os.scandir(dirpath) as listing:
        for entry in listing:
            try:
                if entry.is_file():
                    files.append(entry.name)
                    continue
                if entry.is_dir():
                    dirs.append(entry.name)
                    continue
            except OSError:  # a link that cannot be followed: neither (as os.walk decides)
                pass
            others[entry.name] = entry
    return dirs, files, others


def _walk_files(top: Path, root: Path, ignored: list[dict[str, str]]) -> list[str]:
    """Relative paths of the image files under ``top`` in ImageFolder's order (folders sorted by
    path, files sorted by name within each), following symlinked folders but each folder once, and
    none on a special file system. Entries that are not regular files are left out with the reason."""
    found: list[tuple[str, list[str]]] = []
    seen_dirs: set[tuple[int, int]] = set()
    prefix = len(str(root)) + 1  # every path here starts with the root: cut it off without pathlib
    pending = [str(top)]  # depth first, in sorted order, as os.walk visits
    while pending:
        dirpath = pending.pop()
        try:
            st = os.stat(dirpath)
            if (st.st_dev, st.st_ino) in seen_dirs:  # a symlink loop: walk each real folder once
                ignored.append({"path": printable(_rel(Path(dirpath), root)),
                                "reason": "symlink loop: folder already scanned"})
                continue
            seen_dirs.add((st.st_dev, st.st_ino))
            special = special_reason(st.st_dev)
            if special is not None:
                ignored.append({"path": printable(_rel(Path(dirpath), root)), "reason": special})
                continue
            dirnames, filenames, others = _list_folder(dirpath)
        except OSError as exc:
            ignored.append({"path": printable(_rel(Path(dirpath), root)),
                            "reason": f"unreadable folder: {exc.strerror}"})
            continue
        dirnames.sort()
        for name in dirnames:
            if name.startswith("."):
                ignored.append({"path": _rel(Path(dirpath) / name, root), "reason": "hidden folder"})
            elif not is_utf8(name):
                ignored.append({"path": printable(_rel(Path(dirpath) / name, root)),
                                "reason": "name is not valid UTF-8; rename the folder"})
        pending.extend(os.path.join(dirpath, d) for d in reversed(dirnames) if not d.startswith(".") and is_utf8(d))
        images = []
        here = dirpath[prefix:].replace(os.sep, "/")
        start = f"{here}/" if here else ""
        if others:
            filenames += others
        for name in sorted(filenames):
            rel = start + name
            if name.startswith("."):
                ignored.append({"path": rel, "reason": "hidden file"})
            elif not (name.isascii() or is_utf8(rel)):  # the folders on the way are UTF-8 already
                ignored.append({"path": printable(rel), "reason": "name is not valid UTF-8; rename the file"})
            elif not name.lower().endswith(IMG_EXTENSIONS):
                ignored.append({"path": rel, "reason": "not an image extension"})
            elif not others or name not in others or (reason := not_regular_reason(others[name])) is None:
                images.append(rel)
            else:
                ignored.append({"path": rel, "reason": reason})
        found.append((dirpath, images))
    return [rel for _, images in sorted(found) for rel in images]


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def printable(path: str) -> str:
    """``path`` with bytes that are not UTF-8 shown as ``\\xNN`` (for listings and messages)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_utf8(path: str) -> bool:
    """False for names holding bytes that are not UTF-8 (which the format cannot store)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class TopListing(NamedTuple):
    """The top level of a source: its class folders (sorted) and what it leaves out there. A source
    scans as this plus one ``ClassListing`` per class (``merge_listings``), each of which may be
    made on another machine (``pack --engine ray`` lists the classes in Ray tasks)."""

    root: Path
    classes: list[str]
    ignored: list[dict[str, str]]  # hidden or misnamed entries at the top
    outside: list[dict[str, str]]  # the files beside the class folders (none when unlabelled)


class ClassListing(NamedTuple):
    """One class folder's image files (relative to the source, in ImageFolder's order) and what it
    leaves out, with reasons; for an unlabelled source, the whole source's."""

    files: list[str]
    ignored: list[dict[str, str]]


def list_top(src: str | os.PathLike[str]) -> TopListing:
    """The top level of the folder ``src``, refusing a missing, non-folder or special source."""
    root = Path(src)
    if not root.exists():
        raise UsageError(f"{root}: source folder not found; give the folder that holds your images")
    if not root.is_dir():
        raise UsageError(f"{root}: not a folder; give the folder that holds one sub-folder per class")
    special = special_reason(root.stat().st_dev)
    if special is not None:
        raise UsageError(f"{root}: {special.partition(':')[0]}; give the folder that holds your images")
    # Names only: a flat folder of a million images must not hold a DirEntry per file while it is listed.
    classes: list[str] = []
    loose: list[str] = []  # the files at the top (outside the class folders, if there are classes)
    unusable: list[tuple[str, dict[str, str]]] = []
    try:
        with os.scandir(root) as listing:
            for e in listing:
                if e.name.startswith("."):
                    unusable.append((e.name, {"path": e.name, "reason": "hidden folder" if _is_dir(e) else "hidden file"}))
                elif not is_utf8(e.name):
                    unusable.append((e.name, {"path": printable(e.name), "reason": "name is not valid UTF-8; rename it"}))
                elif _is_dir(e):
                    classes.append(e.name)
                else:
                    loose.append(e.name)
    except PermissionError:
        raise UsageError(f"{root}: cannot read the source folder; check its permissions") from None
    classes.sort()
    ignored = [item for _, item in sorted(unusable, key=lambda pair: pair[0])]
    outside: list[dict[str, str]] = []
    if classes and loose:  # a second look at those few files, for what each is
        wanted = set(loose)
        with os.scandir(root) as listing:
            found = {e.name: e for e in listing if e.name in wanted}
        for name in sorted(loose):
            reason = not_regular_reason(found[name]) if name in found else None
            outside.append({"path": name, "reason": f"{reason}, outside the class folders" if reason
                            else "file outside the class folders"})
    return TopListing(root, classes, ignored, outside)


def list_class(root: str | os.PathLike[str], name: str) -> ClassListing:
    """The files of the class folder ``name`` of the source folder ``root`` (``""``: the whole
    source, unlabelled), by ImageFolder's rules: the one place a class folder is listed."""
    ignored: list[dict[str, str]] = []
    top = Path(root) / name if name else Path(root)
    return ClassListing(_walk_files(top, Path(root), ignored), ignored)


def merge_listings(top: TopListing, listings: list[ClassListing],
                   hint: str = "give the folder that holds one sub-folder of images per class") -> ScanResult:
    """The scan of a source from its top level and its listings (one per class, in class order; for
    an unlabelled source, one of the whole source); ``hint`` ends the error when nothing is found."""
    labels = range(len(top.classes)) if top.classes else [-1]
    ignored = list(top.ignored)
    for listing in listings:
        ignored.extend(listing.ignored)
    samples = SampleList.from_runs((listing.files, label) for label, listing in zip(labels, listings, strict=True))
    ignored.extend(top.outside)
    if not samples:
        raise UsageError(f"{top.root}: no images found (extensions: {' '.join(IMG_EXTENSIONS)}); {hint}")
    ignored.sort(key=lambda item: item["path"])
    return ScanResult(root=top.root, classes=list(top.classes), samples=samples, ignored=ignored)


def scan_folder(src: str | os.PathLike[str]) -> ScanResult:
    """Scan ``src`` as ImageFolder would, refusing a missing, non-folder or empty source."""
    top = list_top(src)
    return merge_listings(top, [list_class(top.root, name) for name in top.classes or [""]])
