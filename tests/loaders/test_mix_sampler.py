"""``loaders.mix_sampler`` beyond what test_mix.py checks: the weights and epoch size as given (NumPy
arrays, None) or refused in one line, each epoch being exactly its slice of each pack's stream of
passes, every record of a pack drawn as evenly as its share allows over many epochs, the interleave
on its own, and exact resume where loaders resume (``begin_epoch``), at the ends of an epoch and
after a pack has started over; a plain pack's sampler refuses a mix's state."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from packload.loaders.mix_sampler import MixSampler, check_samples_per_epoch, check_weights, interleave_keys
from packload.loaders.sampler import PackSampler


def one_line(error: type[Exception], call: Any, *args: Any) -> str:
    with pytest.raises(error) as caught:
        call(*args)
    text = str(caught.value)
    assert "\n" not in text, text
    return text


def test_weights_as_given_become_shares() -> None:
    assert check_weights(None, [30, 10, 0]) == [0.75, 0.25, 0.0]  # None: by the packs' sizes
    assert check_weights(np.array([3, 1]), [5, 5]) == [0.75, 0.25]
    assert check_weights([np.float32(0.5), np.int64(1), 0], [5, 5, 0]) == [1 / 3, 2 / 3, 0.0]
    assert check_weights((2.0, 2.0), [1, 1]) == [0.5, 0.5]
    assert check_samples_per_epoch(None, [30, 10, 0]) == 40
    got = check_samples_per_epoch(np.int64(7), [30])
    assert got == 7 and type(got) is int


def test_weights_refused_in_one_line() -> None:
    assert one_line(ValueError, check_weights, None, [0, 0]) == (
        "the packs hold no records at all; mix packs with records in them")
    assert one_line(TypeError, check_weights, np.ones((2, 1)), [5, 5]) == (
        "weights must be a list of numbers, one per pack, got ndarray")
    assert one_line(TypeError, check_weights, {"a": 1, "b": 1}, [5, 5]) == (
        "weights must be a list of numbers, one per pack, got dict")
    assert one_line(TypeError, check_weights, "11", [5, 5]) == "weights must be a list of numbers, one per pack, got str"
    assert one_line(ValueError, check_weights, [1, float("inf")], [5, 5]) == (
        "weights[1] must be a finite number >= 0, got inf")
    assert one_line(TypeError, check_weights, [1, None], [5, 5]) == "weights[1] must be a number, got NoneType (None)"
    assert one_line(TypeError, check_weights, [True, 1], [5, 5]) == "weights[0] must be a number, got bool (True)"
    assert one_line(ValueError, check_samples_per_epoch, None, [0, 0]) == (
        "samples_per_epoch (the packs' records together) must be >= 1, got 0")


SIZES, WEIGHTS, SAMPLES = [50, 13, 7, 20], [0.5, 0.3, 0.2, 0.0], 40  # pack 0 under-sampled, 1 and 2 over, 3 never


def stream(sampler: MixSampler, pack: int, passes: int) -> np.ndarray:
    """Pack ``pack``'s passes laid end to end, as its epochs draw them."""
    return np.concatenate([sampler.pass_order(pack, number) for number in range(passes)])


def test_each_epoch_is_its_slice_of_each_packs_stream() -> None:
    """Epoch e takes samples e*count .. (e+1)*count of a pack's passes, and the interleave keeps them
    in that order; a pack of weight 0 is never drawn."""
    sampler = MixSampler(SIZES, WEIGHTS, SAMPLES, seed=4, block_size=4, window_blocks=2)
    assert sampler.counts == [20, 12, 8, 0]
    for epoch in range(12):
        order = sampler.global_order(epoch)
        which = np.searchsorted(sampler.offsets, order, side="right") - 1
        for pack, count in enumerate(sampler.counts):
            expected = stream(sampler, pack, 20)[epoch * count : (epoch + 1) * count] if count else []
            assert np.array_equal(sampler.pack_samples(pack, epoch), expected)
            assert np.array_equal(order[which == pack] - sampler.offsets[pack], expected), (epoch, pack)
    assert sampler.pack_samples(3, 5).dtype == np.int64 and sampler.pack_samples(3, 5).size == 0


@pytest.mark.parametrize("epochs", [1, 7, 60])
def test_every_record_drawn_as_evenly_as_its_share_allows(epochs: int) -> None:
    """After E epochs pack p has given E*count_p samples: every record drawn q or q+1 times
    (q = E*count_p // size_p), exactly E*count_p % size_p of them q+1 times."""
    sampler = MixSampler(SIZES, WEIGHTS, SAMPLES, seed=9, block_size=4, window_blocks=2)
    drawn = np.bincount(np.concatenate([sampler.global_order(e) for e in range(epochs)]),
                        minlength=sum(SIZES))
    for pack, (size, count) in enumerate(zip(SIZES, sampler.counts, strict=True)):
        times = drawn[sampler.offsets[pack] : sampler.offsets[pack + 1]]
        q, r = divmod(epochs * count, size)
        assert sorted(set(times.tolist())) == sorted({q, q + 1} if r else {q}), pack
        assert int((times == q + 1).sum()) == r


def test_interleave_on_its_own() -> None:
    """Unshuffled, pack p's j-th sample sorts at (j + 0.5) / count_p, ties to the earlier pack; with a
    generator the result is a permutation keeping each pack's samples in their order."""
    assert interleave_keys([2, 1], None).tolist() == [0, 2, 1]
    assert interleave_keys([3, 0, 1], None).tolist() == [0, 1, 3, 2]  # 0.5 and 0.5: pack 0 first
    assert interleave_keys([0, 0], None).tolist() == []
    counts = [9, 4, 1]
    order = interleave_keys(counts, np.random.default_rng(2))
    assert np.array_equal(np.sort(order), np.arange(14))
    starts = np.cumsum([0, *counts])
    for pack in range(3):
        mine = order[(order >= starts[pack]) & (order < starts[pack + 1])]
        assert np.array_equal(mine, np.arange(starts[pack], starts[pack + 1]))
    assert not np.array_equal(order, interleave_keys(counts, np.random.default_rng(3)))


@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_resume_through_begin_epoch_is_exact(uneven: str) -> None:
    """A loader's progress (``consumed``) saved at the ends and the middle of a late epoch (the
    over-sampled packs on later passes) resumes with exactly the rest; the epoch after is whole."""
    def make(rank: int, seed: int) -> MixSampler:
        return MixSampler(SIZES, WEIGHTS, 43, seed=seed, rank=rank, world_size=3, uneven=uneven, block_size=4,
                          window_blocks=2)

    for rank in range(3):
        sampler = make(rank, seed=5)
        sampler.set_epoch(9)
        whole = sampler.begin_epoch()
        assert len(whole) == len(sampler) == (15 if uneven == "pad" else 14)
        for consumed in (0, 1, len(whole) // 2, len(whole)):
            state = json.loads(json.dumps(sampler.state_dict(consumed=consumed)))
            assert state["options"]["sizes"] == SIZES and state["options"]["samples_per_epoch"] == 43
            resumed = make(rank, seed=0)  # seed and epoch come from the state
            resumed.load_state_dict(state)
            assert resumed.epoch == 9 and resumed.start_position == consumed
            assert np.array_equal(resumed.begin_epoch(), whole[consumed:])
            assert resumed.state_dict(consumed=len(whole))["position"] == len(whole)
            resumed.set_epoch(10)
            assert np.array_equal(resumed.begin_epoch(), sampler.epoch_order(10))


def test_a_packs_sampler_refuses_a_mixs_state() -> None:
    """A PackSampler over as many records cannot resume a mix: its order is not the mix's."""
    state = MixSampler([60, 25], [0.5, 0.5], 85).state_dict(consumed=10)
    with pytest.raises(ValueError) as caught:
        PackSampler(85).load_state_dict(state)
    assert str(caught.value) == ("state mismatch: samples_per_epoch=85 when saved but None now; sizes=[60, 25] "
                                 "when saved but None now; weights=[0.5, 0.5] when saved but None now; build the "
                                 "sampler with the saved options")


def test_repr_names_the_mix() -> None:
    sampler = MixSampler([60, 25], [2, 1], 90, seed=3, rank=1, world_size=2)
    assert repr(sampler) == ("MixSampler(sizes=[60, 25], weights=[0.667, 0.333], samples_per_epoch=90, seed=3, "
                             "rank=1, world_size=2)")


@pytest.mark.parametrize("sizes", [85, "60,25", [60, "25"], [60.0, 25], {"a": 60}])
def test_a_damaged_states_pack_sizes_are_refused_in_one_line(sizes: Any) -> None:
    sampler = MixSampler([60, 25], [0.5, 0.5], 85)
    state = sampler.state_dict(consumed=10)
    state["options"]["sizes"] = sizes
    message = one_line(ValueError, sampler.load_state_dict, state)
    assert message.startswith(f"state's pack sizes {sizes!r} are not a list of record counts")
    assert "MixSampler.state_dict()" in message
