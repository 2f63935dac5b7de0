"""How well an order mixes classes into batches (``packload.loaders.shuffle_quality``), on orders whose
answer is worked out by hand, and its refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from packload.loaders.shuffle_quality import shuffle_quality


def test_shuffle_quality_hand_computed() -> None:
    labels = np.array([0, 0, 1, 1])
    q = shuffle_quality(np.array([0, 1, 2, 3]), labels, batch_size=2)
    assert q == {
        "same_class_pair_rate": 1.0,
        "expected_full_shuffle": pytest.approx(2 / 6),
        "ratio": pytest.approx(3.0),
        "mean_abs_index_jump": pytest.approx(1 / 4),
    }
    assert shuffle_quality(np.array([0, 2, 1, 3]), labels, batch_size=2)["same_class_pair_rate"] == 0.0
    short = shuffle_quality(np.array([0, 1, 2]), labels, batch_size=2)  # last batch has no pair
    assert short["same_class_pair_rate"] == 1.0
    assert all(isinstance(v, float) for v in q.values())


def test_shuffle_quality_degenerate_and_invalid() -> None:
    labels = np.arange(5)
    assert math.isnan(shuffle_quality(np.arange(5), labels, 1)["same_class_pair_rate"])
    assert shuffle_quality(np.arange(5), labels, 5)["ratio"] == 1.0  # all labels distinct
    assert shuffle_quality(np.array([], dtype=np.int64), labels, 4)["mean_abs_index_jump"] == 0.0
    with pytest.raises(ValueError, match="outside 0..4"):
        shuffle_quality(np.array([5]), labels, 2)
    with pytest.raises(TypeError, match="1-D integer array"):
        shuffle_quality(np.array([0.5]), labels, 2)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        shuffle_quality(np.arange(5), labels, 0)
