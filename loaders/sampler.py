"""Sampling orders for packed datasets: shuffled well, read (mostly) sequentially, split evenly, resumable.

A pack stores records 0..n-1 back to back, so reading consecutive records is cheap and jumping around
is not. :class:`PackSampler` offers three orders:

* ``"sequential"``: 0..n-1 (what ``shuffle=False`` gives), for evaluation.
* ``"random"``: a full permutation; best mixing, worst locality.
* ``"block"`` (default): cut 0..n-1 into blocks of ``block_size`` consecutive records, permute the
  blocks, then shuffle the records inside each group of ``window_blocks`` consecutive (permuted) blocks.
  Any run of ``block_size * window_blocks`` samples therefore touches only ``window_blocks`` contiguous
  regions of the pack (page cache / readahead friendly), while the classes of a class-sorted pack still
  mix almost as well as under a full shuffle. This is a deterministic version of FFCV's QUASI_RANDOM
  order or of a shuffle buffer.

Every order is a pure function of ``(seed, epoch, num_records, options)``, so all DDP ranks compute the
same global order independently, and a run can resume mid-epoch from a small JSON-serialisable state.
(It is drawn with ``np.random.default_rng([seed, epoch])``; NumPy keeps those streams stable in practice
but does not promise it across releases, so give all ranks, and a resumed run, the same NumPy.)
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Union

import numpy as np
import numpy.random  # noqa: F401  (imported with the module, not on the first epoch's clock)
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from packload.core.errors import SplitTwiceError, UsageError
from packload.loaders.accelerate_shard import sharded_by_accelerate
from packload.loaders.sample_walk import Cursor, Lookahead, walk, walk_ahead

__all__ = ["PackSampler"]

ORDERS = ("block", "random", "sequential")
UNEVEN_MODES = ("pad", "drop")
STATE_VERSION = 1
_HINT_RECORDS = 2048  # records announced at a time by a prefetching sampler outside the "block" order
Prefetch = Union[str, "os.PathLike[str]", Callable[[np.ndarray], Any], None]


def check_int(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` as an int, or raise a TypeError/ValueError that says what is expected."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} ({value!r})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise a ValueError listing them."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; expected one of {', '.join(map(repr, choices))}")
    return value


def _default_rank_world() -> tuple[int, int]:
    """(rank, world_size) of the initialised default process group, or (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def default_rank() -> int:
    """This process's rank in the initialised default process group, or 0 without one."""
    return _default_rank_world()[0]


def _block_order(n: int, block_size: int, window_blocks: int, rng: np.random.Generator) -> np.ndarray:
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
        _check_choice("order", order, ORDERS)
        self.order = order if shuffle else "sequential"
        self.block_size = check_int("block_size", block_size, 1)
        self.window_blocks = check_int("window_blocks", window_blocks, 1)
        self.uneven = _check_choice("uneven", uneven, UNEVEN_MODES)
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
        n = self.num_records
        if self.order == "sequential":
            return np.arange(n, dtype=np.int64)
        rng = np.random.default_rng([self.seed, epoch])
        if self.order == "random":
            return rng.permutation(n).astype(np.int64, copy=False)
        return _block_order(n, self.block_size, self.window_blocks, rng)

    def _total_size(self) -> int:
        """Length of the global order after padding or dropping to a multiple of world_size."""
        n, w = self.num_records, self.world_size
        return math.ceil(n / w) * w if self.uneven == "pad" else (n // w) * w

    def __len__(self) -> int:
        """Samples this rank yields per epoch (the same on every rank)."""
        return self._total_size() // self.world_size

    def epoch_order(self, epoch: int | None = None) -> np.ndarray:
        """This rank's full order (int64) for ``epoch`` (default: the current one)."""
        order = self.global_order(epoch)
        total = self._total_size()
        if total > order.size:  # pad: repeat from the start of the order, cyclically if n < world_size
            order = np.concatenate([order, np.resize(order, total - order.size)])
        per_rank = total // self.world_size
        return order[self.rank * per_rank : (self.rank + 1) * per_rank]

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
            position = self._check_position("consumed", consumed)
        elif self._resume is not None:
            position = self._resume.start
        elif self._cursor.epoch == self._epoch:
            position = self._cursor.position
        else:  # set_epoch moved on and the new epoch has not been iterated yet
            position = 0
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": self._epoch,
            "position": position,
            "num_records": self.num_records,
            "rank": self.rank,
            "options": self.options,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the NEXT ``__iter__`` continue ``state``'s epoch at its position (later ones start at 0).

        Adopts the saved seed and epoch; raises ValueError if num_records or the options differ, since
        the saved position would then point into a different order.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict from PackSampler.state_dict(), got {type(state).__name__}")
        missing = sorted({"version", "seed", "epoch", "position", "num_records", "options"} - state.keys())
        if missing:
            raise ValueError(f"state is missing {missing}; pass a dict from PackSampler.state_dict()")
        if state["version"] != STATE_VERSION:
            raise ValueError(f"unsupported state version {state['version']!r}; expected {STATE_VERSION}")
        if state["num_records"] != self.num_records:
            raise ValueError(
                f"state mismatch: num_records was {state['num_records']!r} when saved but is "
                f"{self.num_records} now; resume only over the same pack"
            )
        self._check_options(state["options"])
        seed = check_int("state['seed']", state["seed"], 0)
        epoch = check_int("state['epoch']", state["epoch"], 0)
        position = self._check_position("state['position']", state["position"])
        self.seed, self._epoch = seed, epoch
        self._resume = Cursor(epoch=epoch, start=position, position=position)

    def _check_options(self, saved: Any) -> None:
        """Raise a ValueError naming every option that differs between ``saved`` and this sampler."""
        if not isinstance(saved, Mapping):
            raise ValueError(f"state['options'] must be a dict, got {type(saved).__name__}")
        keys = sorted(set(saved) | set(self.options))
        diffs = [
            f"{key}={saved.get(key)!r} when saved but {self.options.get(key)!r} now"
            for key in keys
            if saved.get(key) != self.options.get(key)
        ]
        if diffs:
            raise ValueError(
                "state mismatch: " + "; ".join(diffs) + "; build the sampler with the saved options"
            )

    def _check_position(self, name: str, value: Any) -> int:
        """Validate a position within this rank's epoch (0..len inclusive)."""
        position = check_int(name, value, 0)
        if position > len(self):
            raise ValueError(f"{name}={position} exceeds the {len(self)} samples this rank has per epoch")
        return position
