"""Scanning a source folder as torchvision's ImageFolder does (``packload.core.scan``): classes, the
order of the files, what is left out and why, and the sources that are refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from packload.core.errors import SkippedFileError, UsageError
from packload.core.scan import is_image_name, is_utf8, printable, scan_folder
from tests.image_factory import write_image


def _tree(root: Path, names: list[str]) -> None:
    for k, name in enumerate(names):
        write_image(root / name, fmt="PNG", seed=k)


def test_classes_and_order_are_imagefolders(tmp_path: Path) -> None:
    _tree(tmp_path, ["dog/z.jpg", "dog/A.PNG", "dog/sub/a.jpg", "dog/sub/deeper/b.webp", "cat/x.jpeg",
                     "bird/only.bmp"])
    scan = scan_folder(tmp_path)
    assert scan.classes == ["bird", "cat", "dog"] and scan.labelled
    # files of a folder sorted by name (any case of extension), then its sub-folders, deepest files last
    assert [(s.path, s.label) for s in scan.samples] == [
        ("bird/only.bmp", 0), ("cat/x.jpeg", 1), ("dog/A.PNG", 2), ("dog/z.jpg", 2), ("dog/sub/a.jpg", 2),
        ("dog/sub/deeper/b.webp", 2)]
    assert scan.ignored == []


def test_everything_left_out_is_listed_with_its_reason(tmp_path: Path) -> None:
    _tree(tmp_path, ["cat/ok.jpg", "cat/.hidden.jpg", "cat/.cache/x.jpg", ".git/y.jpg", "stray.jpg"])
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    os.mkfifo(tmp_path / "cat" / "pipe.jpg")
    (tmp_path / "cat" / "loop").symlink_to(tmp_path / "cat")
    with open(os.path.join(os.fsencode(tmp_path / "cat"), b"\xff.jpg"), "wb") as f:
        f.write((tmp_path / "cat" / "ok.jpg").read_bytes())
    scan = scan_folder(tmp_path)
    assert [s.path for s in scan.samples] == ["cat/ok.jpg"]
    assert {item["path"]: item["reason"] for item in scan.ignored} == {
        ".git": "hidden folder",
        "cat/.cache": "hidden folder",
        "cat/.hidden.jpg": "hidden file",
        "cat/\\xff.jpg": "name is not valid UTF-8; rename the file",
        "cat/loop": "symlink loop: folder already scanned",
        "cat/notes.txt": "not an image extension",
        "cat/pipe.jpg": "a FIFO (named pipe), not a regular file",
        "stray.jpg": "file outside the class folders",
    }
    assert [item["path"] for item in scan.not_regular] == ["cat/pipe.jpg"]
    with pytest.raises(SkippedFileError, match="pipe.jpg: a FIFO"):
        scan.refuse_not_regular()


def test_a_folder_without_class_folders_is_unlabelled(tmp_path: Path) -> None:
    _tree(tmp_path, ["b.png", "a.jpg"])
    scan = scan_folder(tmp_path)
    assert scan.classes == [] and not scan.labelled
    assert [(s.path, s.label) for s in scan.samples] == [("a.jpg", -1), ("b.png", -1)]


def test_sources_with_nothing_to_pack_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="source folder not found"):
        scan_folder(tmp_path / "missing")
    (tmp_path / "file.jpg").write_bytes(b"x")
    with pytest.raises(UsageError, match="not a folder"):
        scan_folder(tmp_path / "file.jpg")
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    (tmp_path / "empty" / "cat" / "readme.txt").write_text("no images here")
    with pytest.raises(UsageError, match="no images found"):
        scan_folder(tmp_path / "empty")
    with pytest.raises(UsageError, match="not scanned|kernel files"):
        scan_folder("/proc/self")


def test_names() -> None:
    assert is_image_name("x.JPG") and is_image_name("a.tiff") and not is_image_name("a.gif")
    assert is_utf8("ünï.png") and not is_utf8("\udcff.png")
    assert printable("a/\udcff\udcfe.png") == "a/\\xff\\xfe.png" and printable("ünï") == "ünï"
