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


@pytest.mark.parametrize("splits", [("train", "val"), ("test", "train", "validation"), ("Train", "Valid")])
def test_split_folders_warn_and_stop_under_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  splits: tuple[str, ...]) -> None:
    """The parent of train/ and val/ would pack as classes named after the splits: a warning, an
    error under --strict, one line each."""
    from packload.cli import main

    for split in splits:
        write_image(tmp_path / "src" / split / "dog" / "a.png")
    assert scan_folder(tmp_path / "src").split_folders
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "p.lmdb"), "--quiet"]) == 0
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if "warning" in line]
    assert len(warning) == 1 and "dataset splits" in warning[0] and f"/{splits[0]}" in warning[0], err
    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "q.lmdb"), "--strict", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dataset splits" in err and "without --strict" in err
    assert not (tmp_path / "q.lmdb").exists()


def test_real_classes_are_no_splits(tmp_path: Path) -> None:
    for name in ("train", "cat"):
        write_image(tmp_path / name / "a.png")
    assert not scan_folder(tmp_path).split_folders


def test_one_class_folder_given_alone_warns_and_stops_under_strict(tmp_path: Path) -> None:
    """A folder of images with no class folders, while the folder above holds other folders of images:
    most likely one class of the dataset, given by mistake. A warning naming the folder above (an
    error under strict); neither for an unlabelled folder without such neighbours."""
    import warnings

    from packload import pack
    from packload.core.scan import sibling_image_folders

    _tree(tmp_path / "photos", ["food/a.jpg", "food/b.png", "cars/c.jpg", ".hidden/d.jpg", "deeper/x/e.jpg"])
    (tmp_path / "photos" / "notes").mkdir()
    assert sibling_image_folders(tmp_path / "photos" / "food") == ["cars"]  # not hidden, empty, nor nested only
    scan = scan_folder(tmp_path / "photos" / "food")
    assert not scan.labelled
    with pytest.warns(UserWarning, match=r"no class folders: packed unlabelled .*did you mean .*photos, whose "
                                         r"folders of images \(food, cars\) would be the classes"):
        scan.check_layout(strict=False)
    with pytest.raises(UsageError, match="no class folders.*without --strict"):
        scan.check_layout(strict=True)
    with pytest.warns(UserWarning, match="no class folders"):
        result = pack(tmp_path / "photos" / "food", tmp_path / "food.lmdb", workers=1, progress=False)
    assert result["records"] == 2 and result["classes"] == 0
    _tree(tmp_path / "alone", ["only/a.jpg", "only/b.jpg"])  # nothing beside it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scan_folder(tmp_path / "alone" / "only").check_layout(strict=True)
        scan_folder(tmp_path / "photos").check_layout(strict=True)  # the classes themselves: nothing to say
