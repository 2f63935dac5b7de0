"""``packload.mix``: several packs sampled by weight as one dataset.

The sampler's properties on index orders (shares per epoch, shares in every window, each pack drawn
without replacement while it lasts and in a new order when it starts over, determinism, the rank
split, exact resume), then packs written with PIL and packed here: labels and classes, every loader
(PackLoader with random crops and flips, DataLoader, batch_loader) giving what the packs give when
indexed directly, resume through PackLoader, and one-line errors for bad input.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader, DistributedSampler

import packload
from packload import (
    CenterCrop,
    EncodeOptions,
    MixedPacks,
    MixSampler,
    PackedImageFolder,
    PackLoader,
    PackSampler,
    RandomResizedCrop,
    UsageError,
    batch_loader,
    mix,
    pack,
)
from packload.loaders.batches import RankBatchSampler
from packload.loaders.collate import collate_uint8
from packload.loaders.mix import MixHints
from packload.loaders.mix_sampler import pack_seed, shares
from packload.loaders.random_crop import Draws
from tests.framework_pack import ids_of, read_seen, write_seen
from tests.image_factory import make_image_folder

try:  # the frameworks extra; the test that needs it skips without it
    import lightning.pytorch as pl
except ImportError:
    pl = None

# -- the sampler on index orders --------------------------------------------------------------------------


def pack_of(sampler: MixSampler, order: np.ndarray) -> np.ndarray:
    """The pack number of each of the mix's indices."""
    return np.searchsorted(sampler.offsets, order, side="right") - 1


def test_shares_round_to_the_epoch_exactly() -> None:
    assert shares([0.7, 0.3], 10) == [7, 3]
    assert shares([1, 1, 1], 10) == [4, 3, 3]  # the remainder to the earlier pack on a tie
    assert shares([0.5, 0.5, 0.0], 7) == [4, 3, 0]
    assert MixSampler([10, 10], np.array([3.0, 1.0]), 8).counts == [6, 2]
    for total in (1, 9, 100, 12345):
        counts = shares([0.62, 0.27, 0.11], total)
        assert sum(counts) == total
        assert all(abs(c - w * total) < 1 for c, w in zip(counts, [0.62, 0.27, 0.11], strict=True))
    # weights in proportion to the sizes give each pack its size (exact arithmetic, no float drift)
    sizes = [999_983, 7, 1_000_003]
    assert shares([s / sum(sizes) for s in sizes], sum(sizes)) == sizes


@pytest.mark.parametrize("weights", [[0.7, 0.3], [0.5, 0.3, 0.2], [1, 1, 8]])
def test_every_epoch_holds_each_pack_by_its_weight(weights: list[float]) -> None:
    """Over 30 epochs each pack gives its rounded share every epoch: within 1 sample of weight x epoch."""
    sizes = [500, 40, 7][: len(weights)]
    sampler = MixSampler(sizes, weights, 333, seed=4, block_size=8, window_blocks=4)
    expected = np.asarray(weights) / sum(weights) * 333
    for epoch in range(30):
        counts = np.bincount(pack_of(sampler, sampler.global_order(epoch)), minlength=len(sizes))
        assert counts.tolist() == sampler.counts
        assert np.all(np.abs(counts - expected) < 1)


@pytest.mark.parametrize("seed", [0, 1, 99])
@pytest.mark.parametrize("weights", [[0.5, 0.5], [0.7, 0.3], [0.6, 0.3, 0.1]])
def test_every_window_holds_the_weights(seed: int, weights: list[float]) -> None:
    """The stated bound: among the first t samples of an epoch each pack has share*t within
    1 + share*packs; so any window of k samples within 2*(1 + share*packs)."""
    sizes = [4000, 700, 90][: len(weights)]
    sampler = MixSampler(sizes, weights, 3000, seed=seed)
    packs = len(sizes)
    for epoch in range(5):
        which = pack_of(sampler, sampler.global_order(epoch))
        for p in range(packs):
            share = sampler.counts[p] / 3000
            prefix = np.concatenate([[0], np.cumsum(which == p)])
            t = np.arange(prefix.size)
            assert np.abs(prefix - share * t).max() <= 1 + share * packs
            for k in (16, 64, 256):
                window = prefix[k:] - prefix[:-k]
                assert np.abs(window - share * k).max() <= 2 * (1 + share * packs)


def test_the_interleave_is_shuffled_not_periodic() -> None:
    """Jittered keys: two seeds give different pack sequences, and equal weights do not simply alternate."""
    a = pack_of(MixSampler([100, 100], [1, 1], seed=0), MixSampler([100, 100], [1, 1], seed=0).global_order(0))
    b = pack_of(MixSampler([100, 100], [1, 1], seed=1), MixSampler([100, 100], [1, 1], seed=1).global_order(0))
    assert not np.array_equal(a, b)
    assert (a[1:] == a[:-1]).any()  # some pack follows itself


@pytest.mark.parametrize("sizes,weights,samples", [([50, 13], [0.5, 0.5], 40),     # pack 0 lasts 2.5 epochs
                                                   ([50, 13], [0.2, 0.8], 100),    # pack 1 over-sampled 6x
                                                   ([31, 5, 64], [1, 1, 1], 30)])
def test_each_pack_without_replacement_while_it_lasts(sizes: list[int], weights: list[float], samples: int) -> None:
    """A pack's records, in the order epochs draw them, are whole passes one after another: no
    record again before every record of its pack was drawn, whether the pack runs out within an
    epoch (over-sampled) or over several (under-sampled), and each pass in a new order."""
    sampler = MixSampler(sizes, weights, samples, seed=3, block_size=4, window_blocks=2)
    epochs = [sampler.global_order(epoch) for epoch in range(16)]
    for p, size in enumerate(sizes):
        drawn = np.concatenate([order[pack_of(sampler, order) == p] for order in epochs]) - sampler.offsets[p]
        passes = drawn[: drawn.size // size * size].reshape(-1, size)
        assert passes.shape[0] >= 2
        for one in passes:
            assert np.array_equal(np.sort(one), np.arange(size))
        assert not all(np.array_equal(passes[0], other) for other in passes[1:])
        # the epoch's draws are the pack's stream, in its order
        assert np.array_equal(drawn[: sampler.counts[p]], sampler.pack_samples(p, 0))


def test_a_pack_reads_in_blocks() -> None:
    """Each pack's pass is PackSampler's block order under the pack's own seed."""
    sampler = MixSampler([300, 200], [1, 1], seed=6, block_size=16, window_blocks=2)
    assert np.array_equal(sampler.pass_order(1, 3), PackSampler(200, seed=pack_seed(6, 1), block_size=16,
                                                                window_blocks=2).global_order(3))


def test_deterministic_per_seed_and_epoch() -> None:
    make = lambda seed: MixSampler([80, 30, 9], [0.5, 0.25, 0.25], 100, seed=seed)  # noqa: E731
    for epoch in range(3):
        assert np.array_equal(make(5).global_order(epoch), make(5).global_order(epoch))
    assert not np.array_equal(make(5).global_order(0), make(6).global_order(0))
    assert not np.array_equal(make(5).global_order(0), make(5).global_order(1))
    jumped = make(5)
    jumped.set_epoch(7)  # an epoch's order needs no earlier epoch to have run
    assert np.array_equal(jumped.epoch_order(), make(5).global_order(7))


def test_a_mix_of_one_pack_is_that_packs_sampler() -> None:
    for epoch in range(3):
        assert np.array_equal(MixSampler([123]).global_order(epoch), PackSampler(123).global_order(epoch))


def test_unshuffled_takes_records_in_turn() -> None:
    sampler = MixSampler([4, 4], [1, 1], shuffle=False)
    assert sampler.global_order(0).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_ranks_are_disjoint_and_cover_the_epoch(world_size: int, uneven: str) -> None:
    """101 samples over 2 or 3 ranks: equal shares, contiguous slices of the one global order;
    "drop" sees each sample at most once, "pad" every sample at least once (repeats from the start)."""
    kwargs = {"seed": 2, "uneven": uneven, "world_size": world_size, "block_size": 4, "window_blocks": 2}
    for epoch in range(2):
        ranks = [MixSampler([70, 40], [0.6, 0.4], 101, rank=r, **kwargs) for r in range(world_size)]
        for sampler in ranks:
            sampler.set_epoch(epoch)
        orders = [list(sampler) for sampler in ranks]
        assert len({len(order) for order in orders}) == 1 and len(orders[0]) == len(ranks[0])
        whole = ranks[0].global_order()
        joined = np.concatenate(orders)
        if uneven == "drop":
            assert len(joined) == 101 // world_size * world_size
            assert np.array_equal(joined, whole[: len(joined)])
        else:
            assert len(joined) == -(-101 // world_size) * world_size
            assert np.array_equal(joined, np.concatenate([whole, whole[: len(joined) - 101]]))
        for rank, order in enumerate(orders):  # each rank's slice keeps the weights too (a window)
            share = np.mean(pack_of(ranks[0], np.asarray(order)) == 0)
            assert abs(share - ranks[0].counts[0] / 101) <= 2 * (1 + 2 * 0.6) / len(order), rank


def test_resume_mid_epoch_gives_exactly_the_rest() -> None:
    for rank in range(2):
        sampler = MixSampler([60, 25], [0.5, 0.5], 90, seed=8, rank=rank, world_size=2)
        sampler.set_epoch(3)
        whole = list(sampler)
        it = iter(sampler)
        head = [next(it) for _ in range(17)]
        state = json.loads(json.dumps(sampler.state_dict()))
        resumed = MixSampler([60, 25], [0.5, 0.5], 90, seed=0, rank=rank, world_size=2)
        resumed.load_state_dict(state)  # adopts the saved seed and epoch
        assert head + list(resumed) == whole
        assert resumed.epoch == 3 and len(list(resumed)) == len(whole)  # the next pass is whole again


def test_resume_refuses_another_mix() -> None:
    state = MixSampler([60, 25], [0.5, 0.5], 90).state_dict()
    with pytest.raises(ValueError, match=r"the packs held \[60, 25\] records when saved but \[60, 26\] now"):
        MixSampler([60, 26], [0.5, 0.5], 90).load_state_dict(state)
    with pytest.raises(ValueError, match="weights=.* when saved but"):
        MixSampler([60, 25], [0.6, 0.4], 90).load_state_dict(state)
    with pytest.raises(ValueError, match="samples_per_epoch=90 when saved but 91 now"):
        MixSampler([60, 25], [0.5, 0.5], 91).load_state_dict(state)
    with pytest.raises(ValueError, match="not a MixSampler's"):
        MixSampler([85]).load_state_dict(PackSampler(85).state_dict())


def test_a_distributed_sampler_for_the_frameworks() -> None:
    """Lightning leaves a DistributedSampler in place and calls its set_epoch; batch_loader wraps it
    in a RankBatchSampler, itself a DistributedSampler."""
    sampler = MixSampler([70, 40], [0.6, 0.4], 101, rank=1, world_size=2, uneven="drop")
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.num_samples, sampler.total_size) == (2, 1, 50, 100)
    assert sampler.drop_last and sampler.shuffle and len(sampler.dataset) == 110
    sampler.set_epoch(4)
    assert sampler.epoch == 4


def test_prefetch_announcements_reach_each_pack() -> None:
    """The sampler's lookahead splits the mix's indices by pack, as records of each pack."""
    told: list[list[int]] = [[], []]
    hints = MixHints(np.array([0, 10, 15]), [lambda r: told[0].extend(r.tolist()) or 0,
                                             lambda r: told[1].extend(r.tolist()) or 0])
    sampler = MixSampler([10, 5], [0.5, 0.5], 30, prefetch=hints, block_size=2, window_blocks=2)
    order = list(sampler)
    assert sorted(told[0]) == sorted(i for i in order if i < 10)
    assert sorted(told[1]) == sorted(i - 10 for i in order if i >= 10)


# -- packs written and packed here ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """noisy (30 images, cat/dog/fox, shards), clean (9, the same classes, LMDB), other (8, bird/cat),
    and two raw packs of different image sizes."""
    root = tmp_path_factory.mktemp("mix")
    made = {}
    specs = {"noisy": (("cat", "dog", "fox"), 10, "noisy.shards"), "clean": (("cat", "dog", "fox"), 3, "clean.lmdb"),
             "other": (("bird", "cat"), 4, "other.shards")}
    for seed, (name, (classes, per_class, dst)) in enumerate(specs.items()):
        make_image_folder(root / name, classes=classes, per_class=per_class, seed=seed + 1)
        made[name] = root / dst
        pack(root / name, made[name], workers=1, progress=False, shard_size=1 << 16)
    for name, size in (("small", (12, 10)), ("large", (16, 12))):
        made[name] = root / f"{name}.shards"
        pack(root / "clean", made[name], options=EncodeOptions(encoding="raw", size=size), workers=1, progress=False)
    return made


def open_packs(packs: dict[str, Path], *names: str, **kwargs) -> list[PackedImageFolder]:
    return [PackedImageFolder(packs[name], **kwargs) for name in names]


def test_packs_with_one_class_list_share_it(packs: dict[str, Path]) -> None:
    noisy, clean = open_packs(packs, "noisy", "clean")
    mixed = mix([noisy, clean], [0.5, 0.5])
    assert mixed.classes == noisy.classes == clean.classes == ["cat", "dog", "fox"]
    assert mixed.class_to_idx == noisy.class_to_idx
    assert mixed.targets == noisy.targets + clean.targets
    assert mixed[len(noisy) + 4][1] == clean[4][1]


def test_packs_with_other_classes_are_kept_apart(packs: dict[str, Path]) -> None:
    noisy, other = open_packs(packs, "noisy", "other")
    mixed = mix([noisy, other])
    # "cat" is in both packs: named by pack; the other names stay as they are
    assert mixed.classes == ["noisy/cat", "dog", "fox", "bird", "other/cat"]
    assert mixed.label_offsets.tolist() == [0, 3]
    assert mixed.targets == noisy.targets + [t + 3 for t in other.targets]
    assert mixed.samples == noisy.samples + [(path, t + 3) for path, t in other.samples]
    for index in (0, 29, 30, 37):
        pack_number, record = (0, index) if index < 30 else (1, index - 30)
        own = [noisy, other][pack_number]
        assert mixed[index][1] == own[record][1] + mixed.label_offsets[pack_number]
        assert mixed.classes[mixed[index][1]].endswith(own.classes[own[record][1]])
    assert mix([noisy, other], names=["web", "curated"]).classes == ["web/cat", "dog", "fox", "bird", "curated/cat"]
    twice = mix([noisy, other, PackedImageFolder(packs["other"])])
    assert twice.names == ["noisy", "other#1", "other#2"]
    assert twice.classes == ["noisy/cat", "dog", "fox", "other#1/bird", "other#1/cat", "other#2/bird", "other#2/cat"]


def test_a_target_transform_cannot_see_shifted_labels(packs: dict[str, Path]) -> None:
    noisy, = open_packs(packs, "noisy")
    other = PackedImageFolder(packs["other"], target_transform=lambda t: t * 10)
    with pytest.raises(UsageError, match="pack 1 has a target_transform"):
        mix([noisy, other])
    clean = PackedImageFolder(packs["clean"], target_transform=lambda t: t * 10)
    assert mix([noisy, clean])[30][1] == clean[0][1]  # shared classes: nothing shifted, allowed


def direct_batch(mixed: MixedPacks, indices: np.ndarray, crop, flip: float, draws: Draws) -> tuple:
    """The batch built one sample at a time from the packs themselves."""
    images, labels = [], []
    for index in indices.tolist():
        p = int(np.searchsorted(mixed.offsets, index, side="right") - 1)
        image, label = mixed.datasets[p].get_batch([index - int(mixed.offsets[p])], crop=crop, flip=flip,
                                                   draws=Draws(pack_seed(draws.seed, p), draws.epoch, draws.rank))
        images.append(image)
        labels.append(int(label[0]) + int(mixed.label_offsets[p]))
    return torch.cat(images), labels


@pytest.mark.parametrize("threads", [0, 2])
def test_pack_loader_gives_the_packs_own_crops(packs: dict[str, Path], threads: int) -> None:
    """PackLoader over a mix, random crops and flips: each sample is its pack's record, cropped with
    the box its pack draws for it under the pack's key, in the sampler's order, labels the mix's."""
    mixed = mix(open_packs(packs, "noisy", "other"), [0.6, 0.4], samples_per_epoch=40, seed=3)
    crop = RandomResizedCrop(20, dct_scale=False)
    sampler = mixed.sampler(block_size=4, window_blocks=2)
    loader = PackLoader(mixed, 8, sampler=sampler, crop=crop, flip=True, threads=threads)
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = list(loader)
        order = sampler.epoch_order()
        assert sum(len(labels) for _, labels in got) == 40
        images = torch.cat([batch for batch, _ in got])
        labels = torch.cat([labels for _, labels in got]).tolist()
        want_images, want_labels = direct_batch(mixed, order, crop, 0.5, Draws(3, epoch, 0))
        assert labels == want_labels
        assert torch.equal(images, want_images)
        assert {int(p) for p in pack_of(sampler, order)} == {0, 1}


def test_drop_in_path_gives_the_same_crops(packs: dict[str, Path]) -> None:
    """DataLoader over the mix with each pack's RandomResizedCrop transform, keyed by set_epoch,
    gives PackLoader's batches."""
    crop = RandomResizedCrop(20, flip=0.5, dct_scale=False)
    mixed = mix(open_packs(packs, "noisy", "other", transform=crop), [0.5, 0.5], samples_per_epoch=24, seed=9)
    fast = mix(open_packs(packs, "noisy", "other"), [0.5, 0.5], samples_per_epoch=24, seed=9)
    for epoch in range(2):
        sampler = mixed.sampler(prefetch=False)
        sampler.set_epoch(epoch)
        mixed.set_epoch(epoch, seed=sampler.seed, rank=0)
        slow = list(DataLoader(mixed, batch_size=8, sampler=sampler, collate_fn=collate_uint8))
        loader = PackLoader(fast, 8, crop=crop, threads=0)
        loader.set_epoch(epoch)
        for (want_images, want_labels), (images, labels) in zip(slow, loader, strict=True):
            assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


def test_data_loader_and_batch_loader_give_the_packs_records(packs: dict[str, Path]) -> None:
    mixed = mix(open_packs(packs, "clean", "other", output="numpy"), [0.3, 0.7], samples_per_epoch=30)
    sampler = mixed.sampler(seed=1)
    order = sampler.epoch_order()
    samples = [sample for batch in DataLoader(mixed, batch_size=7, sampler=sampler, collate_fn=list)
               for sample in batch]  # the images differ in size: no stacking
    assert len(samples) == 30
    for (image, label), index in zip(samples, order.tolist(), strict=True):
        p = 0 if index < 9 else 1
        own_image, own_label = mixed.datasets[p][index - int(mixed.offsets[p])]
        assert np.array_equal(image, own_image) and label == own_label + int(mixed.label_offsets[p])
    centre = CenterCrop(16)
    whole = batch_loader(mixed, 7, sampler=mixed.sampler(seed=1), crop=centre)
    assert isinstance(whole.sampler, RankBatchSampler)
    fast = PackLoader(mixed, 7, sampler=mixed.sampler(seed=1), crop=centre, threads=0, channels_last=False)
    for (a_images, a_labels), (b_images, b_labels) in zip(whole, fast, strict=True):
        assert torch.equal(a_images, b_images) and torch.equal(a_labels, b_labels)
    want_images, want_labels = direct_batch(mixed, order, centre, 0.0, Draws(1, 0, 0))
    assert torch.equal(torch.cat([images for images, _ in whole]), want_images)
    assert torch.cat([labels for _, labels in whole]).tolist() == want_labels == [label for _, label in samples]


def test_encoded_batches_keep_the_order(packs: dict[str, Path]) -> None:
    mixed = mix(open_packs(packs, "noisy", "other"), [0.5, 0.5], samples_per_epoch=20)
    order = mixed.sampler().epoch_order()
    data, offsets, labels = mixed.get_encoded_batch(order)
    for row, index in enumerate(order.tolist()):
        p = 0 if index < 30 else 1
        own, _, own_label = mixed.datasets[p].get_encoded_batch([index - int(mixed.offsets[p])])
        assert torch.equal(data[offsets[row] : offsets[row + 1]], own)
        assert int(labels[row]) == int(own_label[0]) + int(mixed.label_offsets[p])
    loader = PackLoader(mixed, 6, sampler=mixed.sampler(), encoded=True, threads=0)
    assert sum(len(batch[-1]) for batch in loader) == 20


def test_pack_loader_resumes_with_the_same_batches(packs: dict[str, Path]) -> None:
    """A PackLoader stopped after two batches and a new one loaded from its state give the batches,
    crop boxes and flips included, of the uninterrupted epoch."""
    def loader() -> PackLoader:
        mixed = mix(open_packs(packs, "noisy", "clean", "other"), [0.5, 0.2, 0.3], samples_per_epoch=45, seed=11)
        return PackLoader(mixed, 6, crop=RandomResizedCrop(18, dct_scale=False), flip=True, threads=2)

    first = loader()
    first.set_epoch(2)
    whole = list(first)
    stopped = loader()
    stopped.set_epoch(2)
    it = iter(stopped)
    head = [next(it), next(it)]
    state = json.loads(json.dumps(stopped.state_dict()))
    assert state["position"] == 12
    resumed = loader()
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(head) + len(rest) == len(whole)
    for (a_images, a_labels), (b_images, b_labels) in zip(head + rest, whole, strict=True):
        assert torch.equal(a_images, b_images) and torch.equal(a_labels, b_labels)


def test_a_mix_of_one_pack_gives_that_packs_batches(packs: dict[str, Path]) -> None:
    noisy, = open_packs(packs, "noisy")
    crop = RandomResizedCrop(16)
    alone = list(PackLoader(noisy, 8, crop=crop, flip=True, threads=0))
    mixed = list(PackLoader(mix([noisy]), 8, crop=crop, flip=True, threads=0))
    for (a_images, a_labels), (b_images, b_labels) in zip(alone, mixed, strict=True):
        assert torch.equal(a_images, b_images) and torch.equal(a_labels, b_labels)


def test_images_of_different_sizes_need_a_crop(packs: dict[str, Path]) -> None:
    mixed = mix(open_packs(packs, "small", "large"), [0.5, 0.5])
    with pytest.raises(UsageError, match="pack 'small' gives .* and pack 'large' .*give a crop") as caught:
        mixed.get_batch([0, 9])
    assert "\n" not in str(caught.value)
    images, _ = mixed.get_batch([0, 9], crop=CenterCrop(8))
    assert images.shape == (2, 3, 8, 8)
    assert mixed.get_batch([0, 1])[0].shape == (2, 3, 12, 10)  # one pack's batch: its own size


def test_mixed_batches_fill_a_given_batch(packs: dict[str, Path]) -> None:
    """``out`` of the right shape is written in place (PackLoader hands back batches it reuses)."""
    mixed = mix(open_packs(packs, "noisy", "other"))
    out = torch.empty((3, 3, 16, 16), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    images, labels = mixed.get_batch([1, 35, 2], True, crop=CenterCrop(16), out=out)
    assert images.data_ptr() == out.data_ptr()
    want, want_labels = direct_batch(mixed, np.array([1, 35, 2]), CenterCrop(16), 0.0, Draws())
    assert torch.equal(images, want) and labels.tolist() == want_labels


def test_the_sampler_prefetches_through_each_packs_reader(packs: dict[str, Path]) -> None:
    mixed = mix(open_packs(packs, "noisy", "clean"))
    sampler = mixed.sampler(block_size=2, window_blocks=2)
    assert isinstance(sampler.prefetch, MixHints)
    assert sorted(sampler) == list(range(39))
    assert all(hint.error is None for hint in sampler.prefetch.hints)
    assert mixed.sampler(prefetch=False).prefetch is None


def test_a_mix_pickles_to_workers(packs: dict[str, Path]) -> None:
    """Spawned DataLoader workers get the mix by pickle: paths and settings, no open files or buffers."""
    mixed = mix(open_packs(packs, "noisy", "other"), [0.5, 0.5], seed=2)
    indices = mixed.sampler().epoch_order()[:10]
    want = mixed.get_batch(indices, True, crop=CenterCrop(16))
    copy = pickle.loads(pickle.dumps(mixed))
    got = copy.get_batch(indices, True, crop=CenterCrop(16))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert copy.classes == mixed.classes and copy.names == mixed.names


def test_the_public_names(packs: dict[str, Path]) -> None:
    mixed = packload.mix(open_packs(packs, "noisy", "clean"), [7, 3], 50)
    assert isinstance(mixed, packload.MixedPacks) and mixed.weights == pytest.approx([0.7, 0.3])
    assert isinstance(mixed.sampler(), packload.MixSampler) and len(mixed.sampler()) == 50
    assert "noisy: 30 records, weight 0.7" in repr(mixed)


# -- bad input: one line naming the parameter and the fix ---------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"weights": [0.5, -0.5]}, ValueError, r"weights\[1\] must be a finite number >= 0, got -0.5"),
        ({"weights": [0.5]}, ValueError, "weights has 1 entries for 2 packs; give one weight per pack"),
        ({"weights": [0, 0]}, ValueError, "weights are all 0; give at least one pack a positive weight"),
        ({"weights": [float("nan"), 1]}, ValueError, r"weights\[0\] must be a finite number"),
        ({"weights": ["a", 1]}, TypeError, r"weights\[0\] must be a number"),
        ({"weights": 0.5}, TypeError, "weights must be a list of numbers"),
        ({"samples_per_epoch": 0}, ValueError, "samples_per_epoch must be >= 1, got 0"),
        ({"samples_per_epoch": 2.5}, TypeError, "samples_per_epoch must be an int"),
        ({"seed": -1}, ValueError, "seed must be >= 0"),
        ({"names": ["a", "a"]}, ValueError, r"names must differ from pack to pack; \['a'\] given more than once"),
        ({"names": ["a"]}, ValueError, "names has 1 entries for 2 packs"),
    ],
)
def test_bad_input_gets_one_line(packs: dict[str, Path], kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match) as caught:
        mix(open_packs(packs, "noisy", "clean"), **kwargs)
    assert "\n" not in str(caught.value)


def test_only_packs_can_be_mixed(packs: dict[str, Path]) -> None:
    noisy, = open_packs(packs, "noisy")
    with pytest.raises(TypeError, match=r"datasets\[1\] is a list; mix\(\) takes PackedImageFolder packs"):
        mix([noisy, [1, 2, 3]])
    with pytest.raises(TypeError, match=r"datasets\[1\] is a MixedPacks"):
        mix([noisy, mix([noisy])])
    with pytest.raises(ValueError, match="datasets must be a non-empty list"):
        mix([])
    with pytest.raises(ValueError, match="datasets must be a non-empty list"):
        mix(noisy)
    with pytest.raises(TypeError, match=r"PackLoader reads a PackedImageFolder or a packload.mix\(\)"):
        PackLoader([noisy], 4)
    with pytest.raises(UsageError, match="device='cuda' .* not a mix's"):
        PackLoader(mix([noisy]), 4, crop=16, device="cuda")
    with pytest.raises(IndexError, match="index 30 out of range: the mix has 30 records"):
        mix([noisy])[30]


def test_sampler_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match=r"weights\[1\] is 0.5 but pack 1 holds no records; give it weight 0"):
        MixSampler([10, 0], [0.5, 0.5])
    with pytest.raises(ValueError, match="sizes must be a non-empty list"):
        MixSampler([])
    with pytest.raises(ValueError, match=r"sizes\[0\] must be >= 0"):
        MixSampler([-1, 3])
    with pytest.raises(TypeError, match="prefetch of a MixSampler must be a callable"):
        MixSampler([10], prefetch="train.shards")
    assert MixSampler([10, 0]).counts == [10, 0]


# -- Lightning, on two real CPU ranks ------------------------------------------------------------------


def id_pack(root: Path, ids: range) -> Path:
    """A raw pack of flat 8x8 images whose red level is their id (classes a, b, c)."""
    for image_id in ids:
        folder = root / "src" / "abc"[image_id % 3]
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.zeros((8, 8, 3), dtype=np.uint8)
        pixels[..., 0] = image_id
        Image.fromarray(pixels).save(folder / f"img_{image_id:03d}.png")
    pack(root / "src", root / "ids.shards", options=EncodeOptions(encoding="raw"), workers=1, progress=False)
    return root / "ids.shards"


def mixed_ids(a: str, b: str) -> MixedPacks:
    return mix([PackedImageFolder(a, output="numpy"), PackedImageFolder(b, output="numpy")], [0.5, 0.5],
               samples_per_epoch=30)


if pl is not None:
    class MixModule(pl.LightningModule):
        """Trains nothing; records the ids each loader over the mix hands this rank, per epoch."""

        def __init__(self, a: str, b: str, out_dir: str) -> None:
            super().__init__()
            self.a, self.b, self.out_dir = a, b, out_dir
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.seen: dict[str, dict[str, list[int]]] = {"dataloader": {}, "pack_loader": {}}

        def train_dataloader(self) -> dict[str, object]:
            mixed = mixed_ids(self.a, self.b)
            return {"dataloader": DataLoader(mixed, batch_size=5, sampler=mixed.sampler(seed=3),
                                             collate_fn=collate_uint8),
                    "pack_loader": PackLoader(mixed, 5, sampler=mixed.sampler(seed=3), threads=0)}

        def training_step(self, batch: dict, batch_index: int) -> torch.Tensor:
            for name, (images, _labels) in batch.items():
                self.seen[name].setdefault(str(self.current_epoch), []).extend(ids_of(images))
            return (self.weight * 0.0).sum()

        def on_train_end(self) -> None:
            write_seen(Path(self.out_dir), self.global_rank, self.seen)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.skipif(pl is None, reason="lightning is not installed (pip install packload[frameworks])")
@pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="torch.distributed without gloo")
def test_lightning_keeps_the_mix_sampler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under Lightning's DDP (its distributed sampler on, the default) each rank gets exactly its
    share of the mix's epoch, as the MixSampler computes it here, and a new order each epoch."""
    a, b = id_pack(tmp_path / "a", range(0, 40)), id_pack(tmp_path / "b", range(100, 112))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(MixModule(str(a), str(b), str(tmp_path)))
    ranks = read_seen(tmp_path, 2)
    mixed = mixed_ids(str(a), str(b))
    id_of = [int(mixed[index][0][0, 0, 0]) for index in range(len(mixed))]
    for epoch in range(2):
        for rank in range(2):
            sampler = mixed.sampler(seed=3, rank=rank, world_size=2)
            sampler.set_epoch(epoch)
            want = [id_of[index] for index in sampler.epoch_order()]
            assert len(want) == 15 and sum(i >= 100 for i in want) in (7, 8)
            for name in ("dataloader", "pack_loader"):
                assert ranks[rank][name][str(epoch)] == want, (name, rank, epoch)
    assert ranks[0]["pack_loader"]["0"] != ranks[0]["pack_loader"]["1"]
