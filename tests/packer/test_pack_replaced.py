"""A pack replaced under a reader (``pack B DEST --overwrite`` while a dataset reads DEST): every
process that opens the path again notices that it holds another pack and says so; a reader that
keeps the pack open goes on reading the pack it opened, never B's records under A's index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torch.utils.data import DataLoader

from packload import PackedImageFolder
from packload.core.errors import PackChangedError, PackFormatError
from packload.loaders.collate import collate_as_list
from packload.loaders.read import PackReader
from packload.packer.pipeline import pack

BACKENDS = ["lmdb", "shards"]


def _source(root: Path, seed: int, classes: tuple[str, ...]) -> Path:
    """A folder of PNGs; the two sources differ in pixels and in how classes are named and counted."""
    rng = np.random.default_rng(seed)
    for k, name in enumerate(classes):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(6 + 2 * k):
            Image.fromarray(rng.integers(0, 255, (80, 96, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    return root


def _packs(tmp_path: Path, backend: str) -> tuple[Path, Path, Path]:
    a = _source(tmp_path / "a", 1, ("cat", "dog"))
    b = _source(tmp_path / "b", 2, ("ant", "bee", "cow"))
    dest = tmp_path / f"data.{backend}"
    pack(a, dest, progress=False, shard_size=1 << 16)
    return a, b, dest


@pytest.mark.parametrize("backend", BACKENDS)
def test_workers_of_the_next_epoch_refuse_the_replaced_pack(tmp_path: Path, backend: str) -> None:
    _, b, dest = _packs(tmp_path, backend)
    ds = PackedImageFolder(dest, output="numpy")
    first = [label for batch in DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_as_list)
             for _, label in batch]
    assert first == ds.targets
    pack(b, dest, overwrite=True, progress=False, shard_size=1 << 16)
    with pytest.raises(PackChangedError, match="another pack"):
        list(DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_as_list))
    ds.close()  # this process too, once it opens the path again
    with pytest.raises(PackChangedError, match="create the dataset again"):
        ds[0]
    assert PackedImageFolder(dest).classes == ["ant", "bee", "cow"]  # a new dataset reads the new pack


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_open_reader_keeps_reading_the_pack_it_opened(tmp_path: Path, backend: str) -> None:
    """The shards reader maps its shards lazily, through the folder it opened: after the path is
    given to another pack it reads the old pack's shards or fails clearly, never the new ones."""
    _, b, dest = _packs(tmp_path, backend)
    with PackReader(dest) as before:
        expected = [bytes(before.payload(i)) for i in range(before.records)]
    reader = PackReader(dest)
    try:
        first = bytes(reader.payload(0))  # maps the first part only
        pack(b, dest, overwrite=True, progress=False, shard_size=1 << 16)
        with PackReader(dest) as after:
            new = {bytes(after.payload(i)) for i in range(after.records)}
        got = []
        for i in range(reader.records):
            try:
                got.append(bytes(reader.payload(i)))
            except PackFormatError as exc:
                assert "gone since the pack was opened" in str(exc)
                got.append(None)
        assert first == expected[0]
        if backend == "shards":
            assert None in got  # shards not mapped before the replacement: gone, and said so
        assert all(data is None or data == want for data, want in zip(got, expected, strict=True))
        assert not new & {data for data in got if data is not None}
    finally:
        reader.close()


def test_a_pack_of_many_shards_holds_few_descriptors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every mapped shard holds a descriptor: a reader keeps only so many mapped (and fewer still
    open for hints), so that a pack of thousands of shards never runs out of descriptors. The bytes
    read are the same when maps are dropped and made again."""
    import os

    import packload.loaders.read_shards as read_shards

    _, _, dest = _packs(tmp_path, "shards")
    monkeypatch.setattr(read_shards, "_MAPS_KEPT", 2)
    monkeypatch.setattr(read_shards, "_HINT_FDS_KEPT", 1)
    with PackReader(dest) as reference:
        expected = [bytes(reference.payload(i)) for i in range(reference.records)]
        parts = len(reference.part_names)
    assert parts >= 4
    before = len(os.listdir("/proc/self/fd"))
    with PackReader(dest) as reader:
        order = np.random.default_rng(3).permutation(reader.records)
        for start in range(0, len(order), 3):
            batch = order[start : start + 3].tolist()
            assert [bytes(p) for p in reader.payloads(batch)] == [expected[i] for i in batch]
            assert len(os.listdir("/proc/self/fd")) - before <= 1 + 3 + 3 + 1  # folder, maps and hints of a batch
