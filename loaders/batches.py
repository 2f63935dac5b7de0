"""Whole batches from a worker in one piece: the fast way to feed a training loop from a pack.

``batch_loader(ds, 256)`` is a standard ``DataLoader`` over ``PackBatches(ds)`` with
``batch_size=None`` and a ``BatchSampler`` as its sampler, so each worker reads, decodes and
stacks a whole batch (``PackedImageFolder.get_batch``) and hands over one uint8 tensor through
shared memory, instead of pickling every sample and collating them in the main process.
Workers, ``pin_memory``, ``prefetch_factor`` and ``persistent_workers`` work as usual.
``encoded=True`` hands over the stored bytes instead, undecoded (``(data, offsets, labels)``, three
tensors per batch, for decoding on the GPU or elsewhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from packload.loaders.crop import CenterCrop
from packload.loaders.dataset import PackedImageFolder


class PackBatches(Dataset):
    """A view of a ``PackedImageFolder`` whose items are whole batches: ``view[list_of_indices]``."""

    def __init__(self, dataset: PackedImageFolder, channels_last: bool = False, crop: CenterCrop | None = None,
                 encoded: bool = False) -> None:
        if encoded and (crop is not None or channels_last):
            raise ValueError("encoded=True hands over the stored bytes: crop and channels_last cannot apply")
        self.dataset = dataset
        self.channels_last = channels_last
        self.crop = crop
        self.encoded = encoded

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: Sequence[int]) -> tuple[torch.Tensor, ...]:
        if self.encoded:
            return self.dataset.get_encoded_batch(indices)
        return self.dataset.get_batch(indices, channels_last=self.channels_last, crop=self.crop)


def batch_loader(dataset: PackedImageFolder, batch_size: int, *, sampler: Sampler[int] | None = None,
                 drop_last: bool = False, channels_last: bool = False, crop: CenterCrop | int | None = None,
                 encoded: bool = False, **dataloader_args: Any) -> DataLoader:
    """A DataLoader yielding ``(B×3×H×W uint8, B int64)`` batches built whole in the workers.

    ``sampler`` defaults to ``dataset.sampler()`` (block-shuffled, rank-aware, resumable); keep a
    reference to call ``set_epoch`` and ``state_dict`` on it. ``crop`` (a ``CenterCrop`` or its
    side) is applied to every image. ``encoded=True`` yields the stored bytes undecoded instead,
    ``(data, offsets, labels)`` as ``PackedImageFolder.get_encoded_batch`` gives them: each batch
    crosses from a worker as three tensors, nothing per sample. Other arguments go to DataLoader.
    In one process, ``PackLoader`` gives the same batches from threads, without the per-batch cost
    of workers.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size} must be at least 1")
    sampler = sampler if sampler is not None else dataset.sampler()
    crop = CenterCrop(crop) if isinstance(crop, int) else crop
    return DataLoader(PackBatches(dataset, channels_last, crop, encoded), batch_size=None,
                      sampler=BatchSampler(sampler, batch_size, drop_last), **dataloader_args)
