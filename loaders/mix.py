"""Several packs read as one dataset, mixed by weight: ``packload.mix([noisy, clean], weights=[0.7, 0.3])``.

``MixedPacks`` lays the packs' records end to end (pack ``p``'s record ``r`` is index
``offsets[p] + r``) and reads each index from its pack: ``ds[i]``, ``__getitems__`` (a DataLoader's
batches), ``get_batch`` and ``get_encoded_batch`` (``PackLoader`` and ``batch_loader``) split a batch
by pack, let each pack build its part as it would alone, and put the parts back in the batch's order.
``target=`` chooses what comes beside each image, as for one pack: each pack reads it from its own
fields (``loaders.fields.mix_targets``) and the parts are batched as one. The mixing itself is the
sampler's (``MixedPacks.sampler()``, a :class:`MixSampler`): how many samples each pack gives per
epoch, in what order, what happens when a pack runs out, the rank split and resume. Labels follow
``loaders/mix_classes.py``. docs/MIXING.md has the whole story.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from packload.core.errors import UsageError
from packload.loaders.crop import CenterCrop
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.fields import Target, TargetSpec, mix_targets
from packload.loaders.hints import PackHints
from packload.loaders.mix_classes import merge_classes, pack_names
from packload.loaders.mix_sampler import MixSampler, check_samples_per_epoch, check_weights, pack_seed
from packload.loaders.random_crop import Draws, RandomResizedCrop
from packload.loaders.sampler import Prefetch, check_int, default_rank

__all__ = ["MixHints", "MixedPacks", "mix"]


class MixHints:
    """Announces upcoming indices of a mix to each pack's reader: the indices are split by pack and
    each pack's records passed to its own hints (:class:`loaders.hints.PackHints`), in order."""

    def __init__(self, offsets: np.ndarray, hints: Sequence[PackHints | None]) -> None:
        self.offsets, self.hints = np.asarray(offsets, dtype=np.int64), list(hints)

    def __call__(self, indices: np.ndarray) -> int:
        indices = np.asarray(indices, dtype=np.int64)
        packs = np.searchsorted(self.offsets, indices, side="right") - 1
        asked = 0
        for pack, hint in enumerate(self.hints):
            chosen = indices[packs == pack]
            if hint is not None and chosen.size:
                asked += hint(chosen - self.offsets[pack])
        return asked


class MixedPacks(Dataset):
    """Packs read as one dataset, their records end to end, sampled by weight (:func:`mix` builds it).

    ``ds[i]`` is ``(image, class_index)`` from the pack that holds index ``i`` (each pack's own
    ``transform`` and output apply), with the class index in the mix's ``classes``; with a ``target``,
    ``(image, target)``, the target read from that pack's fields as ``PackedImageFolder(target=...)``
    reads it (``label`` being the mix's class index). ``len(ds)`` is all the packs' records; an
    epoch's samples, and how each pack's share is drawn, are the ``sampler()``'s: give it to
    ``PackLoader``, ``batch_loader`` or a ``DataLoader``.

    Attributes:
        datasets: the packs, in the mix's order; ``names``: their names (``classes`` uses them).
        offsets: index of each pack's first record in the mix (one more entry: the total).
        weights: each pack's share of an epoch (summing to 1); ``samples_per_epoch``: the epoch's size.
        classes, class_to_idx, targets: as ImageFolder's, over the mix (rule: docs/MIXING.md).
        label_offsets: what is added to each pack's own class indices (0 when the packs share classes).
        target: what comes beside each image (None: the class index); see :func:`mix`.
    """

    def __init__(self, datasets: Sequence[PackedImageFolder], weights: Sequence[float] | None = None,
                 samples_per_epoch: int | None = None, *, seed: int = 0, names: Sequence[str] | None = None,
                 target: TargetSpec | None = None) -> None:
        if isinstance(datasets, PackedImageFolder) or not isinstance(datasets, Sequence) or not datasets:
            raise ValueError("datasets must be a non-empty list of PackedImageFolder packs, "
                             f"got {type(datasets).__name__}")
        for k, dataset in enumerate(datasets):
            if not isinstance(dataset, PackedImageFolder):
                raise TypeError(f"datasets[{k}] is a {type(dataset).__name__}; mix() takes PackedImageFolder packs "
                                "(open each with packload.PackedImageFolder(path))")
        self.datasets = list(datasets)
        self.sizes = [len(dataset) for dataset in self.datasets]
        self.weights = check_weights(weights, self.sizes)
        self.samples_per_epoch = check_samples_per_epoch(samples_per_epoch, self.sizes)
        self.seed = check_int("seed", seed, 0)
        self.names = pack_names([dataset.root for dataset in self.datasets], names)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.classes, offsets = merge_classes([dataset.classes for dataset in self.datasets], self.names)
        self.label_offsets = np.asarray(offsets, dtype=np.int64)
        if self.label_offsets.any():
            with_transform = [k for k, dataset in enumerate(self.datasets) if dataset.target_transform is not None]
            if with_transform:
                raise UsageError(f"pack {with_transform[0]} has a target_transform, but the packs' classes differ, so "
                                 "the mix shifts each pack's class indices: remove it and map the mix's labels instead")
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.target = _one_target(target, self.datasets, self.names)
        self._target: Target | None = None
        if self.target is not None:  # each pack reads it from its own fields, its labels the mix's
            targets = mix_targets(self.target, [(f"{name!r} ({dataset.shown})", dataset.fields, int(offset))
                                                for name, dataset, offset in zip(self.names, self.datasets,
                                                                                 self.label_offsets, strict=True)])
            self.datasets = [dataset.retarget(pack_target) for dataset, pack_target in zip(self.datasets, targets,
                                                                                            strict=True)]
            self._target = targets[0]
        self.targets = [target + int(self.label_offsets[p]) for p, dataset in enumerate(self.datasets)
                        for target in dataset.targets]

    # -- where an index lives ----------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(pack number, record in that pack) of each index (negative ones count from the end);
        IndexError names the first one out of range."""
        positions = np.asarray(indices, dtype=np.int64).reshape(-1)
        total = len(self)
        if positions.size and (positions.min() < 0 or positions.max() >= total):
            bad = (positions < -total) | (positions >= total)
            if bad.any():
                raise IndexError(f"index {int(positions[bad][0])} out of range: the mix has {total} records")
            positions = np.where(positions < 0, positions + total, positions)
        packs = np.searchsorted(self.offsets, positions, side="right") - 1
        return packs, positions - self.offsets[packs]

    def _groups(self, packs: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(pack, the batch's rows from it) for each pack present, in the mix's order."""
        if packs.size and (packs == packs[0]).all():
            return [(int(packs[0]), np.arange(packs.size))]
        return [(int(pack), np.flatnonzero(packs == pack)) for pack in np.unique(packs)]

    def draws_of(self, pack: int, draws: Draws) -> Draws:
        """The key of pack ``pack``'s crop and flip draws in a run keyed by ``draws``: its own seed
        (:func:`loaders.mix_sampler.pack_seed`), so two packs' records never share boxes."""
        return Draws(pack_seed(draws.seed, pack), draws.epoch, draws.rank)

    # -- ImageFolder's surface ---------------------------------------------------------------
    def __getitem__(self, index: int) -> tuple[Any, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, Any]]:
        """A batch of ``(image, class_index)`` (or ``(image, target)``) in the order asked, each pack
        reading its own records in one call (as a DataLoader asks a dataset for a batch)."""
        packs, records = self.locate(indices)
        samples: list[Any] = [None] * len(records)
        for pack, rows in self._groups(packs):
            offset = int(self.label_offsets[pack]) if self._target is None else 0  # a target's labels are shifted
            got = self.datasets[pack].__getitems__(records[rows].tolist())
            for row, (image, target) in zip(rows.tolist(), got, strict=True):
                samples[row] = (image, target + offset if offset else target)
        return samples

    @property
    def samples(self) -> list[tuple[str, int]]:
        """(full path, class index) of every record, as ImageFolder's ``samples``: each pack's
        ``samples`` in turn, with the mix's class indices."""
        return [(path, target + int(self.label_offsets[p])) for p, dataset in enumerate(self.datasets)
                for path, target in dataset.samples]

    imgs = samples

    def set_epoch(self, epoch: int, seed: int = 0, rank: int | None = None) -> None:
        """The key of random transforms' draws on the drop-in path, as ``PackedImageFolder.set_epoch``:
        give the sampler's epoch and seed, and each pack's records get the crops ``PackLoader`` gives."""
        rank = default_rank() if rank is None else int(rank)
        for pack, dataset in enumerate(self.datasets):
            dataset.set_epoch(epoch, seed=pack_seed(check_int("seed", seed, 0), pack), rank=rank)

    # -- whole batches (PackLoader, batch_loader) ---------------------------------------------
    def get_batch(self, indices: Sequence[int], channels_last: bool = False, *,
                  crop: CenterCrop | RandomResizedCrop | None = None, pin_memory: bool = False,
                  fast_idct: bool = False, flip: bool | float = False,
                  draws: Draws | None = None, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(B×3×H×W uint8, B int64)`` for the mix's ``indices``, as ``PackedImageFolder.get_batch``
        (with a ``target``, its values batched in place of the class indices).

        Each pack builds its rows with its own ``get_batch`` (same crop, flip and options; the draws
        keyed by ``draws_of(pack, draws)`` and the record's number in its pack) in the order asked:
        with a crop, each pack decodes straight into its rows of one batch (``out`` when it fits, as
        for a pack); without one, each pack's images are copied into theirs. Labels are the mix's."""
        packs, records = self.locate(indices)
        draws = draws or Draws()
        groups = self._groups(packs)
        options = {"crop": crop, "pin_memory": pin_memory, "fast_idct": fast_idct, "flip": flip}
        if len(groups) <= 1:
            pack = groups[0][0] if groups else 0
            images, labels = self.datasets[pack].get_batch(records, channels_last, **options,
                                                           draws=self.draws_of(pack, draws), out=out)
            return images, self._joined([(pack, np.arange(len(records)), labels)], len(records), pin_memory)
        pin = pin_memory and torch.cuda.is_available()
        parts: list[tuple[int, np.ndarray, Any]] = []  # each pack's targets, and their rows in the batch
        layout = torch.channels_last if channels_last else torch.contiguous_format
        if crop is not None:  # each pack decodes straight into its rows of the batch: no copy
            shape = (len(records), 3, crop.size, crop.size)
            if out is None or out.shape != shape or out.dtype != torch.uint8 or not out.is_contiguous(memory_format=layout):
                out = torch.empty(shape, dtype=torch.uint8, memory_format=layout, pin_memory=pin)
            for pack, rows in groups:
                _, part_labels = self.datasets[pack].get_batch(records[rows], channels_last, **options,
                                                               draws=self.draws_of(pack, draws), out=out, rows=rows)
                parts.append((pack, rows, part_labels))
            return out, self._joined(parts, len(records), pin_memory)
        # Without a crop, each pack's images (one size) are copied into their rows of the batch, in
        # the order asked.
        first: tuple[str, tuple[int, ...]] | None = None
        for pack, rows in groups:
            images, part_labels = self.datasets[pack].get_batch(records[rows], channels_last, **options,
                                                                draws=self.draws_of(pack, draws))
            if first is None:
                first = (self.names[pack], tuple(images.shape[1:]))
                shape = (len(records), *first[1])
                if out is None or out.shape != shape or out.dtype != torch.uint8 \
                        or not out.is_contiguous(memory_format=layout):
                    out = torch.empty(shape, dtype=torch.uint8, memory_format=layout, pin_memory=pin)
            elif tuple(images.shape[1:]) != first[1]:
                raise UsageError(f"pack {first[0]!r} gives {first[1]} images and pack {self.names[pack]!r} "
                                 f"{tuple(images.shape[1:])}: one batch needs one size; give a crop "
                                 "(CenterCrop or RandomResizedCrop) or packs of one image size")
            # NumPy copies whole rows (torch's index_copy_ goes byte by byte)
            _rows(out, channels_last, view=True).numpy()[rows] = _rows(images, channels_last).numpy()
            parts.append((pack, rows, part_labels))
        return out, self._joined(parts, len(records), pin_memory)

    def get_encoded_batch(self, indices: Sequence[int], *,
                          pin_memory: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's stored payloads, undecoded, as ``PackedImageFolder.get_encoded_batch``: one flat
        uint8 tensor, ``B+1`` int64 offsets, ``B`` int64 labels (the mix's; or the ``target``'s values), in
        the order asked."""
        packs, records = self.locate(indices)
        groups = self._groups(packs)
        if len(groups) <= 1:
            pack = groups[0][0] if groups else 0
            data, offsets, labels = self.datasets[pack].get_encoded_batch(records, pin_memory=pin_memory)
            return data, offsets, self._joined([(pack, np.arange(len(records)), labels)], len(records), pin_memory)
        pieces: list[torch.Tensor] = [torch.empty(0, dtype=torch.uint8)] * len(records)
        parts: list[tuple[int, np.ndarray, Any]] = []
        for pack, rows in groups:
            data, offsets, part_labels = self.datasets[pack].get_encoded_batch(records[rows])
            bounds = offsets.tolist()
            for k, row in enumerate(rows.tolist()):
                pieces[row] = data[bounds[k] : bounds[k + 1]]
            parts.append((pack, rows, part_labels))
        lengths = torch.tensor([0] + [piece.numel() for piece in pieces], dtype=torch.int64)
        data = torch.cat(pieces)
        offsets = torch.cumsum(lengths, 0)
        labels = self._joined(parts, len(records), pin_memory)
        if pin_memory and torch.cuda.is_available():
            return data.pin_memory(), offsets.pin_memory(), labels
        return data, offsets, labels

    def _joined(self, parts: list[tuple[int, np.ndarray, Any]], size: int, pin_memory: bool) -> Any:
        """The batch's targets from each pack's (``(pack, its rows in the batch, its targets)``), in the
        batch's order: the class indices as the mix's (int64, pinned with ``pin_memory`` where CUDA
        is), or the ``target``'s values batched as one pack batches them."""
        if self._target is not None:
            return self._target.merge([(rows, part) for _, rows, part in parts], size)
        if len(parts) == 1:  # the whole batch from one pack, in order
            return self._shifted(parts[0][2], parts[0][0])
        labels = torch.empty(size, dtype=torch.int64, pin_memory=pin_memory and torch.cuda.is_available())
        for pack, rows, part in parts:
            labels.numpy()[rows] = part.numpy() + self.label_offsets[pack]
        return labels

    def _shifted(self, labels: torch.Tensor, pack: int) -> torch.Tensor:
        """A pack's labels as the mix's class indices."""
        offset = int(self.label_offsets[pack])
        if not offset:
            return labels
        shifted = labels + offset
        return shifted.pin_memory() if labels.is_pinned() else shifted

    # -- sampling ------------------------------------------------------------------------------
    def sampler(self, shuffle: bool = True, seed: int | None = None, *, prefetch: Prefetch | bool = True,
                **options: Any) -> MixSampler:
        """A :class:`MixSampler` over this mix: its weights and epoch size, each pack in its own
        block-shuffled order, split over DDP ranks with equal counts, resumable. ``seed`` defaults to
        the mix's; ``options`` go to ``MixSampler`` (``order``, ``block_size``, ``window_blocks``,
        ``rank``, ``world_size``, ``uneven``).

        ``prefetch=True`` (the default): the sampler announces each window of upcoming records to
        their packs' readers ahead of the reads, as ``PackedImageFolder.sampler`` does for one pack
        (not with ``order="random"``); ``False`` announces nothing; a callable gets the mix's indices."""
        if prefetch is True:
            random = shuffle and options.get("order", "block") == "random"
            prefetch = None if random else MixHints(self.offsets, [
                PackHints(dataset.root, opener=dataset.reader) for dataset in self.datasets])
        elif prefetch is False:
            prefetch = None
        return MixSampler(self.sizes, self.weights, self.samples_per_epoch, shuffle=shuffle,
                          seed=self.seed if seed is None else seed, prefetch=prefetch, **options)

    # -- what PackLoader asks of a dataset ---------------------------------------------------------
    @property
    def encoding(self) -> str:
        """The packs' encoding when they share one (keep, jpeg, png or raw), else ``"mixed"``."""
        encodings = {dataset.encoding for dataset in self.datasets}
        return encodings.pop() if len(encodings) == 1 else "mixed"

    @property
    def exif_transpose(self) -> bool:
        """Whether any pack turns images upright by their EXIF orientation."""
        return any(dataset.exif_transpose for dataset in self.datasets)

    @property
    def parallel_reads(self) -> bool:
        """Whether any pack reads ahead from many threads (network and FUSE storage)."""
        return any(dataset.parallel_reads for dataset in self.datasets)

    def close(self) -> None:
        """Let go of every pack's files in this process (the next read opens them again)."""
        for dataset in self.datasets:
            dataset.close()

    def __repr__(self) -> str:
        packs = ", ".join(f"{name}: {size} records, weight {weight:.3g}"
                          for name, size, weight in zip(self.names, self.sizes, self.weights, strict=True))
        return f"MixedPacks([{packs}], samples_per_epoch={self.samples_per_epoch}, classes={len(self.classes)})"


def _rows(images: torch.Tensor, channels_last: bool, view: bool = False) -> torch.Tensor:
    """A B×3×H×W batch as B rows of bytes (each row one image's memory, so copying rows is one
    memcpy each): a view when it is laid out as said (``view``: always, else an error), else a copy."""
    rows = images.permute(0, 2, 3, 1) if channels_last else images
    return rows.view(images.shape[0], -1) if view else rows.reshape(images.shape[0], -1)


def _one_target(target: TargetSpec | None, datasets: Sequence[PackedImageFolder],
                names: Sequence[str]) -> TargetSpec | None:
    """The mix's target: ``target``, or the one every pack was opened with. A pack opened with another
    is refused (a mix gives one target)."""
    own = [dataset.target for dataset in datasets]
    chosen = own[0] if target is None else target
    for name, spec in zip(names, own, strict=True):
        if (spec is not None or target is None) and not _same_target(spec, chosen):
            given = f"the mix with target={target!r}" if target is not None else \
                f"pack {names[0]!r} with target={own[0]!r}"
            raise UsageError(f"pack {name!r} was opened with target={spec!r} and {given}: a mix gives one "
                             "target; open the packs without one and give it once, mix(..., target=...)")
    return chosen


def _same_target(a: TargetSpec | None, b: TargetSpec | None) -> bool:
    """Whether two targets give the same values (a list of names as its tuple)."""
    if a is None or b is None or isinstance(a, str) or isinstance(b, str) or callable(a) or callable(b):
        return a is b or a == b
    return tuple(a) == tuple(b)


def mix(datasets: Sequence[PackedImageFolder], weights: Sequence[float] | None = None,
        samples_per_epoch: int | None = None, *, seed: int = 0, names: Sequence[str] | None = None,
        target: TargetSpec | None = None) -> MixedPacks:
    """Several packs as one dataset whose sampler draws from them by weight (docs/MIXING.md).

    Args:
        datasets: the packs (``PackedImageFolder``), each with its own options and transform.
        weights: each pack's share of every epoch, any scale (``[0.7, 0.3]``, ``[7, 3]``); None: in
            proportion to the packs' sizes (each record once per epoch, a plain concatenation).
        samples_per_epoch: samples per epoch, all ranks together; None: all the packs' records.
        seed: the default seed of ``sampler()``.
        names: the packs' names, used in ``classes`` where two packs' class names collide; default:
            each pack's file name without its suffix.
        target: what comes beside each image, as ``PackedImageFolder(target=...)``: a field's name, a
            tuple of names (``label`` is the mix's class index), or a callable given a mapping of the
            record's fields. Every pack must have the fields it names, of one type; batches hold the
            values of every pack (numbers as tensors, strings as lists). None: the class index, or the
            target every pack was opened with.

    A pack whose share exceeds its records starts a new pass, in a new order, when it runs out; one
    whose share is smaller goes on in the next epoch where it stopped, so every record is drawn once
    before any is drawn again.
    """
    return MixedPacks(datasets, weights, samples_per_epoch, seed=seed, names=names, target=target)
