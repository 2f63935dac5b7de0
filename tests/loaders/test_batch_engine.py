"""The batch engine (``loaders/batch_engine.py``) reads a dataset only through ``BatchSource``: a
small source of its own, over a pack the test makes, gets the batches ``PackedImageFolder`` gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from packload import CenterCrop, EncodeOptions, PackedImageFolder, RandomResizedCrop, pack
from packload.core.errors import UsageError
from packload.loaders.batch_engine import BatchEngine
from packload.loaders.random_crop import Draws
from packload.loaders.read import PackReader
from tests.image_factory import make_image_folder


class MinimalSource:
    """Only what ``BatchSource`` names: options, a reader, targets (the class indices)."""

    transform = None
    exif_transpose = False
    verify = True
    on_error = "raise"
    fast_jpeg = True

    def __init__(self, path: Path) -> None:
        self.shown = str(path)
        self._reader = PackReader(path)
        self.encoding = self._reader.encoding

    def __len__(self) -> int:
        return self._reader.records

    def reader(self) -> PackReader:
        return self._reader

    def transformed_batch(self, positions: np.ndarray, pin_memory: bool) -> tuple[torch.Tensor, torch.Tensor]:
        raise AssertionError("no transform: never asked")

    def batch_targets(self, reader: PackReader, chosen, labels: torch.Tensor) -> torch.Tensor:
        return labels


@pytest.fixture(scope="module", params=["jpeg", "raw"])
def packed(request, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("engine")
    make_image_folder(root / "src", classes=("a", "b", "c"), per_class=6, seed=8)
    dst = root / f"p-{request.param}.shards"
    size = (40, 48) if request.param == "raw" else None
    pack(root / "src", dst, options=EncodeOptions(encoding=request.param, size=size), workers=1, progress=False)
    return dst


@pytest.mark.parametrize("crop", [CenterCrop(24), RandomResizedCrop(20, flip=0.5), None], ids=repr)
def test_a_source_of_its_own_gets_the_datasets_batches(packed: Path, crop) -> None:
    ds = PackedImageFolder(packed)
    engine = BatchEngine(MinimalSource(packed))
    indices = [5, 0, 17, 9, 9, 2]
    if crop is None and ds.encoding != "raw":  # images of several sizes: one line naming the pack
        with pytest.raises(UsageError, match=f"{packed}: images of different sizes"):
            engine.get_batch(indices, True)
        return
    draws = Draws(seed=2, epoch=1)
    flip = getattr(crop, "flip", 0.0) if crop is not None else 0.0
    got, labels = engine.get_batch(indices, True, crop=crop, flip=flip, draws=draws)
    want, want_labels = ds.get_batch(indices, True, crop=crop, flip=flip, draws=draws)
    assert torch.equal(got, want) and torch.equal(labels, want_labels)
    assert labels.tolist() == [ds.targets[i] for i in indices]
    data, offsets, encoded_labels = engine.get_encoded_batch(indices)
    with PackReader(packed) as reader:
        assert [bytes(data[offsets[k]:offsets[k + 1]].numpy()) for k in range(len(indices))] == \
            [bytes(reader.payload(i)) for i in indices]
    assert encoded_labels.tolist() == labels.tolist()
