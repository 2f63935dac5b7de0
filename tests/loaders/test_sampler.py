"""Tests for packload.loaders.sampler: order properties, locality, mixing, rank split, resume, DataLoader use."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packload.loaders.sampler import PackSampler
from packload.loaders.shuffle_quality import shuffle_quality

ORDERS = ["block", "random", "sequential"]


def rank_orders(n: int, world_size: int, **kwargs) -> list[np.ndarray]:
    """Each rank's epoch order for one configuration."""
    return [PackSampler(n, rank=r, world_size=world_size, **kwargs).epoch_order() for r in range(world_size)]


def sorted_labels(n: int, classes: int = 10) -> np.ndarray:
    """Labels of a pack sorted by class: class c occupies one contiguous run."""
    return np.arange(n) * classes // n


# -- validation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_records": -1}, ValueError, "num_records must be >= 0"),
        ({"num_records": 2.5}, TypeError, "num_records must be an int"),
        ({"block_size": 0}, ValueError, "block_size must be >= 1"),
        ({"window_blocks": 0}, ValueError, "window_blocks must be >= 1"),
        ({"order": "shuffled"}, ValueError, "unknown order 'shuffled'; expected one of"),
        ({"uneven": "wrap"}, ValueError, "unknown uneven 'wrap'; expected one of 'pad', 'drop'"),
        ({"shuffle": 1}, TypeError, "shuffle must be a bool"),
        ({"seed": -3}, ValueError, "seed must be >= 0"),
        ({"rank": 2, "world_size": 2}, ValueError, "0 <= rank < world_size"),
        ({"rank": -1, "world_size": 2}, ValueError, "rank must be >= 0"),
        ({"rank": 0, "world_size": 0}, ValueError, "world_size must be >= 1"),
    ],
)
def test_invalid_arguments_raise_clear_errors(kwargs: dict, error: type, match: str) -> None:
    kwargs = {"num_records": 10, **kwargs}
    with pytest.raises(error, match=match):
        PackSampler(**kwargs)


def test_set_epoch_rejects_negative() -> None:
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        PackSampler(10).set_epoch(-1)


def test_defaults_without_distributed() -> None:
    sampler = PackSampler(10)
    assert (sampler.rank, sampler.world_size, sampler.order) == (0, 1, "block")
    assert PackSampler(10, shuffle=False, order="random").order == "sequential"


# -- order properties -------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 3000),
    block_size=st.integers(1, 200),
    window_blocks=st.integers(1, 40),
    order=st.sampled_from(ORDERS),
    seed=st.integers(0, 2**40),
    epoch=st.integers(0, 1000),
)
def test_every_index_exactly_once(
    n: int, block_size: int, window_blocks: int, order: str, seed: int, epoch: int
) -> None:
    sampler = PackSampler(n, order=order, block_size=block_size, window_blocks=window_blocks, seed=seed)
    result = sampler.epoch_order(epoch)
    assert result.dtype == np.int64
    assert len(sampler) == n
    np.testing.assert_array_equal(np.sort(result), np.arange(n))


@pytest.mark.parametrize("order", ORDERS)
def test_iter_yields_python_ints_matching_epoch_order(order: str) -> None:
    sampler = PackSampler(10_000, order=order)
    items = list(sampler)
    assert all(type(i) is int for i in items)
    assert items == sampler.epoch_order().tolist()


def test_sequential_and_shuffle_false() -> None:
    np.testing.assert_array_equal(PackSampler(7, shuffle=False).epoch_order(), np.arange(7))
    np.testing.assert_array_equal(PackSampler(7, order="sequential").epoch_order(5), np.arange(7))


@pytest.mark.parametrize("order", ["block", "random"])
def test_deterministic_per_seed_and_epoch(order: str) -> None:
    a, b = PackSampler(5000, order=order, seed=3), PackSampler(5000, order=order, seed=3)
    np.testing.assert_array_equal(a.epoch_order(), b.epoch_order())
    assert list(a) == list(b)
    a.set_epoch(1)
    assert list(a) != list(b)
    b.set_epoch(1)
    assert list(a) == list(b)
    np.testing.assert_array_equal(a.epoch_order(7), b.epoch_order(7))  # independent of current epoch
    assert not np.array_equal(a.epoch_order(0), a.epoch_order(1))
    assert not np.array_equal(a.epoch_order(0), PackSampler(5000, order=order, seed=4).epoch_order(0))


def test_block_windows_hold_whole_blocks() -> None:
    """Each run of block_size*window_blocks samples is exactly window_blocks complete blocks."""
    block_size, window_blocks, n = 16, 8, 16 * 8 * 25
    result = PackSampler(n, block_size=block_size, window_blocks=window_blocks).epoch_order()
    for window in result.reshape(-1, block_size * window_blocks):
        blocks = np.unique(window // block_size)
        assert blocks.size == window_blocks
        np.testing.assert_array_equal(np.sort(window), (blocks[:, None] * block_size + np.arange(16)).ravel())


def near_fraction(order: np.ndarray, distance: int) -> float:
    """Fraction of consecutive pairs whose indices are within ``distance`` of each other."""
    return float(np.mean(np.abs(np.diff(order)) < distance))


def test_block_order_is_read_local() -> None:
    n, block_size = 64 * 32 * 10, 64  # whole windows, so each window is aligned to a group of blocks
    random = PackSampler(n, order="random").epoch_order()
    single = PackSampler(n, block_size=block_size, window_blocks=1).epoch_order()
    default = PackSampler(n, block_size=block_size).epoch_order()
    assert near_fraction(single, block_size) > 0.95
    assert near_fraction(default, block_size) > 5 * near_fraction(random, block_size)
    window = block_size * 32  # the shuffle buffer: each full one reads exactly 32 contiguous regions
    full = (n // window) * window
    regions = [np.unique(w // block_size).size for w in default[:full].reshape(-1, window)]
    random_regions = [np.unique(w // block_size).size for w in random[:full].reshape(-1, window)]
    assert max(regions) == 32 and min(random_regions) > 5 * 32


def test_block_order_mixes_sorted_classes() -> None:
    n = 20_000
    labels = sorted_labels(n)
    sequential = shuffle_quality(PackSampler(n, shuffle=False).epoch_order(), labels, 256)
    block = shuffle_quality(PackSampler(n).epoch_order(), labels, 256)
    random = shuffle_quality(PackSampler(n, order="random").epoch_order(), labels, 256)
    assert sequential["same_class_pair_rate"] > 0.95
    assert block["same_class_pair_rate"] < 0.2 * sequential["same_class_pair_rate"]
    assert block["same_class_pair_rate"] < 2 * block["expected_full_shuffle"]
    assert 0.9 < random["ratio"] < 1.1


def test_edge_sizes() -> None:
    assert PackSampler(0).epoch_order().size == 0 and list(PackSampler(0)) == []
    assert list(PackSampler(1)) == [0]
    for n in (1, 5, 63):  # block_size and the window larger than the pack
        assert sorted(PackSampler(n, block_size=64).epoch_order().tolist()) == list(range(n))
    assert sorted(PackSampler(100, block_size=7, window_blocks=1000)) == list(range(100))


# -- rank split -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 7, 100, 1001])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("uneven", ["pad", "drop"])
def test_rank_split(n: int, world_size: int, uneven: str) -> None:
    orders = rank_orders(n, world_size, uneven=uneven, block_size=4, window_blocks=2)
    glob = PackSampler(n, block_size=4, window_blocks=2).global_order()
    per_rank = math.ceil(n / world_size) if uneven == "pad" else n // world_size
    lengths = {len(PackSampler(n, rank=r, world_size=world_size, uneven=uneven)) for r in range(world_size)}
    assert lengths == {per_rank}
    assert all(o.size == per_rank for o in orders)
    joined = np.concatenate(orders)  # rank r holds the r-th contiguous slice of the global order
    if uneven == "drop":
        np.testing.assert_array_equal(joined, glob[: joined.size])
        assert np.unique(joined).size == joined.size
    else:
        np.testing.assert_array_equal(joined, np.resize(glob, joined.size))
        assert set(joined.tolist()) == set(range(n))


def test_fewer_records_than_ranks() -> None:
    assert [o.tolist() for o in rank_orders(3, 8, uneven="drop")] == [[]] * 8
    padded = rank_orders(3, 8, uneven="pad", shuffle=False)
    assert [o.tolist() for o in padded] == [[0], [1], [2], [0], [1], [2], [0], [1]]


# -- resume -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 100, 1037])
@pytest.mark.parametrize(("rank", "world_size"), [(0, 1), (2, 3)])
@pytest.mark.parametrize("order", ["block", "random"])
def test_resume_gives_identical_remaining_order(n: int, rank: int, world_size: int, order: str) -> None:
    opts = {"order": order, "block_size": 8, "window_blocks": 4, "rank": rank, "world_size": world_size}
    first = PackSampler(n, seed=11, **opts)
    first.set_epoch(3)
    full = first.epoch_order().tolist()
    for k in sorted({0, 1, len(first) // 3, len(first) - 1, len(first)}):
        iterator = iter(first)
        assert list(itertools.islice(iterator, k)) == full[:k]
        state = json.loads(json.dumps(first.state_dict()))
        assert (state["epoch"], state["position"], state["seed"]) == (3, k, 11)
        resumed = PackSampler(n, seed=0, **opts)  # seed and epoch come from the state
        resumed.load_state_dict(state)
        resumed.set_epoch(3)  # the usual training loop calls this; it keeps the loaded position
        assert resumed.start_position == k
        assert list(resumed) == full[k:]
        assert list(resumed) == full  # only the next iteration resumes


def test_state_dict_positions() -> None:
    sampler = PackSampler(50)
    assert sampler.state_dict()["position"] == 0
    list(sampler)
    assert sampler.state_dict()["position"] == 50
    assert sampler.state_dict(consumed=20)["position"] == 20
    sampler.set_epoch(1)  # not iterated yet
    assert sampler.state_dict()["epoch"] == 1 and sampler.state_dict()["position"] == 0
    with pytest.raises(ValueError, match="consumed=51 exceeds the 50 samples"):
        sampler.state_dict(consumed=51)


def test_loaded_state_round_trips_and_other_epoch_discards_it() -> None:
    source = PackSampler(200)
    source.set_epoch(2)
    state = source.state_dict(consumed=120)
    target = PackSampler(200)
    target.load_state_dict(state)
    assert target.state_dict() == state
    target.set_epoch(4)
    assert target.start_position == 0
    assert list(target) == PackSampler(200).epoch_order(4).tolist()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_records": 201}, "num_records was 200 when saved but is 201 now"),
        ({"order": "random"}, "order='block' when saved but 'random' now"),
        ({"block_size": 32}, "block_size=64 when saved but 32 now"),
        ({"window_blocks": 2}, "window_blocks=32 when saved but 2 now"),
        ({"world_size": 2, "rank": 0}, "world_size=1 when saved but 2 now"),
        ({"uneven": "drop"}, "uneven='pad' when saved but 'drop' now"),
    ],
)
def test_mismatched_state_raises(kwargs: dict, match: str) -> None:
    state = PackSampler(200).state_dict(consumed=10)
    kwargs = {"num_records": 200, **kwargs}
    with pytest.raises(ValueError, match=match):
        PackSampler(**kwargs).load_state_dict(state)


def test_malformed_state_raises() -> None:
    sampler = PackSampler(10)
    with pytest.raises(TypeError, match="state must be a dict"):
        sampler.load_state_dict([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"missing \['options'\]"):
        sampler.load_state_dict({k: v for k, v in sampler.state_dict().items() if k != "options"})
    with pytest.raises(ValueError, match="position.*exceeds"):
        sampler.load_state_dict({**sampler.state_dict(), "position": 11})


# -- DataLoader -------------------------------------------------------------------------------------------


class IndexDataset(torch.utils.data.Dataset):
    """Returns its index, so a DataLoader's output shows the sampler's order."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_follows_sampler_order(num_workers: int) -> None:
    n, batch_size = 1000, 16
    sampler = PackSampler(n, block_size=8, window_blocks=4)
    loader = torch.utils.data.DataLoader(
        IndexDataset(n), batch_size=batch_size, sampler=sampler, num_workers=num_workers
    )
    expected = sampler.epoch_order().tolist()
    batches = [batch.tolist() for batch in loader]
    assert list(itertools.chain.from_iterable(batches)) == expected

    # Resume from the batches the loop really consumed (the sampler itself ran ahead).
    done = 10
    state = sampler.state_dict(consumed=done * batch_size)
    resumed = PackSampler(n, block_size=8, window_blocks=4)
    resumed.load_state_dict(state)
    loader = torch.utils.data.DataLoader(
        IndexDataset(n), batch_size=batch_size, sampler=resumed, num_workers=num_workers
    )
    assert [i for batch in loader for i in batch.tolist()] == expected[done * batch_size :]


# -- shuffle_quality --------------------------------------------------------------------------------------


# -- prefetch: announcing upcoming records ----------------------------------------------------------------


class Recorder:
    """A prefetch callable that keeps what it was told (copies: the sampler may reuse its arrays)."""

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []

    def __call__(self, indices: np.ndarray) -> None:
        self.calls.append(np.array(indices))


@pytest.mark.parametrize("order", ORDERS)
def test_prefetch_announces_every_record_one_window_ahead(order: str) -> None:
    n, block, window = 1000, 8, 4
    hints = Recorder()
    sampler = PackSampler(n, seed=3, order=order, block_size=block, window_blocks=window, prefetch=hints)
    plain = PackSampler(n, seed=3, order=order, block_size=block, window_blocks=window)
    step = block * window if order == "block" else 2048
    seen: list[int] = []
    announced_before: list[int] = []
    for index in sampler:
        seen.append(index)
        announced_before.append(sum(len(c) for c in hints.calls))
    assert seen == plain.epoch_order().tolist()  # the order is untouched
    assert np.array_equal(np.concatenate(hints.calls), sampler.epoch_order())  # each record once, in order
    # when record k is handed out, everything up to the end of the window after k's is announced
    # (at the very start only the first window, and the first few batches before it)
    assert len(hints.calls[0]) == min(256, step)
    for k, announced in enumerate(announced_before):
        assert announced >= min(n, (k // step + (1 if k < step // 4 else 2)) * step)
    assert sampler.options == plain.options and "prefetch" not in sampler.state_dict()["options"]


def test_prefetch_resume_and_ranks_announce_what_they_read() -> None:
    hints = Recorder()
    sampler = PackSampler(500, seed=1, block_size=4, window_blocks=4, rank=1, world_size=2, prefetch=hints)
    sampler.load_state_dict(PackSampler(500, seed=1, block_size=4, window_blocks=4, rank=1,
                                        world_size=2).state_dict(consumed=37))
    rest = list(sampler)
    assert rest == sampler.epoch_order()[37:].tolist()
    assert np.array_equal(np.concatenate(hints.calls), np.array(rest))


def test_prefetch_option_checked_and_pickles() -> None:
    import pickle

    from packload.loaders.hints import PackHints

    with pytest.raises(TypeError, match="prefetch must be a pack's path or a callable"):
        PackSampler(10, prefetch=3)
    sampler = PackSampler(10, prefetch="some/pack.lmdb")
    assert isinstance(sampler.prefetch, PackHints) and str(sampler.prefetch.path) == "some/pack.lmdb"
    copy = pickle.loads(pickle.dumps(sampler))
    assert isinstance(copy.prefetch, PackHints) and list(copy) == list(PackSampler(10))
    assert sampler.prefetch(np.arange(3)) == 0 and sampler.prefetch.error is not None  # a hint never raises


@pytest.fixture(scope="module")
def small_packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """300 small images packed once per backend (shards of 64 KiB: a batch spans several)."""
    from packload import EncodeOptions, pack
    from tests.image_factory import make_image_folder

    root = tmp_path_factory.mktemp("prefetch")
    make_image_folder(root / "src", classes=("a", "b", "c"), per_class=100, seed=4)
    out = {}
    for backend, suffix in (("lmdb", ".lmdb"), ("shards", ".shards")):
        out[backend] = root / f"pack{suffix}"
        pack(root / "src", out[backend], options=EncodeOptions(), workers=1, progress=False, shard_size=64 << 10)
    return out


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_prefetching_sampler_reads_the_same_bytes(small_packs: dict[str, Path], backend: str) -> None:
    from torch.utils.data import DataLoader

    from packload import PackedImageFolder
    from packload.loaders.collate import collate_as_list
    from packload.loaders.read import PackReader

    path = small_packs[backend]
    ds = PackedImageFolder(path, output="bytes")
    sampler = ds.sampler(shuffle=True, seed=2, block_size=8, window_blocks=2, prefetch=path)
    got = [item for batch in DataLoader(ds, batch_size=16, sampler=sampler, collate_fn=collate_as_list)
           for item in batch]
    with PackReader(path) as reader:
        order = PackSampler(len(ds), seed=2, block_size=8, window_blocks=2).epoch_order()
        assert [data for data, _ in got] == [bytes(reader.payload(i)) for i in order.tolist()]
        assert reader.advise(order[:50]) >= sum(len(reader.payload(i)) for i in order[:50].tolist())
        assert reader.advise([]) == 0
    assert sampler.prefetch.error is None
    sampler.prefetch.close()


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_batches_ask_once_for_records_announced_or_fetched(small_packs: dict[str, Path], backend: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch works out which pieces to ask the storage for only when some of its records were
    not asked for yet (by an earlier batch, or by the sampler's announcement): later batches over
    the same records cost one table lookup, and read the same bytes."""
    from packload.loaders.read import PackReader

    with PackReader(small_packs[backend]) as reader:
        worked = []
        real = reader._prefetcher._prefetch_pieces
        monkeypatch.setattr(reader._prefetcher, "_prefetch_pieces",
                            lambda *args: worked.append(len(args[0])) or real(*args))
        first = [bytes(p) for p in reader.payload_bytes([3, 4, 5, 9])]
        assert worked == [4]
        assert [bytes(p) for p in reader.payload_bytes([9, 5, 4, 3])] == first[::-1] and worked == [4]
        reader.payload_bytes([9, 10])  # one record not asked for yet
        assert worked == [4, 2]
        reader.advise(np.arange(20, 40))  # announced (local disk): batches of them need not ask
        reader.payload_bytes(list(range(20, 40, 3)))
        assert worked == [4, 2]


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_a_batch_never_waits_behind_announced_reads(small_packs: dict[str, Path], backend: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Where reads go through threads (network and FUSE storage; forced here), an announcement is
    read in the background. A batch that needs announced records before their reads have run reads
    them itself: it completes while every background read is held, with the right bytes, and the
    held reads, once released, find those pieces done and do not read them again."""
    import threading

    import packload.loaders.prefetch as prefetch_module
    from packload.loaders.read import PackReader

    release, held, reads = threading.Event(), [], []
    real_ahead, real_piece = prefetch_module.read_ahead, prefetch_module.read_piece

    def waiting(piece: tuple[int, int, int], key: int, done: set[int]) -> None:
        held.append(key)
        release.wait(30)
        real_ahead(piece, key, done)

    monkeypatch.setattr(prefetch_module, "read_ahead", waiting)
    monkeypatch.setattr(prefetch_module, "read_piece", lambda piece: reads.append(piece) or real_piece(piece))
    with PackReader(small_packs[backend], parallel_reads=True) as reader:
        expected = [bytes(reader.payload(i)) for i in range(300)]
        assert reader.advise(np.arange(300)) >= sum(map(len, expected))
        batch = list(range(0, 300, 3))
        assert [bytes(p) for p in reader.payload_bytes(batch)] == [expected[i] for i in batch]
        assert not release.is_set() and held  # the batch did not wait for the background
        by_batch = len(reads)
        assert by_batch > 0
        release.set()
        reader.close()  # waits for the background reads that run
        ahead = reads[by_batch:]
        assert {(o, n) for _, o, n in ahead}.isdisjoint({(o, n) for _, o, n in reads[:by_batch]})
        assert len(ahead) < len(held)  # the pieces the batch read were not read again


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("parallel", [False, True])
def test_dataset_sampler_announces_through_the_datasets_reader(small_packs: dict[str, Path], backend: str,
                                                               workers: int, parallel: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``ds.sampler()`` announces upcoming records by default, through the dataset's own reader in the
    process that runs the sampler (no second reader of the pack there); ``prefetch=False`` announces
    nothing; the order and the bytes are the same either way. Also with the reads of network and
    FUSE storage (forced): background threads in the process that forks the workers."""
    from torch.utils.data import DataLoader

    from packload import PackedImageFolder
    from packload.loaders.collate import collate_as_list
    from packload.loaders.hints import PackHints

    path = small_packs[backend]
    ds = PackedImageFolder(path, output="bytes", parallel_reads=parallel)
    assert ds.parallel_reads is parallel and ds.reader().parallel_reads is parallel
    announced: list[int] = []
    hints = ds.sampler(shuffle=True, seed=5, block_size=8, window_blocks=2)
    assert isinstance(hints.prefetch, PackHints)
    counting = hints.prefetch

    def count(indices: np.ndarray) -> int:
        announced.extend(indices.tolist())
        return counting(indices)

    hints.prefetch = count
    quiet = ds.sampler(shuffle=True, seed=5, block_size=8, window_blocks=2, prefetch=False)
    assert quiet.prefetch is None
    assert ds.sampler(order="random").prefetch is None  # a range per record: not by default
    assert isinstance(ds.sampler(shuffle=False, order="random").prefetch, PackHints)  # sequential after all
    runs = [[item for batch in DataLoader(ds, batch_size=16, sampler=sampler, num_workers=workers,
                                          collate_fn=collate_as_list) for item in batch]
            for sampler in (hints, quiet)]
    assert runs[0] == runs[1] and len(runs[0]) == len(ds)
    assert sorted(announced) == list(range(len(ds)))  # every record announced once, ahead of its read
    assert counting.error is None and counting._reader is None  # it used the dataset's reader
    assert ds._reader is not None and not ds._reader.closed


def test_lmdb_index_fetched_by_parallel_reads_where_reads_wait(small_packs: dict[str, Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """On network and FUSE storage (forced here) opening an LMDB pack fetches its index's bytes by
    parallel positioned reads, as the shards backend does its index file, instead of faulting them in
    a request or two at a time; on a local disk it does not."""
    import packload.loaders.prefetch as prefetch_module
    from packload.core.format import LMDB_INDEX_KEY
    from packload.core.lmdb_pages import LmdbLayout
    from packload.loaders.read import PackReader

    fetched: list[list[tuple[int, int, int]]] = []
    real = prefetch_module.ParallelFetcher.fetch
    monkeypatch.setattr(prefetch_module.ParallelFetcher, "fetch",
                        lambda self, ranges: fetched.append(ranges) or real(self, ranges))
    with PackReader(small_packs["lmdb"], parallel_reads=False) as reader:
        local = reader.index_bytes()
    assert fetched == []
    with PackReader(small_packs["lmdb"], parallel_reads=True) as reader:
        assert reader.index_bytes() == local
    offset, size = LmdbLayout(small_packs["lmdb"].read_bytes(), "pack").locate(LMDB_INDEX_KEY)
    assert [(offset, size)] in [[(o, n) for _, o, n in ranges] for ranges in fetched]


def test_lmdb_chunks_located_from_the_btree(small_packs: dict[str, Path]) -> None:
    """The LMDB reader takes chunks from its own map at offsets read from the B-tree; they must be
    byte for byte what LMDB itself returns."""
    import lmdb

    from packload.core.format import lmdb_chunk_key
    from packload.loaders.read import PackReader

    env = lmdb.open(str(small_packs["lmdb"]), subdir=False, readonly=True, lock=False)
    with PackReader(small_packs["lmdb"]) as reader, env.begin() as txn:
        parts = int(reader.entries["part"].max()) + 1
        assert parts >= 1
        for part in range(parts):
            assert bytes(reader.part_view(part)) == txn.get(lmdb_chunk_key(part))
        assert txn.get(lmdb_chunk_key(parts)) is None
    env.close()


def test_is_a_distributed_sampler_with_its_attributes() -> None:
    """Frameworks that split any sampler that is not a DistributedSampler (Lightning) read these."""
    from torch.utils.data import DistributedSampler

    sampler = PackSampler(1001, rank=1, world_size=4, seed=7, uneven="drop")
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.seed) == (4, 1, 7)
    assert sampler.shuffle and sampler.drop_last
    assert sampler.num_samples == len(sampler) == len(list(sampler)) == 250
    assert sampler.total_size == 1000 and len(sampler.dataset) == 1001
    sampler.epoch = 3  # as DistributedSampler users set it
    assert sampler.epoch == 3 and list(sampler) == sampler.epoch_order(3).tolist()
    padded = PackSampler(1001, rank=0, world_size=4, shuffle=False)
    assert not padded.shuffle and not padded.drop_last and padded.total_size == 1004


def test_world_size_one_is_the_global_order_on_any_rank() -> None:
    sampler = PackSampler(100, world_size=1, seed=2)
    assert sampler.rank == 0 and list(sampler) == sampler.global_order().tolist()
