"""The fetches of a remote pack's blocks (``packload.loaders.remote_fetches``): a batch's, all at once,
and the announced ones, queued on fewer threads of their own; a batch never waits behind the
announcements' queue, a block being fetched is waited for and never asked twice, the bytes an
announcement asks for are the blocks not cached, and close stops what has not started. Over a
stand-in for the blocks (``ShardBlocks``, which it takes as an argument) whose fetches the test holds."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from typing import Any

import numpy as np
import pytest

from packload.loaders.remote_fetches import AHEAD_THREADS, BlockFetches

SIZE = 10  # bytes per block
PARTS = {0: 95, 1: 27}  # shard sizes: the last block of each is shorter
WAIT = 30  # seconds a test waits for its threads at most (a hung fetch fails it, not the run)

Key = tuple[int, int]


class Blocks:
    """``ShardBlocks`` as ``BlockFetches`` uses it: blocks of ``PARTS`` cut in ``SIZE`` bytes, kept in
    ``held`` once fetched (the cache); a fetch of a key in ``gates`` waits until its gate opens."""

    block_size = SIZE

    def __init__(self) -> None:
        self.held: dict[Key, bytes] = {}
        self.fetched: list[tuple[Key, str]] = []  # (block, thread) of each fetch from the store
        self.gates: dict[Key, threading.Event] = {}
        self.waiting = threading.Semaphore(0)  # released by each fetch that reaches its gate
        self.closed = False
        self.forks: list[tuple[Any, Any]] = []
        self._lock = threading.Lock()

    def range(self, part: int, block: int) -> tuple[int, int]:
        return block * SIZE, min(PARTS[part], (block + 1) * SIZE)

    def bytes_of(self, key: Key) -> bytes:
        start, stop = self.range(*key)
        return bytes([key[0] * 16 + key[1]]) * (stop - start)

    def cached(self, part: int, block: int) -> bytes | None:
        with self._lock:
            return self.held.get((part, block))

    def mapped(self, key: Key) -> bool:
        return False

    def in_cache(self, key: Key) -> bool:
        return self.cached(*key) is not None

    def get(self, key: Key) -> bytes:
        """As ``ShardBlocks.get``: the cached block, else fetched (behind its gate) and kept."""
        found = self.cached(*key)
        if found is not None:
            return found
        gate = self.gates.get(key)
        if gate is not None:
            self.waiting.release()
            assert gate.wait(WAIT)
        with self._lock:
            self.fetched.append((key, threading.current_thread().name))
            self.held[key] = self.bytes_of(key)
            return self.held[key]

    def forked(self, store: Any, cache: Any) -> Blocks:
        self.forks.append((store, cache))
        return Blocks()

    def close(self) -> None:
        self.closed = True

    def fetches_of(self, key: Key) -> list[str]:
        """The threads that fetched ``key`` from the store."""
        with self._lock:
            return [thread for done, thread in self.fetched if done == key]


def _ranges(*spans: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    parts, starts, ends = zip(*spans, strict=True)
    return np.array(parts), np.array(starts), np.array(ends)


def _hold_the_announcements(blocks: Blocks, fetches: BlockFetches, queued: int) -> list[Key]:
    """Announce ``AHEAD_THREADS + queued`` blocks of part 0 whose fetches wait at their gates: every
    announcement thread busy, ``queued`` blocks left in their queue. The blocks, in that order."""
    keys = [(0, block) for block in range(AHEAD_THREADS + queued)]
    for key in keys:
        blocks.gates[key] = threading.Event()
    fetches.advise(*_ranges((0, 0, len(keys) * SIZE)))
    for _ in range(AHEAD_THREADS):
        assert blocks.waiting.acquire(timeout=WAIT)  # each announcement thread at its gate
    return keys


def test_a_batch_gets_every_block_cached_ones_without_a_fetch():
    blocks = Blocks()
    blocks.held[(1, 0)] = blocks.bytes_of((1, 0))
    fetches = BlockFetches(blocks)
    keys = [(1, 0), (0, 9), (1, 2), (0, 9)]
    got = fetches.get_all(keys)
    assert got == {key: blocks.bytes_of(key) for key in keys}
    assert sorted(key for key, _ in blocks.fetched) == [(0, 9), (1, 2)]  # each once, the cached one never
    assert all(thread.startswith("packload-remote_") for _, thread in blocks.fetched)  # the batch's threads
    assert fetches.inflight == {}
    fetches.close()


def test_an_announcement_asks_for_the_blocks_not_cached_or_asked_for(tmp_path):
    blocks = Blocks()
    blocks.held[(0, 4)] = blocks.bytes_of((0, 4))
    fetches = BlockFetches(blocks)
    # Part 0, bytes 5..25: blocks 0-2; bytes 38..52: blocks 3-5 (4 cached); an empty range at 90: block 9
    # (5 bytes, the shard's last); part 1, bytes 12..27: blocks 1-2 (7 bytes, its last).
    ranges = _ranges((0, 5, 25), (0, 38, 52), (0, 90, 90), (1, 12, 27), (0, 6, 7))
    asked = fetches.advise(*ranges)
    assert asked == 3 * SIZE + 2 * SIZE + 5 + SIZE + 7
    announced = list(fetches.ahead.values())
    futures.wait(announced, timeout=WAIT)
    assert sorted(key for key, _ in blocks.fetched) == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 5), (0, 9), (1, 1), (1, 2)]
    assert all(thread.startswith("packload-remote-ahead_") for _, thread in blocks.fetched)
    assert fetches.advise(*ranges) == 0  # all cached now: nothing asked
    fetches.close()


def test_an_announcement_of_blocks_already_asked_for_asks_nothing():
    blocks = Blocks()
    fetches = BlockFetches(blocks)
    keys = _hold_the_announcements(blocks, fetches, queued=2)
    assert fetches.advise(*_ranges((0, 0, len(keys) * SIZE))) == 0  # running or queued: not again
    announced = list(fetches.ahead.values())
    for key in keys:
        blocks.gates[key].set()
    futures.wait(announced, timeout=WAIT)
    fetches.close()
    assert sorted(key for key, _ in blocks.fetched) == keys


def test_a_batch_never_waits_behind_the_announcements_queue():
    """Every announcement thread is held; a batch that needs a block still queued behind them fetches
    it on its own threads at once, and the announced fetch, when it runs, finds it cached."""
    blocks = Blocks()
    fetches = BlockFetches(blocks)
    keys = _hold_the_announcements(blocks, fetches, queued=1)
    queued = keys[-1]
    del blocks.gates[queued]  # fetched without waiting, by whichever thread fetches it
    assert fetches.get_all([queued]) == {queued: blocks.bytes_of(queued)}
    assert [thread.split("_")[0] for thread in blocks.fetches_of(queued)] == ["packload-remote"]
    announced = list(fetches.ahead.values())
    for key in keys[:-1]:
        blocks.gates[key].set()
    futures.wait(announced, timeout=WAIT)
    fetches.close()
    assert len(blocks.fetches_of(queued)) == 1  # the announcement's turn came: nothing fetched twice


def test_a_block_being_fetched_is_waited_for_never_asked_twice():
    blocks = Blocks()
    fetches = BlockFetches(blocks)
    keys = _hold_the_announcements(blocks, fetches, queued=0)
    running = keys[0]
    got: dict[Key, bytes] = {}
    batch = threading.Thread(target=lambda: got.update(fetches.get_all([running, (1, 0)])))
    batch.start()
    batch.join(0.2)  # the batch waits on the announced fetch (no timing is asserted)
    blocks.gates[running].set()
    batch.join(WAIT)
    assert not batch.is_alive() and got == {running: blocks.bytes_of(running), (1, 0): blocks.bytes_of((1, 0))}
    assert len(blocks.fetches_of(running)) == 1 and blocks.fetches_of(running)[0].startswith("packload-remote-ahead_")
    for key in keys[1:]:
        blocks.gates[key].set()
    fetches.close()


def test_close_stops_the_announced_fetches_not_started():
    blocks = Blocks()
    fetches = BlockFetches(blocks)
    keys = _hold_the_announcements(blocks, fetches, queued=3)
    queued = [fetches.ahead[key] for key in keys[AHEAD_THREADS:]]
    closing = threading.Thread(target=fetches.close)
    closing.start()
    deadline = time.monotonic() + WAIT  # close cancels the queue first, then waits for the running ones
    while not all(future.cancelled() for future in queued) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(future.cancelled() for future in queued)
    for key in keys:
        blocks.gates[key].set()
    closing.join(WAIT)
    assert not closing.is_alive() and blocks.closed
    assert sorted(key for key, _ in blocks.fetched) == keys[:AHEAD_THREADS]  # the queued three never fetched


def test_a_forked_copy_has_the_blocks_forked_and_nothing_in_flight():
    blocks = Blocks()
    fetches = BlockFetches(blocks)
    keys = _hold_the_announcements(blocks, fetches, queued=1)
    store, cache = object(), object()
    copy = fetches.forked(store, cache)
    assert blocks.forks == [(store, cache)] and isinstance(copy.blocks, Blocks) and copy.blocks is not blocks
    assert copy.inflight == {} and copy.ahead == {} and len(fetches.ahead) == len(keys)
    for key in keys:
        blocks.gates[key].set()
    fetches.close()


@pytest.mark.parametrize("ahead", [False, True], ids=["batch", "announced"])
def test_a_fetch_that_fails_is_no_longer_in_flight(ahead):
    """A fetch that raised leaves its place: the next batch asks for the block again."""
    blocks = Blocks()
    fetches = BlockFetches(blocks)
    failing = blocks.get

    def broken(key: Key) -> bytes:
        raise OSError("connection reset")

    blocks.get = broken
    if ahead:
        fetches.advise(*_ranges((0, 0, 1)))
        futures.wait(list(fetches.ahead.values()), timeout=WAIT)
    else:
        with pytest.raises(OSError, match="connection reset"):
            fetches.get_all([(0, 0)])
    assert fetches.inflight == {} and fetches.ahead == {}
    blocks.get = failing
    assert fetches.get_all([(0, 0)]) == {(0, 0): blocks.bytes_of((0, 0))}
    fetches.close()
