"""``PackedImageFolder``: a drop-in for torchvision's ``ImageFolder`` that reads a pack.

It gives what ``ImageFolder`` gave, ``(image, class_index)`` with the same ``classes``,
``class_to_idx`` and ``targets``, and the same ``transform``/``target_transform`` hooks, so a
training script changes one line. The object holds only the pack's path, its options and small
metadata: it pickles cheaply to spawned workers, and each process opens the pack itself on first
use (an LMDB environment or memory map is never inherited across ``fork``).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from packload.core.errors import PackChangedError
from packload.core.manifest import Manifest
from packload.core.remote import is_url
from packload.core.urls import display_url
from packload.loaders.batch_engine import BatchEngine
from packload.loaders.collate import collate_uint8
from packload.loaders.crop import CenterCrop
from packload.loaders.decode_threads import DecodeThreads
from packload.loaders.fields import FieldColumn, PackFields, Target, TargetSpec, field_types
from packload.loaders.hints import PackHints
from packload.loaders.params import check_decode_size
from packload.loaders.random_crop import Draws, RandomResizedCrop
from packload.loaders.read import PackReader
from packload.loaders.sample_maker import SampleMaker
from packload.loaders.sampler import PackSampler, Prefetch, default_rank

OUTPUTS = ("pil", "numpy", "tensor", "bytes")
ON_ERROR = ("raise", "skip")


class PackedImageFolder(Dataset):
    """A pack read as an ``ImageFolder``: ``ds[i]`` is ``(image, class_index)``.

    Args:
        root: the ``.lmdb`` file or shards folder that ``pack`` wrote.
        transform: applied to the image, as in ImageFolder. A ``RandomResizedCrop`` (a transform
            whose draws are keyed by the sample) is called with the record's index and the key
            set by ``set_epoch``, so it gives each sample the crop ``PackLoader`` gives it.
        target_transform: applied to the class index.
        output: ``pil`` (RGB image, the default), ``numpy`` (HxWx3 uint8), ``tensor`` (3xHxW uint8)
            or ``bytes`` (the stored payload, undecoded).
        decode_size: (height, width) the images will be resized to; JPEGs are then decoded at a
            reduced DCT scale that is still at least this size (faster; pixels differ slightly
            from a full decode followed by the same resize).
        exif_transpose: turn images upright by their EXIF orientation (ImageFolder does not).
        verify: check each record's CRC-32 when it is read (and the index against the manifest's
            sha256 when the pack is opened).
        on_error: ``raise`` a clear error for a damaged record, or ``skip`` it with a warning and
            return the next intact record in its place (so batches keep their size).
        fast_jpeg: use libjpeg-turbo (simplejpeg) for JPEGs when installed.
        parallel_reads: read ahead from many threads at once (True), never (False), or only where
            each read waits a round trip, on network and FUSE storage (None, decided once here).
        source_root: the folder ``samples`` joins each record's original ``class/file`` path to
            (default: ``root``); give the folder you packed to get ImageFolder's exact ``samples``.
            ``relative_samples`` and ``path(i)`` give the original relative paths.
        cache_dir, cache_limit, storage_options: for a pack at a URL (``s3://bucket/train.shards``,
            ``gs://``, ``https://``, any fsspec URL): the local folder fetched bytes are kept in
            (default ``~/.cache/packload``), the most bytes it may hold (default
            ``$PACKLOAD_CACHE_LIMIT`` or 20 GiB), and fsspec's options (an endpoint, credentials).
            See docs/OBJECT_STORES.md. ``timeout``: seconds a request to the store may wait for its
            answer before it is retried or given up (default ``$PACKLOAD_TIMEOUT`` or 20).
        decode_threads: threads that decode a batch asked for with ``__getitems__`` (as a
            DataLoader does) outside DataLoader workers, e.g. with ``num_workers=0`` (None: one per
            usable core; 1: the calling thread). Transforms still run in order in the calling thread.
        target: what comes back beside each image, for a pack made from a table (``pack --labels``):
            a field's name (``"caption"``), a tuple of names (``("label", "attributes")``; ``label``
            is the class index), or a callable given a mapping of the record's fields. None (the
            default): the class index. ``get_batch`` (and ``PackLoader``, ``batch_loader``) batch
            numbers as tensors and strings as lists. ``fields`` names the pack's fields with their
            types; ``field(name)`` gives one field of every record (docs/FIELDS.md).
    """

    def __init__(self, root: str | os.PathLike[str], transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None, *, output: str = "pil",
                 decode_size: tuple[int, int] | None = None, exif_transpose: bool = False,
                 verify: bool = False, on_error: str = "raise", fast_jpeg: bool = True,
                 parallel_reads: bool | None = None, source_root: str | os.PathLike[str] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | None = None,
                 storage_options: dict[str, Any] | None = None, decode_threads: int | None = None,
                 timeout: float | None = None, target: TargetSpec | None = None) -> None:
        if output not in OUTPUTS:
            raise ValueError(f"unknown output {output!r}; choose one of {', '.join(OUTPUTS)}")
        if on_error not in ON_ERROR:
            raise ValueError(f"unknown on_error {on_error!r}; choose raise or skip")
        self.root: Path | str = str(root).rstrip("/") if is_url(root) else Path(root)
        # The pack as messages name it (a URL without its secrets).
        self.shown: str = display_url(str(self.root)) if is_url(root) else str(self.root)
        # Where a pack at a URL is cached; each process's reader is opened with them.
        self._remote_options: dict[str, Any] = {"cache_dir": cache_dir, "cache_limit": cache_limit,
                                                "storage_options": storage_options,
                                                "timeout": timeout} if is_url(root) else {}
        # What ``samples`` joins each record's relative path to, as ImageFolder joins its root.
        self.source_root = str(root if source_root is None else source_root)
        self.transform = transform
        self.target_transform = target_transform
        self.output = output
        self.decode_size = check_decode_size(decode_size)  # one line for nonsense, not an odd decode later
        self.exif_transpose = exif_transpose
        self.verify = verify
        self.on_error = on_error
        self.fast_jpeg = fast_jpeg
        reader = PackReader(self.root, check_index=verify, parallel_reads=parallel_reads, **self._remote_options)
        self.parallel_reads: bool = reader.parallel_reads
        try:
            self._encoding: str = reader.encoding
            self.classes: list[str] = reader.classes
            self.targets: list[int] = reader.labels().tolist()
            self._identity = reader.identity  # every process that reopens the pack checks it is this one
            self.fields: dict[str, str] = field_types(reader.manifest)  # {name: type} of the table's fields
            self.target = target
            self._target = Target(target, self.fields) if target is not None else None
        except BaseException:
            reader.close()
            raise
        if not reader.ranged:
            reader.close()
        self.class_to_idx: dict[str, int] = {name: i for i, name in enumerate(self.classes)}
        # A pack at a URL stays open: forked DataLoader workers carry its manifest and index over.
        self._reader: PackReader | None = reader if reader.ranged else None
        self._engine: BatchEngine | None = None  # makes whole batches (get_batch), per process
        self._fields: PackFields | None = None
        self._maker_made: SampleMaker | None = None  # makes the drop-in path's samples, per process
        self._draws = Draws()
        # Threads that decode a batch asked for with ``__getitems__`` (one per usable core by default).
        self.decode_threads = DecodeThreads(decode_threads)

    # -- ImageFolder's surface -------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[Any, Any]]:
        """A whole batch: the reader fetches contiguous records in large requests, then decodes."""
        return self._maker().samples(indices)

    def set_epoch(self, epoch: int, seed: int = 0, rank: int | None = None) -> None:
        """The key of random transforms' draws (``RandomResizedCrop``, its flip) on the drop-in path:
        give the sampler's ``epoch`` and ``seed`` (``rank``: the sampler's, by default
        torch.distributed's), and each sample gets the crop ``PackLoader`` gives it. Call it every
        epoch before iterating; DataLoader workers see it when they start, so with
        ``persistent_workers=True`` the draws keep the epoch the workers started in."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        self._draws = Draws(seed, epoch, default_rank() if rank is None else int(rank))

    def get_batch(self, indices: Sequence[int], channels_last: bool = False, *,
                  crop: CenterCrop | RandomResizedCrop | None = None, pin_memory: bool = False,
                  fast_idct: bool = False, flip: bool | float = False,
                  draws: Draws | None = None, out: torch.Tensor | None = None,
                  rows: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Read, decode and stack a whole batch: ``(B×3×H×W uint8, B int64)`` in one call.

        The fast path for training loops (``PackLoader`` and ``batch_loader`` use it): every image
        is written straight into one preallocated batch, with no per-sample tensors and nothing
        pickled. Images must come out one size: a ``crop`` (``CenterCrop``, applied to every image,
        with reduced-scale JPEG decoding), a pack whose images are all one size, or, without a
        crop, the dataset's ``transform`` if it makes one size. Raw pixels are gathered straight
        from the memory map. ``channels_last`` gives channels-last memory (no transpose copy);
        ``pin_memory`` page-locked memory (when CUDA is available). ``fast_idct`` decodes JPEGs with
        libjpeg-turbo's fast integer IDCT (as FFCV does): a few percent faster, pixels about one level
        of 255 from the exact IDCT's on average, so no longer identical to the drop-in path's.
        ``flip`` mirrors images horizontally with that probability (True: 0.5); ``draws`` (seed,
        epoch, rank) keys a ``RandomResizedCrop``'s boxes and the flips, with each record's index.
        ``out``: a cropped batch is written into it when it has the batch's shape and layout (a batch
        that nothing else refers to any more: ``PackLoader`` reuses its batches). ``rows`` (with a
        ``crop`` and an ``out``): the row of ``out`` each image goes to, the batch being a part of
        ``out`` (a mix's pack writing its rows of the mixed batch, no copy); ``out`` is returned.
        """
        return self._batches().get_batch(indices, channels_last, crop=crop, pin_memory=pin_memory, fast_idct=fast_idct,
                                         flip=flip, draws=draws, out=out, rows=rows)

    def get_encoded_batch(self, indices: Sequence[int], *,
                          pin_memory: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A batch's stored payloads, undecoded: one flat uint8 tensor, ``B+1`` int64 offsets and ``B``
        int64 labels (record ``i`` is ``data[offsets[i]:offsets[i+1]]``), as ``collate_encoded`` gives.

        For decoding elsewhere (for example nvJPEG on the GPU), or for moving packs' bytes at the
        speed of the disk: one copy per batch, nothing per sample. ``verify`` and ``on_error`` apply.
        """
        return self._batches().get_encoded_batch(indices, pin_memory=pin_memory)

    def _batches(self) -> BatchEngine:
        """The engine that makes this dataset's whole batches (made on first use in each process)."""
        self._engine = self._engine or BatchEngine(self)
        return self._engine

    def _maker(self) -> SampleMaker:
        """The maker of this dataset's drop-in samples (made on first use in each process)."""
        self._maker_made = self._maker_made or SampleMaker(self)
        return self._maker_made

    @property
    def draws(self) -> Draws:
        """The key of random transforms' draws, as ``set_epoch`` set it."""
        return self._draws

    def target_of(self, reader: PackReader, index: int) -> Any:
        """What record ``index`` gives beside its image, before ``target_transform``: its class
        index, or the ``target``'s value (``reader``: this process's reader)."""
        return self.targets[index] if self._target is None else self._target.one(self._fields_of(reader), index)

    def transformed_batch(self, positions: np.ndarray, pin_memory: bool) -> tuple[torch.Tensor, Any]:
        """Records ``positions`` as this dataset's samples (its ``transform`` deciding the images, one
        size), stacked into a B×3×H×W uint8 batch, with their targets batched: ``get_batch`` without
        a crop. For the batch engine."""
        items = self.__getitems__(positions.tolist())
        batch, labels = collate_uint8(items if self._target is None else [(image, 0) for image, _ in items],
                                      pin_memory=pin_memory)
        if self._target is not None:  # targets read (and transformed) with their images
            labels = self._target.collate([target for _, target in items])
        return batch, labels

    def batch_targets(self, reader: PackReader, chosen: Sequence[int] | np.ndarray, labels: torch.Tensor) -> Any:
        """The targets of records ``chosen`` (``labels``: their class indices), batched: ``labels``,
        or the ``target``'s. For the batch engine."""
        if self._target is None:
            return labels
        return self._target.batch(self._fields_of(reader), np.asarray(chosen, dtype=np.int64))

    def retarget(self, target: Target | None) -> PackedImageFolder:
        """A copy of this dataset reading the same pack whose records give ``target`` (a ``Target`` made
        for this pack's fields; None: the class index) beside their images: how a mix gives each pack
        the mix's target. This dataset is left as it is."""
        other = copy.copy(self)
        other.target = None if target is None else target.spec
        other._target = target
        other._engine = other._fields = None  # made for the copy when it first needs them
        other._maker_made = None
        other.decode_threads = DecodeThreads(self.decode_threads.threads)  # a pool of its own, started on use
        return other

    def _fields_of(self, reader: PackReader) -> PackFields:
        """The fields of this process's reader (decoded on first use; checked under ``verify``)."""
        if self._fields is None or self._fields.reader is not reader:
            self._fields = PackFields(reader, check=self.verify)
        return self._fields

    def field(self, name: str) -> FieldColumn:
        """Field ``name`` of every record, in record order: a NumPy array for numbers and booleans, a
        ``StringColumn`` (a sequence of ``str``) or a ``ListColumn`` (a sequence of NumPy arrays)
        otherwise; ``label`` gives the class indices. Views of the pack's bytes, valid while this
        dataset's reader is open."""
        if name != "label" and name not in self.fields:
            raise KeyError(f"{self.root}: " + Target.missing(name, self.fields))
        return self._fields_of(self.reader()).column(name)

    @property
    def encoding(self) -> str:
        """How the pack stores images: keep, jpeg, png or raw."""
        return self._encoding

    @property
    def manifest(self) -> Manifest:
        """The pack's manifest (read from the pack, not carried to worker processes): a ``dict``
        with a property for each field (``packload.core.manifest.Manifest``)."""
        return self.reader().manifest

    @property
    def samples(self) -> list[tuple[str, int]]:
        """(full path, class index) of every record, as ImageFolder's ``samples``: the record's
        original path (``class/file``) joined to ``source_root`` (default: the pack's path, as given)."""
        return [(os.path.join(self.source_root, path), target) for path, target in self.relative_samples]

    imgs = samples

    @property
    def relative_samples(self) -> list[tuple[str, int]]:
        """(original path relative to the packed folder, class index) of every record."""
        reader = self.reader()
        return [(reader.path_of(i), target) for i, target in enumerate(self.targets)]

    def path(self, index: int) -> str:
        """The original relative path of record ``index``."""
        return self.reader().path_of(index)

    def sampler(self, shuffle: bool = True, seed: int = 0, *, prefetch: Prefetch | bool = True,
                **options: Any) -> PackSampler:
        """A ``PackSampler`` for this pack: block-shuffled (reads stay sequential), split over
        DDP ranks with equal counts, resumable. ``options`` go to ``PackSampler``.

        ``prefetch=True`` (the default): while the sampler hands out one window of records it
        announces the next window's to the storage, through this process's reader of the pack, so
        with a cold page cache the disk works a window ahead of the reads (DataLoader workers share
        the page cache), except with ``order="random"``, where every record would be announced on
        its own (a system call per record). ``False`` announces nothing; a path or callable is passed
        on as it is."""
        if prefetch is True:  # a syscall per record (random order) costs more than it saves when cached
            random = shuffle and options.get("order", "block") == "random"
            prefetch = None if random else PackHints(self.root, opener=self.reader)
        elif prefetch is False:
            prefetch = None
        return PackSampler(len(self), shuffle=shuffle, seed=seed, prefetch=prefetch, **options)

    # -- reading ---------------------------------------------------------------------------
    def reader(self) -> PackReader:
        """This process's reader, opened on first use (and again after a fork or ``close``)."""
        if self._reader is not None and self._reader.ranged and not self._reader.closed \
                and self._reader.pid != os.getpid():  # a forked worker: a pack at a URL carries over
            self._reader = self._reader.forked()
        if self._reader is None or self._reader.closed or self._reader.pid != os.getpid():
            reader = PackReader(self.root, check_index=self.verify, parallel_reads=self.parallel_reads,
                                **self._remote_options)
            if reader.identity != self._identity:
                reader.close()
                raise PackChangedError(f"{self.shown}: now holds another pack than the one this dataset opened "
                                       "(it was packed again over it); create the dataset again to read the new "
                                       "pack, or restore the old one")
            self._reader = reader
        return self._reader

    def close(self) -> None:
        """Let go of the pack's files in this process (the next read opens them again)."""
        if self._reader is not None and self._reader.pid == os.getpid():
            self._reader.close()
        self._reader = None
        if self._engine is not None:
            self._engine.close()
        self._fields = None
        self.decode_threads.close()

    def __getstate__(self) -> dict[str, Any]:
        # OS resources stay in the process that opened them; the rest is made again on use.
        return {**self.__dict__, "_reader": None, "_engine": None, "_maker_made": None, "_fields": None}

    def __repr__(self) -> str:
        return (f"PackedImageFolder({str(self.root)!r}, records={len(self)}, classes={len(self.classes)}, "
                f"encoding={self.encoding!r}, output={self.output!r})")
