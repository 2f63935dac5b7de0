"""Filling one uint8 batch from a pack (``packload.loaders.batch_fill``): raw records gathered
straight from the parts, decoded records cropped into their slots, the fast route and the general
one giving the same pixels, checksums on request, and undecodable records refused or replaced."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from packload.core.errors import ChecksumError, PackFormatError, UsageError
from packload.loaders.batch_fill import RawGather, fill_decoded
from packload.loaders.crop import CenterCrop
from packload.loaders.decode import decode_array, raw_array
from packload.loaders.read import PackReader
from packload.packer.encode import EncodeOptions
from tests.reliability.corruption import corruption_regions, flip_bit
from tests.reliability.crafted import copy_pack, craft_pack, jpeg_bytes
from tests.reliability.packs import make_source, pack_small


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("batch-fill")
    source = make_source(root / "src", per_class=6)
    out = {"keep": root / "keep.shards", "raw": root / "raw.lmdb", "mixed": root / "mixed.shards"}
    pack_small(source, out["keep"])
    pack_small(source, out["raw"], options=EncodeOptions(encoding="raw", size=(48, 64)))  # a chunk each
    pack_small(source, out["mixed"], options=EncodeOptions(encoding="raw"))  # raw, each image its own size
    return out


def _raw_expected(reader: PackReader, positions: list[int]) -> np.ndarray:
    e = reader.entries
    return np.stack([raw_array(bytes(reader.payload(i)), int(e["width"][i]), int(e["height"][i])) for i in positions])


def test_raw_records_are_gathered_as_stored(packs: dict[str, Path]) -> None:
    with PackReader(packs["raw"]) as reader:
        gather = RawGather(reader)
        assert gather.size == (48, 64) and gather.uniform and len(set(gather.parts.tolist())) > 8
        few = [3, 1, 2]  # one or two parts: one gather each
        many = list(range(reader.records))[::-1]  # every part: record by record
        for positions in (few, many):
            want = _raw_expected(reader, positions)
            assert np.array_equal(gather(np.array(positions)), want)
            out = np.zeros_like(want)
            assert gather(np.array(positions), out, verify=True) is out and np.array_equal(out, want)
        assert gather(np.array([], np.int64)).shape == (0, 48, 64, 3)


def test_a_damaged_raw_record_is_refused_with_checksums_on(packs: dict[str, Path], tmp_path: Path) -> None:
    pack = copy_pack(packs["raw"], tmp_path / "d.lmdb")
    region = corruption_regions(pack)["payload"][4]
    flip_bit(pack, region.start + 10, 1)
    with PackReader(pack) as reader:
        gather = RawGather(reader)
        gather(np.array([4]))  # checksums off: returned as stored
        with pytest.raises(ChecksumError, match="record 4"):
            gather(np.array([3, 4]), verify=True)


def test_raw_images_of_different_sizes_need_a_crop(packs: dict[str, Path]) -> None:
    with PackReader(packs["mixed"]) as reader:
        with pytest.raises(UsageError, match="different sizes cannot share a batch"):
            RawGather(reader)(np.array([0, 1]))


@pytest.mark.parametrize("name", ["keep", "mixed"])
def test_decoded_records_are_cropped_into_their_slots_by_either_route(packs: dict[str, Path], name: str) -> None:
    crop = CenterCrop(20)
    with PackReader(packs[name]) as reader:
        positions = [0, 7, 3, 11, 5]
        e = reader.entries
        want = [crop(decode_array(bytes(reader.payload(i)), reader.format_of(i),
                                  bytes(e["mode"][i]).rstrip(b"\0").decode(), int(e["width"][i]),
                                  int(e["height"][i]))) for i in positions]
        got = []
        for layout in (torch.channels_last, torch.contiguous_format):  # the fast route, the general one
            out = torch.zeros((5, 3, 20, 20), dtype=torch.uint8).contiguous(memory_format=layout)
            assert fill_decoded(reader, positions, reader.payloads(positions), out, crop=crop) == positions
            got.append(out.permute(0, 2, 3, 1).numpy().astype(int))
        assert np.abs(got[0] - got[1]).max() <= 1
        for k, i in enumerate(positions):
            error = np.abs(got[0][k] - want[k])
            if reader.format_of(i) == "JPEG":  # decoded at a reduced scale for the crop: close to the full decode
                assert error.mean() < 4, i
            else:
                assert error.max() <= 1, i


def test_an_undecodable_record_is_refused_or_replaced(tmp_path: Path) -> None:
    pack = craft_pack(tmp_path / "c.shards", [("a/0.jpg", 0, jpeg_bytes(seed=0)), ("a/junk.jpg", 0, b"\xff\xd8junk"),
                                              ("a/2.jpg", 0, jpeg_bytes(seed=2))])
    crop = CenterCrop(16)
    with PackReader(pack) as reader:
        out = torch.zeros((3, 3, 16, 16), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
        with pytest.raises(PackFormatError, match="junk.jpg"):
            fill_decoded(reader, [0, 1, 2], reader.payloads([0, 1, 2]), out, crop=crop)
        asked: list[int] = []

        def replace(index: int, error: Exception) -> tuple[int, memoryview]:
            asked.append(index)
            return 2, reader.payload(2)

        assert fill_decoded(reader, [0, 1, 2], reader.payloads([0, 1, 2]), out, crop=crop, replace=replace) == [0, 2, 2]
        assert asked == [1] and torch.equal(out[1], out[2])
        with pytest.raises(ValueError, match="3 records but 2 payloads"):
            fill_decoded(reader, [0, 1, 2], reader.payloads([0, 1]), out, crop=crop)
