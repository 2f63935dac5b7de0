"""``PackLoader``: whole uint8 batches from a pack, built in threads, in place of a DataLoader.

A DataLoader moves every batch from a worker process to the training process through shared
memory and a pipe, and that per-batch cost caps small-image pipelines far below what the disk and
the CPU could give. ``PackLoader`` builds the same batches in a pool of threads inside the training
process: raw pixels are gathered straight from the memory map, and JPEG decoding (libjpeg-turbo)
and resizing release the GIL, so the threads run in parallel. Where the compiled batch decoder was
built (``packload/core/jpeg_kernel.py``), a batch's JPEGs are decoded, cropped and resized in one
call that gives the GIL up once, so a training loop that holds the GIL much of the time barely slows
the threads (one image at a time, each would wait for it several times per image). The order comes from the
dataset's ``PackSampler`` (same seed, same order as the DataLoader path; DDP rank split; mid-epoch
resume through ``state_dict``).

    loader = PackLoader(ds, 256, crop=CenterCrop(224), threads=8)
    train = PackLoader(ds, 256, crop=RandomResizedCrop(224), flip=True)   # training augmentation
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:          # B×3×224×224 uint8 (channels-last), B int64
            ...
"""

from __future__ import annotations

import os
import sys
import warnings
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from packload.core.cpus import usable_cores
from packload.core.errors import UsageError
from packload.core.threads import single_core_torch_pool
from packload.core.torch_private import storage_use_count, storage_use_count_available
from packload.loaders.crop import CenterCrop
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.mix import MixedPacks
from packload.loaders.params import check_batch_memory
from packload.loaders.random_crop import Draws, RandomResizedCrop, check_crop, flip_probability
from packload.loaders.sampler import PackSampler

if TYPE_CHECKING:
    from packload.loaders.gpu_decode import GpuBatches

_REMOTE_COPY_THREADS = 4  # threads copying batches on network and FUSE storage with no announcements (see __init__)
_GPU_THREADS = 4  # threads planning batches and launching their GPU decodes (device="cuda")


class PackLoader:
    """Batches ``(B×3×H×W uint8, B int64)`` of a ``PackedImageFolder``, built by ``threads`` threads.

    Args:
        dataset: the pack to read (its ``transform`` is not used: give ``crop`` instead, or use a
            pack whose images are all one size, such as ``--encoding raw --size 32x32``).
        batch_size: samples per batch.
        sampler: the order; defaults to ``dataset.sampler()`` (block-shuffled, rank-aware).
        crop: a ``CenterCrop`` (or an int, the crop's side) applied to every image, or a
            ``RandomResizedCrop``, whose boxes are drawn per sample from the sampler's seed, epoch
            and rank and the record's index (the same crops for the same seed; a resumed epoch
            gets the crops it would have had).
        flip: mirror images horizontally with this probability (True: 0.5), drawn per sample like
            a ``RandomResizedCrop``'s boxes; with any crop, or none. Default: the crop's ``flip``.
        threads: threads building batches; 0 builds them in the loop's own thread. Default: the
            usable CPU cores when images are decoded or cropped, else 0 (copying raw pixels or
            stored bytes is quickest without handing batches between threads; 4 on network and FUSE
            storage when the sampler announces nothing, where each batch's reads wait round trips).
        prefetch: batches being built ahead of the training loop; default ``2 * threads``.
        drop_last: drop a last batch smaller than ``batch_size``.
        channels_last: batches in channels-last memory (shape still B×3×H×W): no transpose copy,
            and what convolutions on a GPU prefer. False gives contiguous NCHW.
        pin_memory: allocate batches in page-locked memory so ``.cuda(non_blocking=True)``
            overlaps the copy (ignored, with a warning, when CUDA is unavailable).
        encoded: yield the stored payloads undecoded, ``(data, offsets, labels)`` as
            ``PackedImageFolder.get_encoded_batch`` gives them (for decoding on the GPU).
        fast_idct: decode JPEGs with libjpeg-turbo's fast integer IDCT, as FFCV does: a few percent
            faster; pixels then differ from the drop-in path's by about one level of 255 on average.
        device: ``"cuda"`` (or ``"cuda:N"``) decodes JPEGs on the GPU (nvImageCodec, the ``gpu``
            extra, or torchvision's ``decode_jpeg``), crops, resizes and flips them there with the CPU
            path's boxes, and yields CUDA batches and labels; other records are decoded on the CPU in
            the same batch and copied up (``loaders/gpu_decode.py``). Default ``threads`` is then at
            most 4. None: batches on the CPU.

    A batch kept by the training loop (or any view or array of it) is never overwritten; the
    memory of cropped batches the loop has let go of is reused for later ones (no page faults).
    """

    def __init__(self, dataset: PackedImageFolder | MixedPacks, batch_size: int, *, sampler: PackSampler | None = None,
                 crop: CenterCrop | RandomResizedCrop | int | None = None, flip: bool | float | None = None,
                 threads: int | None = None, prefetch: int | None = None, drop_last: bool = False,
                 channels_last: bool = True, pin_memory: bool = False, encoded: bool = False,
                 fast_idct: bool = False, device: str | torch.device | None = None) -> None:
        if not isinstance(dataset, (PackedImageFolder, MixedPacks)):
            raise TypeError(f"PackLoader reads a PackedImageFolder or a packload.mix() of them, got {type(dataset).__name__}")
        if device is not None and getattr(dataset, "target", None) is not None:
            raise UsageError("device='cuda' gives the class indices beside its images, not a dataset's target=: "
                             "leave device out, or the target")
        if device is not None and isinstance(dataset, MixedPacks):
            raise UsageError("device='cuda' decodes one pack's records on the GPU, not a mix's: leave device out")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = sampler if sampler is not None else dataset.sampler()
        self.crop = check_crop(crop, int_side=True)  # one line for a wrong kind or size
        if self.crop is not None:  # batches larger than the memory there is: one line, not torch's allocation error
            check_batch_memory(batch_size, self.crop.size, "crop size")
        self.flip = self._flip_of(self.crop, flip)
        self.encoded = encoded
        self.fast_idct = fast_idct
        if encoded and (self.crop is not None or self.flip):
            raise ValueError("encoded=True yields the stored bytes: a crop or flip cannot apply; drop one of them")
        copy_only = encoded or (self.crop is None and dataset.encoding == "raw" and not dataset.exif_transpose)
        if threads is None:  # copying needs no threads where the sampler announces the order: on a
            # local disk the kernel reads ahead, on network and FUSE storage the reader's own threads do
            # (and extra threads here would only hand batches around). Without
            # announcements a batch's fetch there waits round trips, and a few threads overlap them.
            unannounced = self.sampler.prefetch is None and dataset.parallel_reads
            threads = (_REMOTE_COPY_THREADS if unannounced else 0) if copy_only else usable_cores()
            if device is not None:  # the GPU decodes: a few threads keep it fed
                threads = min(_GPU_THREADS, usable_cores())
        self.threads = int(threads)
        if self.threads < 0:
            raise ValueError(f"threads must be 0 (build batches in the loop's own thread) or more, got {threads}")
        self.prefetch = max(1, 2 * self.threads) if prefetch is None else int(prefetch)
        if self.prefetch < 1:
            raise ValueError(f"prefetch must be at least 1, got {prefetch}")
        self.drop_last = drop_last
        self.channels_last = channels_last
        self.pin_memory = pin_memory and torch.cuda.is_available()
        if pin_memory and not self.pin_memory:
            warnings.warn("pin_memory=True ignored: CUDA is not available, batches stay in pageable memory",
                          stacklevel=2)
        self.gpu: GpuBatches | None = None  # builds the batches on the GPU when device is given
        if device is not None:
            if encoded:
                raise UsageError("encoded=True yields the stored bytes, device='cuda' decodes them: drop one of them")
            from packload.loaders.gpu_decode import GpuBatches  # imports the GPU decoder only when asked

            self.gpu = GpuBatches(dataset, self.crop, self.flip, channels_last, device, fast_idct)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self._start = 0  # position in the epoch where the current iteration began
        self._consumed = 0  # samples of the current iteration handed to the training loop

    @staticmethod
    def _flip_of(crop: CenterCrop | RandomResizedCrop | None, flip: bool | float | None) -> float:
        """The flip probability: ``flip``'s, else the crop's; refuses two different ones."""
        own = crop.flip if isinstance(crop, RandomResizedCrop) else 0.0
        if flip is None:
            return own
        probability = flip_probability(flip)
        if own and probability != own:
            raise ValueError(f"flip={flip!r} but the crop flips with probability {own}: give one of them")
        return probability

    def __len__(self) -> int:
        """Batches per epoch for this rank (from the start of the epoch)."""
        samples = len(self.sampler)
        return samples // self.batch_size if self.drop_last else -(-samples // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration reads (as ``PackSampler.set_epoch``)."""
        self.sampler.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the training loop stands: resume with ``load_state_dict`` at the next unseen sample
        (batches built ahead but not yet handed out are not counted as seen)."""
        return self.sampler.state_dict(consumed=self._start + self._consumed)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iteration continue ``state``'s epoch where it stopped."""
        self.sampler.load_state_dict(state)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        self._start = self.sampler.start_position
        order = self.sampler.begin_epoch()
        self._consumed = 0
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        starts = range(0, stop, self.batch_size)
        draws = Draws(self.sampler.seed, self.sampler.epoch, self.sampler.rank)  # keys this epoch's crops and flips
        return self._batches(order, starts, draws)

    def _batches(self, order: np.ndarray, starts: range, draws: Draws) -> Iterator[tuple[torch.Tensor, ...]]:
        spares = _Spares() if self.crop is not None and not self.pin_memory and self.gpu is None \
            and _Spares.supported else None
        ahead = self.sampler.lookahead(order)  # announces the order a window ahead (the sampler's prefetch)
        if self.threads == 0:
            for start in starts:
                if ahead is not None:
                    ahead.reach(start)
                indices = order[start : start + self.batch_size]
                batch = self._build(indices, draws, spares.take(len(indices)) if spares else None)
                self._consumed += self._count(batch)
                if spares:
                    spares.keep(batch[0])
                yield batch
            return
        pool = self._executor()
        pending: deque[Future[tuple[torch.Tensor, ...]]] = deque()
        upcoming = iter(starts)

        def submit(start: int) -> None:
            if ahead is not None:
                ahead.reach(start)
            indices = order[start : start + self.batch_size]
            pending.append(pool.submit(self._build, indices, draws, spares.take(len(indices)) if spares else None))

        try:
            for start in upcoming:
                submit(start)
                if len(pending) >= self.prefetch:
                    break
            while pending:
                batch = pending.popleft().result()
                start = next(upcoming, None)
                if start is not None:
                    submit(start)
                self._consumed += self._count(batch)
                if spares:
                    spares.keep(batch[0])
                yield batch
        finally:
            for future in pending:
                future.cancel()

    def _count(self, batch: tuple[Any, ...]) -> int:
        """Samples in ``batch``: its images (its offsets, less one, when ``encoded``), whatever its targets are."""
        return len(batch[1]) - 1 if self.encoded else len(batch[0])

    def _build(self, indices: np.ndarray, draws: Draws, images: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """One batch, in a pool thread (written into ``images`` when given)."""
        if self.encoded:
            return self.dataset.get_encoded_batch(indices, pin_memory=self.pin_memory)
        if self.gpu is not None:
            return self.gpu.build(indices, draws)
        return self.dataset.get_batch(indices, self.channels_last, crop=self.crop, pin_memory=self.pin_memory,
                                      fast_idct=self.fast_idct, flip=self.flip, draws=draws, out=images)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pool_pid != os.getpid():  # threads do not survive a fork
            self._pool = single_core_torch_pool(self.threads)
            self._pool_pid = os.getpid()
        return self._pool

    def close(self) -> None:
        """Stop the threads (the loader can still be iterated again; they restart)."""
        if self._pool is not None and self._pool_pid == os.getpid():
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None

    def __enter__(self) -> PackLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"PackLoader({self.dataset!r}, batch_size={self.batch_size}, threads={self.threads}, "
                f"crop={self.crop!r}, flip={self.flip}, channels_last={self.channels_last})")


class _Spares:
    """Batches handed out earlier, reused once nothing but this list refers to their memory.

    A fresh 10 MB batch per step costs page faults and cache misses on every write, a noticeable
    share of a cropped batch's time; reusing one that the training loop has let go of costs none.
    "Let go" is decided by reference counts: every tensor, view or NumPy array on the memory holds
    a reference to it (counted by torch), and anyone holding the storage object itself adds to its
    Python count; both are compared with those of a storage known to be unreferenced. So a batch
    that is kept, or any part of it, is never overwritten. Pinned batches are left to torch's
    pinned-memory cache, which knows when a copy to the GPU has finished."""

    supported = storage_use_count_available()
    _KEEP = 4  # batches remembered: a loop may hold on to a few
    _unreferenced: tuple[int, int] | None = None  # (Python count, torch count) of a storage nobody else holds

    def __init__(self) -> None:
        self._held: deque[tuple[torch.UntypedStorage, tuple[int, ...], tuple[int, ...]]] = deque()
        if _Spares._unreferenced is None:
            _Spares._unreferenced = self._counts((torch.empty(1, dtype=torch.uint8).untyped_storage(), (1,), (1,)))

    @staticmethod
    def _counts(entry: tuple[torch.UntypedStorage, tuple[int, ...], tuple[int, ...]]) -> tuple[int, int]:
        storage = entry[0]
        return sys.getrefcount(storage), storage_use_count(storage) or 0

    def keep(self, images: torch.Tensor) -> None:
        """Remember a batch just handed out (its memory, not the tensor: holding the tensor would
        hide whether the training loop still does)."""
        if images.storage_offset() == 0 and images.untyped_storage().nbytes() == images.numel():
            self._held.append((images.untyped_storage(), tuple(images.shape), images.stride()))
            if len(self._held) > self._KEEP:
                self._held.popleft()

    def take(self, count: int) -> torch.Tensor | None:
        """A batch of ``count`` images that nothing refers to any more, or None."""
        for k, entry in enumerate(self._held):
            if entry[1][0] == count and self._counts(entry) == self._unreferenced:
                del self._held[k]
                storage, shape, stride = entry
                if storage.nbytes() != int(np.prod(shape)):  # resized meanwhile: let it go
                    return None
                return torch.empty(0, dtype=torch.uint8).set_(storage, 0, shape, stride)
        return None
