"""Find the images of a folder the way torchvision's ``ImageFolder`` does.

Classes are the first-level sub-folders, sorted; files in deeper sub-folders belong to their
top-level class; only the ImageFolder extensions count (case-insensitive); hidden files and
folders are left out. A folder with images but no class sub-folders is scanned unlabelled.
Everything that is not packed is listed with the reason, so nothing is lost silently.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import NamedTuple

from .errors import UsageError

# The same list as torchvision.datasets.folder.IMG_EXTENSIONS.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class Sample(NamedTuple):
    """One image to pack: its path relative to the source folder and its class index (-1: none).
    A named tuple: a scan makes one per file, so it must be cheap to create."""

    path: str
    label: int


_new_sample = partial(tuple.__new__, Sample)  # Sample from a (path, label) pair, without Python calls


@dataclass
class ScanResult:
    """What a folder holds: the images to pack, in order, and what was left out, with reasons."""

    root: Path
    classes: list[str]
    samples: list[Sample]
    ignored: list[dict[str, str]] = field(default_factory=list)

    @property
    def labelled(self) -> bool:
        return bool(self.classes)


def is_image_name(name: str) -> bool:
    """True if ``name`` has one of the ImageFolder extensions (any case)."""
    return name.lower().endswith(IMG_EXTENSIONS)


def _walk_files(top: Path, root: Path, ignored: list[dict[str, str]]) -> list[str]:
    """Relative paths of the image files under ``top`` in ImageFolder's order (folders sorted by
    path, files sorted by name within each), following symlinked folders but each folder once."""
    found: list[tuple[str, list[str]]] = []
    seen_dirs: set[tuple[int, int]] = set()

    def onerror(exc: OSError) -> None:
        ignored.append({"path": printable(_rel(Path(exc.filename or top), root)),
                        "reason": f"unreadable folder: {exc.strerror}"})

    prefix = len(str(root)) + 1  # os.walk's paths start with the root: cut it off without pathlib
    for dirpath, dirnames, filenames in os.walk(str(top), followlinks=True, onerror=onerror):
        try:
            st = os.stat(dirpath)
        except OSError:
            dirnames[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen_dirs:  # a symlink loop: walk each real folder once
            ignored.append({"path": printable(_rel(Path(dirpath), root)),
                            "reason": "symlink loop: folder already scanned"})
            dirnames[:] = []
            continue
        seen_dirs.add((st.st_dev, st.st_ino))
        for name in dirnames:
            if name.startswith("."):
                ignored.append({"path": _rel(Path(dirpath) / name, root), "reason": "hidden folder"})
            elif not is_utf8(name):
                ignored.append({"path": printable(_rel(Path(dirpath) / name, root)),
                                "reason": "name is not valid UTF-8; rename the folder"})
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and is_utf8(d))
        images = []
        here = dirpath[prefix:].replace(os.sep, "/")
        start = f"{here}/" if here else ""
        for name in sorted(filenames):
            rel = start + name
            if name.startswith("."):
                ignored.append({"path": rel, "reason": "hidden file"})
            elif not (name.isascii() or is_utf8(rel)):  # the folders on the way are UTF-8 already
                ignored.append({"path": printable(rel), "reason": "name is not valid UTF-8; rename the file"})
            elif not name.lower().endswith(IMG_EXTENSIONS):
                ignored.append({"path": rel, "reason": "not an image extension"})
            else:
                images.append(rel)
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


def scan_folder(src: str | os.PathLike[str]) -> ScanResult:
    """Scan ``src`` as ImageFolder would, refusing a missing, non-folder or empty source."""
    root = Path(src)
    if not root.exists():
        raise UsageError(f"{root}: source folder not found; give the folder that holds your images")
    if not root.is_dir():
        raise UsageError(f"{root}: not a folder; give the folder that holds one sub-folder per class")
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except PermissionError:
        raise UsageError(f"{root}: cannot read the source folder; check its permissions") from None
    ignored: list[dict[str, str]] = []
    class_dirs = [e for e in entries if not e.name.startswith(".") and e.is_dir() and is_utf8(e.name)]
    for e in entries:
        if e.name.startswith("."):
            ignored.append({"path": e.name, "reason": "hidden folder" if e.is_dir() else "hidden file"})
        elif not is_utf8(e.name):
            ignored.append({"path": printable(e.name), "reason": "name is not valid UTF-8; rename it"})
    if class_dirs:
        classes = [e.name for e in class_dirs]
        samples: list[Sample] = []
        for label, entry in enumerate(class_dirs):
            samples.extend(map(_new_sample, zip(_walk_files(Path(entry.path), root, ignored), repeat(label))))
        for e in entries:
            if not e.name.startswith(".") and not e.is_dir() and is_utf8(e.name):
                ignored.append({"path": e.name, "reason": "file outside the class folders"})
    else:
        classes = []
        samples = list(map(_new_sample, zip(_walk_files(root, root, ignored), repeat(-1))))
    if not samples:
        raise UsageError(f"{root}: no images found (extensions: {' '.join(IMG_EXTENSIONS)}); "
                         "give the folder that holds one sub-folder of images per class")
    ignored.sort(key=lambda item: item["path"])
    return ScanResult(root=root, classes=classes, samples=samples, ignored=ignored)
