"""Tests for loaders.decode_threads: a batch asked of PackedImageFolder outside DataLoader workers is
decoded on threads, and gives exactly what decoding one record at a time gives (pixels, order,
random transforms' draws, damaged records skipped with the same warnings)."""

from __future__ import annotations

import pickle
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import packload
from packload import EncodeOptions, PackedImageFolder, PackReader
from packload.loaders.decode_threads import DecodeThreads
from tests.image_factory import make_image_folder

BACKENDS = ["x.shards", "x.lmdb"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("src")
    make_image_folder(root, classes=("ant", "bee", "cow"), per_class=6)  # JPEG and PNG alternate
    return root


@pytest.fixture(scope="module", params=BACKENDS)
def pack(request: pytest.FixtureRequest, source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("pack") / request.param
    packload.pack(source, dst, options=EncodeOptions(encoding="keep"), workers=1, progress=False,
                  shard_size=64 << 10)
    return dst


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(la == lb and np.array_equal(np.asarray(ia), np.asarray(ib))
                                    for (ia, la), (ib, lb) in zip(a, b, strict=True))


@pytest.mark.parametrize("output", ["numpy", "tensor", "pil"])
def test_a_batch_decoded_on_threads_equals_one_record_at_a_time(pack: Path, output: str) -> None:
    indices = [5, 0, 17, 3, 3, 11, 8, 2]  # out of order, one asked twice
    threaded = PackedImageFolder(pack, output=output, decode_threads=3)
    alone = PackedImageFolder(pack, output=output, decode_threads=1)
    assert _same(threaded.__getitems__(indices), [alone[i] for i in indices])
    assert _same(threaded.__getitems__(indices), alone.__getitems__(indices))


def test_the_decoding_runs_on_the_pool_and_not_with_one_thread(pack: Path) -> None:
    for threads, expected in ((3, "packload-decode"), (1, threading.main_thread().name)):
        ds = PackedImageFolder(pack, output="numpy", decode_threads=threads)
        names: list[str] = []
        maker = ds._maker()
        decode = maker.decode

        def noting(*args: object, decode=decode, names=names) -> object:
            names.append(threading.current_thread().name)
            return decode(*args)

        maker.decode = noting  # type: ignore[method-assign]
        ds.__getitems__(list(range(8)))
        assert len(names) == 8 and all(name.startswith(expected) for name in names), (threads, names)


def test_random_transforms_draw_in_the_batch_order(pack: Path) -> None:
    """Transforms run in the calling thread, in order: the same seed gives the same draws."""
    def jitter(image: np.ndarray) -> tuple[np.ndarray, float]:
        return image, float(torch.rand(()))

    indices = list(range(12))
    got = []
    for threads in (4, 1):
        torch.manual_seed(7)
        ds = PackedImageFolder(pack, output="numpy", transform=jitter, decode_threads=threads)
        got.append([(image.tobytes(), draw, label) for (image, draw), label in ds.__getitems__(indices)])
    assert got[0] == got[1]


def test_a_damaged_record_is_skipped_as_one_at_a_time_would(source: Path, tmp_path: Path) -> None:
    pack = tmp_path / "x.shards"
    packload.pack(source, pack, options=EncodeOptions(encoding="keep"), workers=1, progress=False)
    with PackReader(pack) as reader:
        k = [reader.path_of(i) for i in range(reader.records)].index("bee/img_001.png")
        entry = reader.entries[k]
        shard = pack / reader.part_names[int(entry["part"])]
        offset = int(entry["payload_offset"]) + len(bytes(reader.payload(k))) // 2
    data = bytearray(shard.read_bytes())
    data[offset] ^= 0xFF  # the PNG's checksum no longer holds: it cannot be decoded
    shard.write_bytes(data)
    indices = list(range(k - 2, k + 3))
    results = []
    for threads in (3, 1):
        ds = PackedImageFolder(pack, output="numpy", on_error="skip", decode_threads=threads)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batch = ds.__getitems__(indices)
        results.append((batch, [str(w.message) for w in caught]))
    assert _same(results[0][0], results[1][0]) and results[0][1] == results[1][1]
    assert len(results[0][1]) == 1 and "bee/img_001.png" in results[0][1][0]
    assert np.array_equal(results[0][0][2][0], results[0][0][3][0])  # the next intact record in its place
    with pytest.raises(packload.PackloadError, match="bee/img_001.png"):
        PackedImageFolder(pack, output="numpy", decode_threads=3).__getitems__(indices)


class _AskWanted(Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> bool:
        return DecodeThreads(2).wanted(8)


def test_no_threads_of_ours_inside_dataloader_workers() -> None:
    assert DecodeThreads(2).wanted(8)  # here, in the main process
    assert not DecodeThreads(2).wanted(1) and not DecodeThreads(1).wanted(8)
    got = list(DataLoader(_AskWanted(), batch_size=None, num_workers=1))
    assert got == [False, False]


def test_a_dataset_whose_pool_started_still_pickles_and_reads(pack: Path) -> None:
    ds = PackedImageFolder(pack, output="numpy", decode_threads=2)
    first = ds.__getitems__([0, 1, 2])
    again = pickle.loads(pickle.dumps(ds))
    assert _same(again.__getitems__([0, 1, 2]), first)
    with pytest.raises(ValueError, match="decode_threads 0"):
        PackedImageFolder(pack, decode_threads=0)
