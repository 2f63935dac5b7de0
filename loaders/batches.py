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
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler

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


class RankBatchSampler(BatchSampler, DistributedSampler):
    """Batches of a sampler that is split by rank already (a ``DistributedSampler``, such as
    ``PackSampler``), and itself a ``DistributedSampler`` by type.

    ``batch_loader`` hands its DataLoader the batch sampler as ``sampler``, where frameworks look
    for a distributed one: Lightning (``use_distributed_sampler``) would otherwise split the batches
    by rank a second time, and would not find the inner sampler to call ``set_epoch`` on. The
    DistributedSampler attributes are the inner sampler's, except ``drop_last``, which keeps its
    BatchSampler meaning (drop a last short batch) as batch samplers' readers expect.
    """

    def __init__(self, sampler: DistributedSampler, batch_size: int, drop_last: bool) -> None:
        # DistributedSampler.__init__ is not called: the split is the inner sampler's.
        BatchSampler.__init__(self, sampler, batch_size, drop_last)

    @property
    def num_replicas(self) -> int:
        """The ranks the inner sampler splits over."""
        return self.sampler.num_replicas

    @property
    def rank(self) -> int:
        """This process's rank in the inner sampler's split."""
        return self.sampler.rank

    @property
    def epoch(self) -> int:
        """The inner sampler's epoch."""
        return self.sampler.epoch

    @property
    def shuffle(self) -> bool:
        """Whether the inner sampler shuffles."""
        return self.sampler.shuffle

    @property
    def seed(self) -> int:
        """The inner sampler's seed."""
        return self.sampler.seed

    @property
    def num_samples(self) -> int:
        """Samples (not batches) this rank yields per epoch."""
        return len(self.sampler)

    @property
    def total_size(self) -> int:
        """Samples all ranks yield per epoch together."""
        return self.sampler.total_size

    @property
    def dataset(self) -> Any:
        """What the inner sampler samples from."""
        return self.sampler.dataset

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the inner sampler (frameworks call this once per epoch)."""
        self.sampler.set_epoch(epoch)


def batch_loader(dataset: PackedImageFolder, batch_size: int, *, sampler: Sampler[int] | None = None,
                 drop_last: bool = False, channels_last: bool = False, crop: CenterCrop | int | None = None,
                 encoded: bool = False, **dataloader_args: Any) -> DataLoader:
    """A DataLoader yielding ``(B×3×H×W uint8, B int64)`` batches built whole in the workers.

    ``sampler`` defaults to ``dataset.sampler()`` (block-shuffled, rank-aware, resumable); keep a
    reference to call ``set_epoch`` and ``state_dict`` on it (``loader.sampler.set_epoch`` forwards
    to it too, which is what Lightning calls). ``crop`` (a ``CenterCrop`` or its
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
    # A sampler split by rank gives batches that say so, for frameworks (RankBatchSampler); any
    # other keeps the plain BatchSampler, which a framework may split by rank itself.
    batches = (RankBatchSampler if isinstance(sampler, DistributedSampler) else BatchSampler)(
        sampler, batch_size, drop_last)
    return DataLoader(PackBatches(dataset, channels_last, crop, encoded), batch_size=None, sampler=batches,
                      **dataloader_args)
