"""``FolderImages`` (``packload.loaders.folder``): the plain ImageFolder-style baseline over the
original files, scanned as ``pack`` scans, read as ``pack`` reads (regular files only, decodable
formats only)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packload.core.probe import NotDecodableError
from packload.core.safe_files import NotRegularFileError
from packload.core.scan import scan_folder
from packload.loaders.folder import FolderImages
from tests.image_factory import make_image_folder, write_image


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    make_image_folder(tmp_path / "data", classes=("cat", "dog"), per_class=3, seed=4)
    write_image(tmp_path / "data" / "dog" / "gray.png", mode="L", seed=9)
    return tmp_path / "data"


def test_samples_and_images_are_imagefolders(root: Path) -> None:
    ds = FolderImages(root)
    scan = scan_folder(root)
    assert ds.classes == ["cat", "dog"] and ds.class_to_idx == {"cat": 0, "dog": 1}
    assert ds.samples == [(str(root / s.path), s.label) for s in scan.samples] and len(ds) == 7
    assert ds.targets == [0, 0, 0, 1, 1, 1, 1]
    for i, (path, label) in enumerate(ds.samples):
        image, target = ds[i]
        assert isinstance(image, Image.Image) and image.mode == "RGB" and target == label
        assert np.array_equal(np.asarray(image), np.asarray(Image.open(path).convert("RGB")))


def test_bytes_output_and_transforms(root: Path) -> None:
    ds = FolderImages(root, output="bytes", transform=len, target_transform=lambda y: y + 10)
    path, label = ds.samples[4]
    assert ds[4] == (os.path.getsize(path), label + 10)
    assert FolderImages(root, output="bytes")[4][0] == Path(path).read_bytes()
    with pytest.raises(ValueError, match="choose pil or bytes"):
        FolderImages(root, output="numpy")


def test_files_that_are_not_what_they_were_are_refused_by_name(root: Path) -> None:
    ds = FolderImages(root)
    swapped = ds.samples[0][0]
    os.unlink(swapped)
    os.mkfifo(swapped)  # a FIFO where the scan saw a file: refused, never waited on
    with pytest.raises(NotRegularFileError, match="a FIFO"):
        ds[0]
    icon = ds.samples[1][0]
    Image.new("RGB", (16, 16)).save(icon, format="ICO")  # a format packload does not decode
    with pytest.raises(NotDecodableError, match=os.path.basename(icon)) as caught:
        ds[1]
    assert isinstance(caught.value, OSError)
