"""A sampler for packed datasets: shuffled well, read (mostly) sequentially, split evenly, resumable.

:class:`PackSampler` hands out one of the orders of ``loaders.sample_order`` ("block", the default,
"random" or "sequential"), this rank's share of it, one index at a time (``loaders.sample_walk``).
Every order is a pure function of ``(seed, epoch, num_records, options)``, so all DDP ranks compute the
same global order independently, and a run can resume mid-epoch from a small JSON-serialisable state
(``loaders.sampler_state``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Union

import numpy as np
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from packload.core.errors import SplitTwiceError, UsageError
from packload.loaders.accelerate_shard import sharded_by_accelerate
from packload.loaders.sample_order import ORDERS, UNEVEN_MODES, global_order, rank_share, split_size
from packload.loaders.sample_walk import Cursor, Lookahead, walk, walk_ahead
from packload.loaders.sampler_args import check_choice, check_int
from packload.loaders.sampler_state import check_position, resume_point, saved_state

__all__ = ["PackSampler"]

_HINT_RECORDS = 2048  # records announced at a time by a prefetching sampler outside the "block" order
Prefetch = Union[str, "os.PathLike[str]", Callable[[np.ndarray], Any], None]


def _default_rank_world() -> tuple[int, int]:
    """(rank, world_size) of the initialised default process group, or (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def default_rank() -> int:
    """This process's rank in the initialised default process group, or 0 without one."""
    return _default_rank_world()[0]


class PackSampler(DistributedSampler[int]):
    """Sampler for packed datasets: block-local shuffling, even DDP split, exact mid-epoch resume.

    A ``DistributedSampler`` by type, with its attributes (``num_replicas``, ``rank``, ``epoch``,
    ``shuffle``, ``seed``, ``drop_last``, ``num_samples``, ``total_size``, ``dataset``), so that
    frameworks that split any other sampler by rank (Lightning's ``use_distributed_sampler``) see
    that it is split already and only call its ``set_epoch``. Accelerate's ``prepare()`` shards
    every sampler's batches whatever its type: under it, build the sampler with ``world_size=1``
    (one global order, split by Accelerate alone); a sampler split by rank there raises
    :class:`~packload.core.errors.SplitTwiceError` (docs/FRAMEWORKS.md).

    Args:
        num_records: records in the pack (indices 0..num_records-1).
        shuffle: False gives the sequential order 0..n-1 whatever ``order`` says.
        seed: base seed; the order of an epoch depends only on (seed, epoch, num_records, options).
        order: "block" (block-local shuffle), "random" (full permutation) or "sequential".
        block_size: consecutive records read together ("block" order only).
        window_blocks: blocks whose records are mixed together; the shuffle buffer is
            ``block_size * window_blocks`` records ("block" order only).
        rank, world_size: this process's share; default to torch.distributed's when it is initialised,
            else 0 and 1. ``world_size=1`` alone gives every process the whole (global) order.
        uneven: make the global order divisible by world_size by "pad" (repeat records from the start of
            the order: every record seen at least once) or "drop" (drop the tail: at most once).
        prefetch: the pack's path (or a callable taking an int64 array of record numbers): while it
            hands out one window of records (``block_size * window_blocks``; 2048 records in the other
            orders), the sampler announces the next window's records to the storage
            (:meth:`loaders.read.PackReader.advise`: ``posix_fadvise(WILLNEED)`` on their contiguous
            runs; on network and FUSE storage, parallel reads by the reader's own background
            threads), so a cold page cache is filled ahead of the reads, for DataLoader workers
            too. It changes no order and is not part of the state.

    Each rank takes a contiguous slice of the global order, so its reads stay block-local, and every
    rank yields exactly ``len(self)`` samples.
    """

    def __init__(
        self,
        num_records: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        order: str = "block",
        block_size: int = 64,
        window_blocks: int = 32,
        rank: int | None = None,
        world_size: int | None = None,
        uneven: str = "pad",
        prefetch: Prefetch = None,
    ) -> None:
        # DistributedSampler.__init__ is not called: it asks for a dataset and, without explicit
        # num_replicas and rank, an initialised process group. Its attributes are properties below.
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {type(shuffle).__name__} ({shuffle!r})")
        self.num_records = check_int("num_records", num_records, 0)
        self.seed = check_int("seed", seed, 0)
        check_choice("order", order, ORDERS)
        self.order = order if shuffle else "sequential"
        self.block_size = check_int("block_size", block_size, 1)
        self.window_blocks = check_int("window_blocks", window_blocks, 1)
        self.uneven = check_choice("uneven", uneven, UNEVEN_MODES)
        self.rank, self.world_size = self._resolve_rank(rank, world_size)
        self._epoch = 0
        self._cursor = Cursor(epoch=0, start=0, position=0)
        self._resume: Cursor | None = None
        self._sharded_by_accelerate = False  # last iterated by Accelerate's batch sharding
        self.prefetch = prefetch

    @property
    def prefetch(self) -> Callable[[np.ndarray], Any] | None:
        """What announces upcoming records (see ``prefetch`` above), or None."""
        return self._prefetch

    @prefetch.setter
    def prefetch(self, prefetch: Prefetch) -> None:
        if prefetch is not None and not callable(prefetch):
            if not isinstance(prefetch, (str, os.PathLike)):
                raise TypeError(f"prefetch must be a pack's path or a callable, got {type(prefetch).__name__}")
            from packload.loaders.hints import PackHints  # the reader maps files: only when asked for

            prefetch = PackHints(prefetch)
        self._prefetch = prefetch

    def _hint_records(self) -> int:
        """Records announced at a time: one window of the block order."""
        return self.block_size * self.window_blocks if self.order == "block" else _HINT_RECORDS

    @staticmethod
    def _resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
        """Fill missing rank/world_size from torch.distributed and check 0 <= rank < world_size."""
        default_rank, default_world = _default_rank_world()
        world_size = check_int("world_size", default_world if world_size is None else world_size, 1)
        if rank is None:  # one share (world_size=1: the global order) is rank 0's on every process
            rank = 0 if world_size == 1 else default_rank
        rank = check_int("rank", rank, 0)
        if rank >= world_size:
            raise ValueError(
                f"rank must satisfy 0 <= rank < world_size, got rank={rank}, world_size={world_size}; "
                "pass both explicitly or initialise torch.distributed first"
            )
        return rank, world_size

    # -- order -----------------------------------------------------------------------------------------

    @property
    def options(self) -> dict[str, Any]:
        """The settings that, with (seed, epoch, num_records), determine this rank's order."""
        return {
            "order": self.order,
            "block_size": self.block_size,
            "window_blocks": self.window_blocks,
            "world_size": self.world_size,
            "uneven": self.uneven,
        }

    @property
    def epoch(self) -> int:
        """The epoch the next (or current) iteration walks (setting it is ``set_epoch``)."""
        return self._epoch

    @epoch.setter
    def epoch(self, epoch: int) -> None:
        self.set_epoch(epoch)

    # -- DistributedSampler's attributes, read by frameworks ---------------------------------------

    @property
    def num_replicas(self) -> int:
        """The number of ranks the order is split over (``world_size``)."""
        return self.world_size

    @property
    def shuffle(self) -> bool:
        """Whether the order is shuffled (any order but "sequential")."""
        return self.order != "sequential"

    @property
    def drop_last(self) -> bool:
        """True when the tail is dropped to split evenly (``uneven="drop"``), False when padded."""
        return self.uneven == "drop"

    @property
    def num_samples(self) -> int:
        """Samples this rank yields per epoch (``len(self)``)."""
        return len(self)

    @property
    def total_size(self) -> int:
        """Samples all ranks yield per epoch together, after padding or dropping."""
        return self._total_size()

    @property
    def dataset(self) -> range:
        """The indices sampled from, ``range(num_records)`` (the sampler holds no dataset)."""
        return range(self.num_records)

    @property
    def start_position(self) -> int:
        """Where in the epoch the current iteration started, or the pending resume position."""
        return self._resume.start if self._resume is not None else self._cursor.start

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next ``__iter__`` yields (call once per epoch, on every rank).

        A position loaded with :meth:`load_state_dict` is kept if ``epoch`` is the loaded epoch and
        discarded otherwise.
        """
        self._epoch = check_int("epoch", epoch, 0)
        if self._resume is not None and self._resume.epoch != self._epoch:
            self._resume = None

    def global_order(self, epoch: int | None = None) -> np.ndarray:
        """The order of all records for ``epoch`` (default: the current one), before the rank split."""
        epoch = self._epoch if epoch is None else check_int("epoch", epoch, 0)
        return global_order(self.num_records, self.order, self.seed, epoch, self.block_size, self.window_blocks)

    def _total_size(self) -> int:
        """Length of the global order after padding or dropping to a multiple of world_size."""
        return split_size(self.num_records, self.world_size, self.uneven)

    def __len__(self) -> int:
        """Samples this rank yields per epoch (the same on every rank)."""
        return self._total_size() // self.world_size

    def epoch_order(self, epoch: int | None = None) -> np.ndarray:
        """This rank's full order (int64) for ``epoch`` (default: the current one)."""
        return rank_share(self.global_order(epoch), self._total_size(), self.rank, self.world_size)

    # -- iteration -------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[int]:
        """Yield this rank's indices for the current epoch, from a loaded resume position if any.

        Raises SplitTwiceError when Accelerate shards the batches of a sampler split by rank."""
        self._sharded_by_accelerate = sharded_by_accelerate()
        if self._sharded_by_accelerate and self.world_size > 1:
            raise SplitTwiceError(
                f"PackSampler is split over {self.world_size} ranks and accelerate's prepare() shards its "
                f"batches again (each rank would see 1/{self.world_size ** 2} of the pack): build it with "
                "world_size=1 (ds.sampler(world_size=1)) so that accelerate's shard is the only split"
            )
        start = self._resume.start if self._resume is not None else 0
        self._resume = None
        self._cursor = Cursor(epoch=self._epoch, start=start, position=start)
        order = self.epoch_order()[start:]
        if self._prefetch is None:
            return walk(order, self._cursor)
        return walk_ahead(order, self._cursor, self._prefetch, self._hint_records())

    def begin_epoch(self) -> np.ndarray:
        """Start an iteration as ``__iter__`` does, but return this rank's remaining order for the
        epoch as one int64 array (for loaders that cut whole batches from it). The loader reports
        progress by passing ``consumed`` to :meth:`state_dict`."""
        start = self._resume.start if self._resume is not None else 0
        self._resume = None
        self._cursor = Cursor(epoch=self._epoch, start=start, position=start)
        return self.epoch_order()[start:]

    def lookahead(self, order: np.ndarray) -> Lookahead | None:
        """What announces ``order`` (from :meth:`begin_epoch`) a window ahead of a loader's reading
        position, as ``__iter__`` does, or None when this sampler has no ``prefetch``."""
        return None if self._prefetch is None else Lookahead(order, self._prefetch, self._hint_records())

    # -- resume ----------------------------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """JSON-serialisable state to resume this epoch at sample ``consumed`` of this rank's order.

        ``consumed`` counts this rank's samples the training loop has really used since the START of
        the epoch (after a resume, add :attr:`start_position`). If it is None, the number of indices the
        current iterator has yielded is used. With DataLoader workers the sampler runs ahead of the loop
        by the prefetched batches, so pass ``consumed = batches_done * batch_size`` instead, or the
        prefetched-but-unused samples are skipped on resume.

        All ranks consume the same number of samples, so the state saved on rank 0 can be loaded on
        every rank. Under Accelerate's prepared loader (``world_size=1``, sharded by Accelerate) the
        position is in the global order: ``consumed`` must be given, as the samples all processes
        used together (``steps * batch_size * num_processes``).
        """
        if consumed is None and self._sharded_by_accelerate and self._cursor.epoch == self._epoch:
            raise UsageError(
                "PackSampler.state_dict(): under accelerate's prepared loader the sampler cannot tell how "
                "many of its samples were used; pass consumed=steps * batch_size * accelerator.num_processes"
            )
        if consumed is not None:
            position = check_position("consumed", consumed, len(self))
        elif self._resume is not None:
            position = self._resume.start
        elif self._cursor.epoch == self._epoch:
            position = self._cursor.position
        else:  # set_epoch moved on and the new epoch has not been iterated yet
            position = 0
        return saved_state(self.seed, self._epoch, position, self.num_records, self.rank, self.options)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the NEXT ``__iter__`` continue ``state``'s epoch at its position (later ones start at 0).

        Adopts the saved seed and epoch; raises ValueError if num_records or the options differ, since
        the saved position would then point into a different order.
        """
        seed, epoch, position = resume_point(state, self.num_records, self.options, len(self))
        self.seed, self._epoch = seed, epoch
        self._resume = Cursor(epoch=epoch, start=position, position=position)
