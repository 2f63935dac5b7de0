"""Handing out an order: every index counted before it goes, and every record announced once, ahead."""

from __future__ import annotations

import numpy as np

from packload.loaders.sample_walk import HINT_HEAD, Cursor, Lookahead, walk, walk_ahead


def test_walk_counts_each_index_before_it_is_handed_out() -> None:
    order = np.arange(20_000, dtype=np.int64)[::-1].copy()  # more than one chunk of ints
    cursor = Cursor(epoch=0, start=5, position=5)
    seen = []
    for index in walk(order, cursor):
        seen.append(index)
        assert cursor.position == 5 + len(seen)  # counted already when the loop body sees it
    assert seen == order.tolist()
    assert all(type(i) is int for i in seen[:3])


def test_lookahead_announces_the_head_first_then_a_window_ahead() -> None:
    order = np.random.default_rng(0).permutation(5000).astype(np.int64)
    calls: list[np.ndarray] = []
    ahead = Lookahead(order, calls.append, step=1000)
    ahead.reach(0)
    assert [c.size for c in calls] == [HINT_HEAD, 1000 - HINT_HEAD]  # the first batches' records first
    ahead.reach(249)  # under a quarter of the first window: nothing more yet
    assert len(calls) == 2
    ahead.reach(250)
    assert np.array_equal(calls[-1], order[1000:2000])  # the second window
    ahead.reach(1000)
    assert np.array_equal(calls[-1], order[2000:3000])  # always one window ahead of the reader
    ahead.reach(4999)
    assert np.array_equal(np.concatenate(calls), order)  # each record announced exactly once, in order


def test_walk_ahead_announces_every_record_before_handing_it_out() -> None:
    order = np.random.default_rng(1).permutation(2500).astype(np.int64)
    announced: set[int] = set()
    cursor = Cursor(epoch=3, start=0, position=0)
    out = []
    for index in walk_ahead(order, cursor, lambda part: announced.update(part.tolist()), step=512):
        assert index in announced
        out.append(index)
    assert out == order.tolist() and cursor.position == order.size
    assert announced == set(order.tolist())


def test_empty_order_announces_nothing() -> None:
    calls: list[np.ndarray] = []
    assert list(walk_ahead(np.empty(0, dtype=np.int64), Cursor(0, 0, 0), calls.append, step=64)) == []
    assert calls == []
