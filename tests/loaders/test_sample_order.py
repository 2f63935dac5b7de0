"""``loaders.sample_order`` on its own: the block order's groups are the permuted blocks (a short last
block and groups past the end included), every order is drawn from ``default_rng([seed, epoch])`` and
nothing else, and the rank split pads or cuts the order it is given into equal contiguous slices.
(``PackSampler``'s use of these orders is tested in test_sampler.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from packload.loaders.sample_order import block_order, global_order, rank_share, split_size


def block_records(block: int, block_size: int, n: int) -> set[int]:
    """The records of block ``block``: ``block_size`` consecutive ones, the last block cut at ``n``."""
    return set(range(block * block_size, min((block + 1) * block_size, n)))


@pytest.mark.parametrize(("n", "block_size", "window_blocks"), [
    (1000, 16, 4),   # whole blocks, whole groups
    (1003, 16, 4),   # a short last block (3 records)
    (1003, 16, 5),   # ...and a short last group (63 blocks in groups of 5)
    (10, 16, 3),     # one block, shorter than block_size
    (37, 1, 37),     # one group of single records: a full shuffle
    (37, 5, 100),    # a window larger than the pack
])
@pytest.mark.parametrize("seed", [0, 7])
def test_block_order_shuffles_within_groups_of_permuted_blocks(n: int, block_size: int, window_blocks: int,
                                                               seed: int) -> None:
    """The blocks come in the order of the generator's first permutation; each run of ``window_blocks``
    of them is one contiguous run of the result holding exactly their records, none lost or added."""
    order = block_order(n, block_size, window_blocks, np.random.default_rng(seed))
    assert order.dtype == np.int64 and np.array_equal(np.sort(order), np.arange(n))
    num_blocks = -(-n // block_size)
    permuted = np.random.default_rng(seed).permutation(num_blocks)  # block_order's first draw
    at = 0
    for first in range(0, num_blocks, window_blocks):
        group = set().union(*(block_records(int(b), block_size, n) for b in permuted[first : first + window_blocks]))
        assert set(order[at : at + len(group)].tolist()) == group, (first, at)
        at += len(group)
    assert at == n


def test_block_order_shuffles_the_records_of_a_group() -> None:
    """Records within a group are shuffled, not left in block order; a window of one block keeps
    each block's records together (and still shuffles them)."""
    order = block_order(4096, 64, 1, np.random.default_rng(3))
    blocks = order.reshape(-1, 64)
    assert all(np.unique(block // 64).size == 1 for block in blocks)  # one block per run of 64
    unsorted = [not np.array_equal(block, np.sort(block)) for block in blocks]
    assert all(unsorted)  # 64! orders: a sorted block would mean no shuffle
    assert block_order(0, 64, 32, np.random.default_rng(3)).tolist() == []


@pytest.mark.parametrize("n", [0, 1, 2, 999])
def test_orders_come_from_the_seed_and_epoch_alone(n: int) -> None:
    """Each order is ``default_rng([seed, epoch])``'s, whatever was drawn before; the pair is not
    collapsed into one number (seed 1 epoch 2 is not seed 2 epoch 1, nor seed 3 epoch 0)."""
    random = global_order(n, "random", 5, 11, 8, 4)
    assert np.array_equal(random, np.random.default_rng([5, 11]).permutation(n))
    block = global_order(n, "block", 5, 11, 8, 4)
    assert np.array_equal(block, block_order(n, 8, 4, np.random.default_rng([5, 11])))
    global_order(n, "block", 6, 0, 8, 4)  # another order drawn in between changes nothing
    assert np.array_equal(global_order(n, "block", 5, 11, 8, 4), block)
    assert np.array_equal(global_order(n, "random", 5, 11, 8, 4), random)
    for order in ("random", "block", "sequential"):
        assert global_order(n, order, 0, 0, 8, 4).dtype == np.int64
    assert np.array_equal(global_order(n, "sequential", 5, 11, 8, 4), np.arange(n))
    if n >= 999:
        pairs = [global_order(n, "block", seed, epoch, 8, 4) for seed, epoch in ((1, 2), (2, 1), (3, 0))]
        assert not np.array_equal(pairs[0], pairs[1]) and not np.array_equal(pairs[0], pairs[2])
        assert not np.array_equal(random, global_order(n, "random", 5, 12, 8, 4))


@pytest.mark.parametrize("world_size", [1, 2, 3, 7])
def test_split_size_pads_up_or_drops_down_to_a_multiple(world_size: int) -> None:
    for n in range(0, 30):
        padded, dropped = split_size(n, world_size, "pad"), split_size(n, world_size, "drop")
        assert padded % world_size == 0 and n <= padded < n + world_size
        assert dropped % world_size == 0 and n - world_size < dropped <= n


def test_rank_share_cuts_contiguous_slices_of_the_order_given() -> None:
    """The order's own values (not positions) are sliced; the slices, rank after rank, are the order
    cut to ``total`` or continued from its start, cyclically when it is shorter than what is missing."""
    order = np.random.default_rng(1).integers(1000, 2000, 10)  # any values: repeats included
    for world_size in (1, 3, 4, 10):
        for uneven in ("pad", "drop"):
            total = split_size(10, world_size, uneven)
            shares = [rank_share(order, total, rank, world_size) for rank in range(world_size)]
            assert {share.size for share in shares} == {total // world_size}
            expected = order[:total] if uneven == "drop" else np.concatenate([order, order[: total - 10]])
            assert np.array_equal(np.concatenate(shares), expected)
    short = np.array([7, 8, 9])
    assert [rank_share(short, 8, rank, 8).tolist() for rank in range(8)] == [[7], [8], [9], [7], [8], [9], [7], [8]]
    assert rank_share(short, 0, 0, 4).tolist() == []


@pytest.mark.parametrize("order", ["block", "random"])
def test_ranks_read_disjoint_records_under_drop(order: str) -> None:
    """With "drop", the ranks' shares of one epoch are pairwise disjoint and together all but the
    dropped tail; the same epoch's shares computed again are the same."""
    n, world_size = 1001, 4
    whole = global_order(n, order, 9, 3, 8, 4)
    total = split_size(n, world_size, "drop")
    shares = [set(rank_share(whole, total, rank, world_size).tolist()) for rank in range(world_size)]
    assert sum(len(share) for share in shares) == len(set().union(*shares)) == total
    assert set(range(n)) - set().union(*shares) == set(whole[total:].tolist())
    again = global_order(n, order, 9, 3, 8, 4)
    assert all(set(rank_share(again, total, r, world_size).tolist()) == shares[r] for r in range(world_size))
