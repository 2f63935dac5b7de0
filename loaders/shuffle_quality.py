"""How well an order mixes classes into batches, and how far it jumps through a pack: the two sides of
the sampler's trade (``shuffle_quality(sampler.epoch_order(0), labels, 256)``)."""

from __future__ import annotations

import math

import numpy as np

from packload.loaders.sampler import check_int


def _pair_counts(counts: np.ndarray) -> int:
    """Number of unordered pairs among groups of the given sizes: sum of c*(c-1)/2."""
    counts = counts.astype(np.int64)
    return int((counts * (counts - 1) // 2).sum())


def shuffle_quality(order: np.ndarray, labels: np.ndarray, batch_size: int) -> dict[str, float]:
    """Measure how well ``order`` mixes classes when cut into consecutive batches of ``batch_size``.

    Args:
        order: record indices in the order they are read (e.g. ``PackSampler.epoch_order()``).
        labels: label of each record, indexed by record index.
        batch_size: batch size; the last batch may be short.

    Returns floats:
        same_class_pair_rate: fraction of sample pairs inside a batch that share a label (nan if no
            batch holds two samples).
        expected_full_shuffle: the same fraction expected under a full shuffle, from the label
            frequencies of the samples in ``order``.
        ratio: same_class_pair_rate / expected_full_shuffle (1.0 is as good as a full shuffle).
        mean_abs_index_jump: mean |order[i+1] - order[i]| / len(labels) (about 1/3 for a full shuffle,
            about 1/n for sequential reads).
    """
    order = np.asarray(order)
    labels = np.asarray(labels)
    batch_size = check_int("batch_size", batch_size, 1)
    if order.ndim != 1 or (order.size and not np.issubdtype(order.dtype, np.integer)):
        raise TypeError(f"order must be a 1-D integer array, got shape {order.shape} dtype {order.dtype}")
    if order.size and (order.min() < 0 or order.max() >= labels.shape[0]):
        raise ValueError(f"order holds indices outside 0..{labels.shape[0] - 1} (the labels array)")
    _, codes = np.unique(labels[order], return_inverse=True)
    codes = codes.reshape(-1).astype(np.int64)
    num_classes = int(codes.max()) + 1 if codes.size else 1
    batch_ids = np.arange(order.size, dtype=np.int64) // batch_size
    _, per_batch_class = np.unique(batch_ids * num_classes + codes, return_counts=True)
    total_pairs = _pair_counts(np.bincount(batch_ids)) if order.size else 0
    all_pairs = order.size * (order.size - 1) // 2
    rate = _pair_counts(per_batch_class) / total_pairs if total_pairs else math.nan
    expected = _pair_counts(np.bincount(codes)) / all_pairs if all_pairs else math.nan
    if expected == 0.0:  # every label is unique: no order can pair equal labels
        ratio = 1.0 if rate == 0.0 else math.nan
    else:
        ratio = rate / expected
    jumps = np.abs(np.diff(order.astype(np.int64)))
    jump = float(jumps.mean()) / labels.shape[0] if jumps.size else 0.0
    return {
        "same_class_pair_rate": float(rate),
        "expected_full_shuffle": float(expected),
        "ratio": float(ratio),
        "mean_abs_index_jump": jump,
    }
