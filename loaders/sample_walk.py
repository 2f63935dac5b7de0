"""Handing out a sampler's order one index at a time: each counted in a cursor before it goes (so a
state saved mid-epoch knows where it is), and, for a prefetching sampler, the records of the next
window announced to the storage ahead of the reads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

YIELD_CHUNK = 8192  # indices converted to Python ints at a time (avoids a 10M-element Python list)
HINT_HEAD = 256  # records announced first, before the first window (a few batches' worth)


@dataclass
class Cursor:
    """Progress of one iterator: its epoch, where it started, and how many of this rank's samples of
    that epoch have been handed out (``position`` counts from the start of the epoch)."""

    epoch: int
    start: int
    position: int


class Lookahead:
    """Announces an order's records to ``prefetch`` one window (``step`` records) ahead of a reading
    position. At the start nothing is ahead yet: the first few batches' records go first (so the
    first batch waits for its own reads, not for a whole window's), then the first window; the
    second once a quarter of the first is read; from then on, the next window as each one begins."""

    def __init__(self, order: np.ndarray, prefetch: Callable[[np.ndarray], Any], step: int) -> None:
        self.order, self.prefetch, self.step = order, prefetch, max(1, step)
        self.announced = 0  # records of ``order`` announced so far

    def reach(self, position: int) -> None:
        """The reader is at ``position`` of the order: announce what should be ahead of it."""
        order, step = self.order, self.step
        if not self.announced and order.size:
            head = min(order.size, HINT_HEAD, step)
            self.prefetch(order[:head])
            self.prefetch(order[head:step])
            self.announced = min(order.size, step)
        windows = 1 if position < step // 4 else position // step + 2
        while self.announced < min(order.size, windows * step):
            self.prefetch(order[self.announced : self.announced + step])
            self.announced += step


def walk(order: np.ndarray, cursor: Cursor) -> Iterator[int]:
    """Yield ``order`` as Python ints, counting each one in ``cursor`` before it is handed out."""
    for offset in range(0, order.size, YIELD_CHUNK):
        for index in order[offset : offset + YIELD_CHUNK].tolist():
            cursor.position += 1
            yield index

def walk_ahead(order: np.ndarray, cursor: Cursor, prefetch: Callable[[np.ndarray], Any],
                step: int) -> Iterator[int]:
    """:func:`walk`, announcing the records one window (``step`` records) ahead of those handed
    out (:class:`Lookahead`)."""
    ahead = Lookahead(order, prefetch, step)
    for offset in range(0, order.size, step):
        ahead.reach(offset)
        chunk = order[offset : offset + step].tolist()
        early = min(len(chunk), step // 4) if offset == 0 else len(chunk)
        for index in chunk[:early]:
            cursor.position += 1
            yield index
        if early < len(chunk):
            ahead.reach(early)
            for index in chunk[early:]:
                cursor.position += 1
                yield index
