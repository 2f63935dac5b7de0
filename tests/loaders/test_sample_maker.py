"""Tests for loaders.sample_maker: the drop-in path's samples made through ``SampleSource`` alone (a
source that is not a ``PackedImageFolder`` gets ImageFolder's pixels, its own targets and
transforms, in order), the stored bytes copied as they were packed, and a damaged record given
the next intact record's place under ``on_error="skip"``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import packload
from packload import EncodeOptions, PackReader
from packload.core.errors import PackFormatError
from packload.loaders.decode_threads import DecodeThreads
from packload.loaders.random_crop import Draws
from packload.loaders.sample_maker import SampleMaker
from tests.image_factory import make_image_folder


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path]:
    root = tmp_path_factory.mktemp("src")
    files = make_image_folder(root, classes=("ant", "bee"), per_class=4)  # JPEG and PNG alternate
    dst = tmp_path_factory.mktemp("pack") / "p.shards"
    packload.pack(root, dst, options=EncodeOptions(encoding="keep"), workers=1, progress=False)
    return files, dst


@dataclass
class Source:
    """A ``SampleSource`` of its own: one reader, targets of its own making."""

    pack: Path
    output: str = "numpy"
    transform: Any = None
    target_transform: Any = None
    target: Any = "own"
    verify: bool = False
    on_error: str = "raise"
    decode_size: tuple[int, int] | None = None
    exif_transpose: bool = False
    fast_jpeg: bool = False
    decode_threads: DecodeThreads = field(default_factory=lambda: DecodeThreads(1))
    draws: Draws = field(default_factory=Draws)
    opened: PackReader | None = None

    @property
    def shown(self) -> str:
        return str(self.pack)

    @property
    def targets(self) -> list[int]:
        return self.reader().labels().tolist()

    def __len__(self) -> int:
        return len(self.targets)

    def reader(self) -> PackReader:
        self.opened = self.opened or PackReader(self.pack)
        return self.opened

    def target_of(self, reader: PackReader, index: int) -> Any:
        return f"{reader.path_of(index)}#{index}"


def test_a_source_of_its_own_gets_imagefolders_pixels_and_its_targets(packed: tuple[list[Path], Path]) -> None:
    files, pack = packed
    source = Source(pack, transform=lambda image: image[:, ::-1], target_transform=str.upper)
    order = [5, 0, 7, 2, 2]
    got = SampleMaker(source).samples(order)
    paths = [PackReader(pack).path_of(i) for i in order]
    by_path = {f"{f.parent.name}/{f.name}": f for f in files}
    for (image, target), index, path in zip(got, order, paths, strict=True):
        expected = np.asarray(Image.open(by_path[path]).convert("RGB"))[:, ::-1]
        assert np.array_equal(image, expected)
        assert target == f"{path}#{index}".upper()


def test_plain_bytes_are_the_packed_files(packed: tuple[list[Path], Path]) -> None:
    files, pack = packed
    source = Source(pack, output="bytes", target=None)
    reader = source.reader()
    got = SampleMaker(source).samples([3, 1])
    by_path = {f"{f.parent.name}/{f.name}": f.read_bytes() for f in files}
    assert [payload for payload, _ in got] == [by_path[reader.path_of(3)], by_path[reader.path_of(1)]]
    assert [label for _, label in got] == [source.targets[3], source.targets[1]]


def test_a_record_that_does_not_decode_gives_its_place_or_raises(packed: tuple[list[Path], Path],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _, pack = packed
    maker = SampleMaker(Source(pack, on_error="skip"))
    real = maker.decode

    def broken_two(reader: PackReader, index: int, view: memoryview) -> Any:
        if index == 2:
            raise OSError("broken data stream")
        return real(reader, index, view)

    monkeypatch.setattr(maker, "decode", broken_two)
    with pytest.warns(UserWarning, match="skipping damaged record 2"):
        got = maker.samples([1, 2, 3])
    assert [target.rsplit("#", 1)[1] for _, target in got] == ["1", "3", "3"]  # the batch keeps its size
    maker.dataset.on_error = "raise"
    with pytest.raises(PackFormatError, match="record 2"):
        maker.samples([2])
