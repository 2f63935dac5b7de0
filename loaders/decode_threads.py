"""Decode the records of one batch on threads, for ``PackedImageFolder.__getitems__`` in a process
that is not a DataLoader worker (``num_workers=0``, or a loop of the user's own).

libjpeg-turbo (through simplejpeg) and PIL's decoders let go of the GIL while they decode, so the
records of a batch decode on every core at once, and the pixels stay in this process: with
DataLoader workers, each decoded image is pickled and copied through a pipe to the main process.
Only the decoding runs on the threads; transforms run afterwards in the calling thread, in the
batch's order, so random transforms draw exactly as they would one record at a time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from packload.core.cpus import usable_cores

T = TypeVar("T")
R = TypeVar("R")


def in_dataloader_worker() -> bool:
    """True in a DataLoader worker process (its parallelism is the workers: no threads of ours)."""
    from torch.utils.data import get_worker_info  # noqa: PLC0415 - torch is imported by then

    return get_worker_info() is not None


class DecodeThreads:
    """A pool of ``threads`` decoding threads, started on first use in each process (a pool does not
    survive a fork) and never pickled; ``threads <= 1`` decodes in the calling thread."""

    def __init__(self, threads: int | None = None) -> None:
        """``threads``: None for one per usable core (CPU affinity and cgroup quota counted)."""
        if threads is not None and threads < 1:
            raise ValueError(f"decode_threads {threads}: give 1 or more, or None for one per usable core")
        self.threads = usable_cores() if threads is None else int(threads)
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1

    def wanted(self, count: int) -> bool:
        """Whether a batch of ``count`` records is decoded on the threads here."""
        return self.threads > 1 and count > 1 and not in_dataloader_worker()

    def map(self, function: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``function`` of each item, in order, on the pool's threads."""
        if self._pool is None or self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="packload-decode")
            self._pid = os.getpid()
        return list(self._pool.map(function, items))

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=False)
        self._pool = None

    def __getstate__(self) -> dict[str, Any]:
        return {"threads": self.threads, "_pool": None, "_pid": -1}
