"""``MixSampler``: each epoch, samples from several packs in stated proportions, well interleaved,
split evenly over ranks and resumable mid-epoch.

The mix's indices are the packs' records laid end to end (pack ``p``'s record ``r`` is
``offsets[p] + r``). For every epoch:

* **How many from each pack.** ``shares(weights, samples_per_epoch)``: each pack's weight times the
  epoch's size, rounded by largest remainder so that the counts add up to the epoch exactly (the same
  counts every epoch).
* **Which records.** Each pack has an endless stream of passes over its records, pass ``k`` in the
  order ``PackSampler`` gives that pack's size for epoch ``k`` under the pack's own seed
  (``pack_seed``): block-shuffled by default. Epoch ``e`` takes the stream's samples
  ``e * count .. (e + 1) * count``, so a pack is drawn without replacement while a pass lasts, an
  under-sampled pack goes on where the previous epoch stopped (every record before any repeat, over
  several epochs), and an over-sampled one starts a new pass, in a new order, when it runs out.
* **In what order.** Pack ``p``'s ``j``-th sample of the epoch gets the key ``(j + u) / count_p``,
  ``u`` uniform in [0, 1) (0.5 unshuffled), and the epoch is the samples sorted by key: a jittered,
  seeded interleave. Among the first ``t`` samples of the epoch each pack has ``share * t`` of them
  within ``1 + share * packs`` (``share``: its count over the epoch's), so any window of ``k``
  samples, each rank's slice included, holds ``share * k`` of them within ``2 * (1 + share * packs)``.

Everything is a pure function of (seed, epoch, sizes, counts, options), so every rank computes the
same global order and a run resumes exactly from a small JSON state, as with ``PackSampler``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from packload.loaders.sampler import PackSampler, Prefetch, check_int

__all__ = ["MixSampler", "check_samples_per_epoch", "check_weights", "pack_seed", "shares"]

PACK_SEED_STEP = 0x9E3779B1  # pack p's passes are shuffled with seed + p * this (pack 0: the seed itself)
_INTERLEAVE = 0x6D6978  # tags the interleave's generator apart from the passes' ([seed, pass])


def pack_seed(seed: int, pack: int) -> int:
    """The seed of pack ``pack``'s passes and of its records' crop and flip draws. Pack 0 keeps
    ``seed``, so a mix of one pack gives that pack's own sampler order and crops."""
    return int(seed) + int(pack) * PACK_SEED_STEP


def check_weights(weights: Sequence[float] | None, sizes: Sequence[int]) -> list[float]:
    """``weights`` normalised to sum to 1 (None: proportional to ``sizes``), or a one-line error."""
    if weights is None:
        total = sum(sizes)
        if not total:
            raise ValueError("the packs hold no records at all; mix packs with records in them")
        return [size / total for size in sizes]
    if isinstance(weights, np.ndarray) and weights.ndim == 1:
        weights = weights.tolist()
    if isinstance(weights, (str, bytes, Mapping)) or not isinstance(weights, Sequence):
        raise TypeError(f"weights must be a list of numbers, one per pack, got {type(weights).__name__}")
    if len(weights) != len(sizes):
        raise ValueError(f"weights has {len(weights)} entries for {len(sizes)} packs; give one weight per pack")
    values = []
    for k, weight in enumerate(weights):
        if isinstance(weight, bool) or not isinstance(weight, (int, float, np.integer, np.floating)):
            raise TypeError(f"weights[{k}] must be a number, got {type(weight).__name__} ({weight!r})")
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"weights[{k}] must be a finite number >= 0, got {weight!r}")
        if weight > 0 and not sizes[k]:
            raise ValueError(f"weights[{k}] is {weight!r} but pack {k} holds no records; give it weight 0")
        values.append(float(weight))
    total = sum(values)
    if total <= 0:
        raise ValueError("weights are all 0; give at least one pack a positive weight")
    return [value / total for value in values]


def check_samples_per_epoch(samples_per_epoch: int | None, sizes: Sequence[int]) -> int:
    """The epoch's size: ``samples_per_epoch``, or all the packs' records (None)."""
    if samples_per_epoch is None:
        return check_int("samples_per_epoch (the packs' records together)", sum(sizes), 1)
    return check_int("samples_per_epoch", samples_per_epoch, 1)


def shares(weights: Sequence[float], total: int) -> list[int]:
    """Samples per pack: ``weights`` (summing to about 1) times ``total``, rounded by largest
    remainder (ties to the earlier pack) so that they sum to ``total`` exactly. Exact arithmetic:
    weights proportional to the packs' sizes give each pack its size when ``total`` is their sum."""
    exact = [Fraction(weight) for weight in weights]
    whole = sum(exact)
    quotas = [weight * total / whole for weight in exact]
    counts = [math.floor(quota) for quota in quotas]
    short = total - sum(counts)
    by_remainder = sorted(range(len(quotas)), key=lambda k: (-(quotas[k] - counts[k]), k))
    for k in by_remainder[:short]:
        counts[k] += 1
    return counts


def interleave_keys(counts: Sequence[int], rng: np.random.Generator | None) -> np.ndarray:
    """The order (a permutation of the packs' samples laid end to end, pack by pack) that interleaves
    them: pack ``p``'s ``j``-th sample sorts at ``(j + u) / counts[p]`` (``u`` from ``rng``, or 0.5)."""
    keys = []
    for count in counts:
        jitter = rng.random(count) if rng is not None else np.full(count, 0.5)
        keys.append((np.arange(count, dtype=np.float64) + jitter) / max(count, 1))
    # each pack's keys are sorted already: the stable sort merges runs (ties go to the earlier pack)
    return np.argsort(np.concatenate(keys), kind="stable")


class MixSampler(PackSampler):
    """Sampler of a mix of packs (``packload.mix``): each epoch ``samples_per_epoch`` samples, each
    pack's share by its weight, every pack in its own block-shuffled order, interleaved evenly.

    A ``PackSampler`` (so a ``DistributedSampler``) by type, with its attributes, ``set_epoch``,
    ``state_dict``/``load_state_dict`` (exact mid-epoch resume), ``begin_epoch`` and ``lookahead``, so
    ``PackLoader``, ``batch_loader``, a ``DataLoader`` and the frameworks use it as they use a pack's.
    Its indices are the mix's (``offsets[p] + record``); ``num_records`` is all the packs' records.

    Args:
        sizes: records in each pack, in the mix's order.
        weights: each pack's share of an epoch (any scale; None: proportional to ``sizes``).
        samples_per_epoch: samples all ranks draw per epoch together (None: the packs' records).
        shuffle, seed, order, block_size, window_blocks, rank, world_size, uneven: as ``PackSampler``'s;
            ``order``, ``block_size`` and ``window_blocks`` shape each pack's passes. ``shuffle=False``
            gives each pack's records in turn and an unjittered interleave.
        prefetch: a callable taking an int64 array of the mix's indices, told of them a window
            ahead (``MixedPacks.sampler`` passes one that splits them by pack for each pack's reader).
    """

    def __init__(self, sizes: Sequence[int], weights: Sequence[float] | None = None,
                 samples_per_epoch: int | None = None, *, shuffle: bool = True, seed: int = 0,
                 order: str = "block", block_size: int = 64, window_blocks: int = 32, rank: int | None = None,
                 world_size: int | None = None, uneven: str = "pad", prefetch: Prefetch = None) -> None:
        if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or not sizes:
            raise ValueError(f"sizes must be a non-empty list of record counts, one per pack, got {sizes!r}")
        self.sizes = [check_int(f"sizes[{k}]", size, 0) for k, size in enumerate(sizes)]
        self.weights = check_weights(weights, self.sizes)
        self.samples_per_epoch = check_samples_per_epoch(samples_per_epoch, self.sizes)
        if prefetch is not None and not callable(prefetch):
            raise TypeError("prefetch of a MixSampler must be a callable taking the mix's indices "
                            f"(MixedPacks.sampler builds one), got {type(prefetch).__name__}")
        super().__init__(sum(self.sizes), shuffle=shuffle, seed=seed, order=order, block_size=block_size,
                         window_blocks=window_blocks, rank=rank, world_size=world_size, uneven=uneven,
                         prefetch=prefetch)
        self.counts = shares(self.weights, self.samples_per_epoch)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)

    @property
    def options(self) -> dict[str, Any]:
        """The settings that, with (seed, epoch), determine this rank's order (saved in the state)."""
        return {**super().options, "sizes": list(self.sizes), "weights": list(self.weights),
                "samples_per_epoch": self.samples_per_epoch}

    def _total_size(self) -> int:
        """The epoch's samples after padding or dropping to a multiple of world_size."""
        n, w = self.samples_per_epoch, self.world_size
        return math.ceil(n / w) * w if self.uneven == "pad" else (n // w) * w

    def pass_order(self, pack: int, number: int) -> np.ndarray:
        """Pass ``number`` over pack ``pack``'s records (0..size-1): the order a ``PackSampler`` of
        the pack's size gives for epoch ``number`` under :func:`pack_seed`."""
        sampler = PackSampler(self.sizes[pack], shuffle=self.shuffle, seed=pack_seed(self.seed, pack),
                              order=self.order, block_size=self.block_size,
                              window_blocks=self.window_blocks, rank=0, world_size=1)
        return sampler.global_order(number)

    def pack_samples(self, pack: int, epoch: int | None = None) -> np.ndarray:
        """Pack ``pack``'s records drawn in ``epoch`` (default: the current one), in its stream's
        order: samples ``epoch * count .. (epoch + 1) * count`` of its passes laid end to end."""
        epoch = self._epoch if epoch is None else check_int("epoch", epoch, 0)
        size, count = self.sizes[pack], self.counts[pack]
        if not count:
            return np.empty(0, dtype=np.int64)
        start = epoch * count
        first, last = start // size, (start + count - 1) // size
        passes = np.concatenate([self.pass_order(pack, number) for number in range(first, last + 1)])
        skip = start - first * size
        return passes[skip : skip + count]

    def global_order(self, epoch: int | None = None) -> np.ndarray:
        """The mix's indices for ``epoch`` (default: the current one), before the rank split."""
        epoch = self._epoch if epoch is None else check_int("epoch", epoch, 0)
        streams = [self.offsets[p] + self.pack_samples(p, epoch) for p in range(len(self.sizes))]
        rng = np.random.default_rng([self.seed, epoch, _INTERLEAVE]) if self.shuffle else None
        return np.concatenate(streams)[interleave_keys(self.counts, rng)]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next ``__iter__`` continue ``state``'s epoch at its position (as ``PackSampler``'s);
        raises ValueError if the packs' sizes or the mix's settings differ from the saved ones."""
        options = state.get("options") if isinstance(state, Mapping) else None
        if isinstance(options, Mapping):
            saved = options.get("sizes")
            if saved is None:
                raise ValueError("state is not a MixSampler's (its options name no pack sizes); "
                                 "pass a dict from MixSampler.state_dict()")
            if not isinstance(saved, list) or not all(type(size) is int for size in saved):
                raise ValueError(f"state's pack sizes {saved!r} are not a list of record counts; the state is "
                                 "damaged: pass a dict from MixSampler.state_dict()")
            if saved != self.sizes:
                raise ValueError(f"state mismatch: the packs held {saved} records when saved but "
                                 f"{self.sizes} now; resume over the same packs, in the same order")
        super().load_state_dict(state)

    def __repr__(self) -> str:
        weights = ", ".join(f"{weight:.3g}" for weight in self.weights)
        return (f"MixSampler(sizes={self.sizes}, weights=[{weights}], samples_per_epoch={self.samples_per_epoch}, "
                f"seed={self.seed}, rank={self.rank}, world_size={self.world_size})")
