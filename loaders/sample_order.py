"""The orders a ``PackSampler`` hands out, each a pure function of ``(seed, epoch, num_records, options)``.

A pack stores records 0..n-1 back to back, so reading consecutive records is cheap and jumping around
is not. Three orders:

* ``"sequential"``: 0..n-1 (what ``shuffle=False`` gives), for evaluation.
* ``"random"``: a full permutation; best mixing, worst locality.
* ``"block"`` (default): cut 0..n-1 into blocks of ``block_size`` consecutive records, permute the
  blocks, then shuffle the records inside each group of ``window_blocks`` consecutive (permuted) blocks.
  Any run of ``block_size * window_blocks`` samples therefore touches only ``window_blocks`` contiguous
  regions of the pack (page cache / readahead friendly), while the classes of a class-sorted pack still
  mix almost as well as under a full shuffle. This is a deterministic version of FFCV's QUASI_RANDOM
  order or of a shuffle buffer.

The global order is then made divisible by the number of ranks (padded or cut) and each rank takes a
contiguous slice of it, so its reads stay block-local. (It is drawn with
``np.random.default_rng([seed, epoch])``; NumPy keeps those streams stable in practice but does not
promise it across releases, so give all ranks, and a resumed run, the same NumPy.)
"""

from __future__ import annotations

import math

import numpy as np
import numpy.random  # noqa: F401  (imported with the module, not on the first epoch's clock)

ORDERS = ("block", "random", "sequential")
UNEVEN_MODES = ("pad", "drop")


def block_order(n: int, block_size: int, window_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Permute blocks of ``block_size`` records, then shuffle records within groups of ``window_blocks``.

    The block list is padded with sentinel blocks (record ids >= n) to whole groups so that every group
    is one row of a 2-D array and can be shuffled with a single vectorised ``rng.permuted`` call; the
    sentinels (and the missing tail of a short last block) are filtered out afterwards.
    """
    if n == 0:
        return np.empty(0, dtype=np.int64)
    num_blocks = -(-n // block_size)
    num_groups = -(-num_blocks // window_blocks)
    sentinels = np.arange(num_blocks, num_groups * window_blocks, dtype=np.int64)
    slots = np.concatenate([rng.permutation(num_blocks).astype(np.int64), sentinels])
    records = slots[:, None] * block_size + np.arange(block_size, dtype=np.int64)
    records = rng.permuted(records.reshape(num_groups, window_blocks * block_size), axis=1).ravel()
    return records[records < n]


def global_order(n: int, order: str, seed: int, epoch: int, block_size: int, window_blocks: int) -> np.ndarray:
    """The order (one of ``ORDERS``) of all ``n`` records for ``epoch``, before the rank split."""
    if order == "sequential":
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch])
    if order == "random":
        return rng.permutation(n).astype(np.int64, copy=False)
    return block_order(n, block_size, window_blocks, rng)


def split_size(n: int, world_size: int, uneven: str) -> int:
    """Length of a global order of ``n`` after padding ("pad") or dropping ("drop") to a multiple of
    ``world_size``."""
    return math.ceil(n / world_size) * world_size if uneven == "pad" else (n // world_size) * world_size


def rank_share(order: np.ndarray, total: int, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s contiguous slice of ``order`` made ``total`` long: padded by repeating from
    its start (cyclically if shorter than needed), or cut."""
    if total > order.size:  # pad: repeat from the start of the order, cyclically if n < world_size
        order = np.concatenate([order, np.resize(order, total - order.size)])
    per_rank = total // world_size
    return order[rank * per_rank : (rank + 1) * per_rank]
