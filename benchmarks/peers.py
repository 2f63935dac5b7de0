"""Peer adapters: write an ImageFolder sample list with a rival tool and read it back through torch.

Each adapter packs the *original* file bytes (no re-encode) plus the class index, and its
``dataset()`` yields ``(decode(image_bytes), label)`` so the benchmark compares storage and loading,
not codecs. The peers are optional; ``unavailable()`` says why one cannot run.

Install recipe (tested in a fresh ``python -m venv --system-site-packages`` beside torch 2.13.0+cpu).
The peers go in with ``--no-deps`` because LitData and MosaicML Streaming declare ``torch`` and
``torchvision`` as hard requirements, which would replace the CPU torch with a multi-GB CUDA build::

    pip install --no-deps webdataset==1.0.2 litdata==0.2.76 mosaicml-streaming==0.13.0
    pip install -r benchmarks/requirements-peers.txt   # their import-time deps; none needs torch
    python -c "import torch; print(torch.__version__)"   # must still print 2.13.0+cpu

Workarounds, each kept to its adapter:

* Streaming imports ``torchvision`` (only for its ``streaming.vision`` ImageNet/CIFAR/ADE20K/COCO
  dataset classes: ``VisionDataset`` as a base class and ``to_tensor``) and ``transformers`` (only
  for ``isinstance`` checks in ``StreamingDataLoader`` and tokenizers of ``streaming.text`` C4/Pile),
  all at ``import streaming`` time. We use neither, so ``_import_streaming`` puts stand-in modules in
  ``sys.modules`` for exactly the names it imports, only when the real package is absent, and only
  while importing streaming; MDSWriter/StreamingDataset never touch them.
* Streaming pins ``numpy<2.2``; ``--no-deps`` keeps this repo's numpy 2.x, with which local MDS
  write/read round-trips exactly (checked by tests/benchmarks/test_peers.py).
* LitData hands back ``memoryview`` slices of its chunk files; DataLoader worker processes cannot
  pickle those into the result queue, so the adapter copies them to ``bytes``.
* WebDataset splits *shards* (not samples) across DataLoader workers, so a small set written as one
  ~100 MB shard would leave all but one worker idle: the writer also caps samples per shard so that
  there are at least ``min_shards`` shards (WebDataset advises shards >= nodes x workers).
* ``litdata.optimize`` forces the process-wide multiprocessing start method to "spawn" (so the calling
  script needs an ``if __name__ == "__main__":`` guard); the adapter restores the previous method so
  later DataLoaders keep the platform default.

Side effects to know about: Streaming leaves two empty ``$TMPDIR/NNNNNN_{barrier,cache}_filelock``
files per ``StreamingDataset`` created (its own design). For spawn/forkserver DataLoader workers, the
``decode`` given to ``dataset()`` must be picklable (a module-level function, not a lambda).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import json
import math
import multiprocessing
import os
import pickle
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch.utils.data as tud

Sample = tuple[Path, int]  # (image file, class index) in ImageFolder order
Decode = Callable[[bytes], Any]

_RECIPE = (
    "pip install --no-deps webdataset==1.0.2 litdata==0.2.76 mosaicml-streaming==0.13.0 "
    "&& pip install -r benchmarks/requirements-peers.txt"
)


class Peer(Protocol):
    """What the benchmark harness calls on every peer."""

    name: str

    def unavailable(self) -> str | None: ...

    def write(self, samples: list[Sample], out: Path) -> None: ...

    def dataset(self, out: Path, decode: Decode) -> tud.Dataset | tud.IterableDataset: ...


def _missing(*modules: str) -> str | None:
    """Return an install hint if any of ``modules`` cannot be imported, else None."""
    for mod in modules:
        try:
            importlib.import_module(mod)
        except Exception as exc:  # ImportError, or a broken install raising something else
            return f"not installed ({mod}: {type(exc).__name__}: {exc}); install with: {_RECIPE}"
    return None


def _ext(path: Path) -> str:
    """WebDataset key suffix for an image file: its lowercase extension without the dot."""
    return path.suffix.lower().lstrip(".") or "bin"


class _MapIterable(tud.IterableDataset):
    """Iterate ``inner`` (itself split across workers by its library) and apply ``fn`` to each item."""

    def __init__(self, inner: Any, fn: Callable[[Any], Any], length: int | None = None) -> None:
        self.inner = inner
        self.fn = fn
        self.length = length

    def __iter__(self) -> Iterator[Any]:
        return map(self.fn, self.inner)

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("length unknown")
        return self.length


# ---------------------------------------------------------------- ImageFolder baseline


class _FileDataset(tud.Dataset):
    """Map-style dataset that opens each original file per sample, like torchvision's ImageFolder."""

    def __init__(self, items: list[tuple[str, int]], decode: Decode) -> None:
        self.items = items
        self.decode = decode

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        path, label = self.items[i]
        with open(path, "rb") as f:
            return self.decode(f.read()), label


class ImageFolderPeer:
    """Baseline: no packing; `write` only records the sample list as JSON."""

    name = "imagefolder"

    def unavailable(self) -> str | None:
        return None

    def write(self, samples: list[Sample], out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        items = [[str(Path(p).resolve()), int(label)] for p, label in samples]
        (out / "samples.json").write_text(json.dumps(items))

    def dataset(self, out: Path, decode: Decode) -> tud.Dataset:
        items = [(p, int(label)) for p, label in json.loads((out / "samples.json").read_text())]
        return _FileDataset(items, decode)


# ---------------------------------------------------------------- WebDataset


def _wds_pair(sample: dict[str, Any], decode: Decode) -> tuple[Any, int]:
    """Turn a raw WebDataset sample dict (bytes per extension) into (decode(image), label)."""
    image = next(v for k, v in sample.items() if not k.startswith("__") and k != "cls")
    return decode(image), int(sample["cls"])


class WebDatasetPeer:
    """WebDataset: POSIX tar shards via ``ShardWriter``; keys ``{index:08d}``, ``.<ext>`` bytes + ``.cls``."""

    name = "webdataset"

    def __init__(self, maxsize: float = 100e6, min_shards: int = 16) -> None:
        self.maxsize = maxsize
        self.min_shards = min_shards

    def unavailable(self) -> str | None:
        return _missing("webdataset")

    def write(self, samples: list[Sample], out: Path) -> None:
        import webdataset as wds

        out.mkdir(parents=True, exist_ok=True)
        maxcount = max(1, math.ceil(len(samples) / self.min_shards))
        with wds.ShardWriter(
            str(out / "shard-%06d.tar"), maxcount=maxcount, maxsize=self.maxsize, verbose=0
        ) as sink:
            for i, (path, label) in enumerate(samples):
                sink.write(
                    {"__key__": f"{i:08d}", _ext(Path(path)): Path(path).read_bytes(), "cls": int(label)}
                )
        (out / "meta.json").write_text(json.dumps({"samples": len(samples)}))

    def dataset(self, out: Path, decode: Decode) -> tud.IterableDataset:
        import webdataset as wds

        shards = sorted(str(p) for p in out.glob("shard-*.tar"))
        ds = wds.WebDataset(
            shards,
            # Sequential read, same order as the others; training would pass a buffer size instead.
            shardshuffle=False,
            # Library-recommended splitting: shards by rank (no-op on one node), then by DataLoader worker.
            nodesplitter=wds.split_by_node,
            workersplitter=wds.split_by_worker,
            # A worker may legitimately get no shard when workers > shards.
            empty_check=False,
        )
        # Not ds.with_length(): it builds a class on the fly that spawned workers cannot unpickle.
        length = json.loads((out / "meta.json").read_text())["samples"]
        return _MapIterable(ds, functools.partial(_wds_pair, decode=decode), length)


# ---------------------------------------------------------------- LitData


def _litdata_item(item: tuple[str, int]) -> dict[str, Any]:
    """`optimize` worker function: raw file bytes and label (module-level so it pickles)."""
    path, label = item
    with open(path, "rb") as f:
        return {"image": f.read(), "label": label}


def _litdata_pair(sample: dict[str, Any], decode: Decode) -> tuple[Any, int]:
    """Copy LitData's memoryview to bytes (workers cannot pickle memoryviews), then decode."""
    return decode(bytes(sample["image"])), int(sample["label"])


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    """Temporarily set environment variables (inherited by the processes `optimize` starts)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class LitDataPeer:
    """LitData: ``litdata.optimize`` into ~64 MB chunks under out/chunks, ``StreamingDataset`` to read."""

    name = "litdata"

    def __init__(self, chunk_bytes: str = "64MB", num_workers: int | None = None) -> None:
        self.chunk_bytes = chunk_bytes
        self.num_workers = num_workers or min(4, os.cpu_count() or 1)

    def unavailable(self) -> str | None:
        return _missing("litdata")

    def write(self, samples: list[Sample], out: Path) -> None:
        import litdata

        out.mkdir(parents=True, exist_ok=True)
        cache = out / "cache"
        # The optimizer's scratch dirs default to $TMPDIR/chunks and $TMPDIR/data; keep them inside out/.
        start_method = multiprocessing.get_start_method(allow_none=True)
        try:
            with _env(
                DATA_OPTIMIZER_CACHE_FOLDER=str(cache / "chunks"),
                DATA_OPTIMIZER_DATA_CACHE_FOLDER=str(cache / "data"),
            ):
                litdata.optimize(
                    fn=_litdata_item,
                    inputs=[(str(p), int(label)) for p, label in samples],
                    output_dir=str(out / "chunks"),
                    chunk_bytes=self.chunk_bytes,
                    num_workers=self.num_workers,
                    # Keep the input order (ImageFolder order) in the chunks.
                    keep_data_ordered=True,
                    reorder_files=False,
                    verbose=False,
                )
        finally:
            # optimize() forces the process-wide start method to "spawn"; later DataLoaders must not inherit that.
            multiprocessing.set_start_method(start_method, force=True)

    def dataset(self, out: Path, decode: Decode) -> tud.IterableDataset:
        import litdata

        # Local input: chunks are read in place; cache_dir only catches anything LitData wants to write.
        ds = litdata.StreamingDataset(
            str(out / "chunks"), cache_dir=str(out / "cache" / "read"), shuffle=False
        )
        return _MapIterable(ds, functools.partial(_litdata_pair, decode=decode), len(ds))


# ---------------------------------------------------------------- MosaicML Streaming


class _Stub:
    """Placeholder for a torchvision/transformers name streaming imports but we never call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("torchvision/transformers stand-in from benchmarks/peers.py: not available")


def _stub_function(*args: Any, **kwargs: Any) -> Any:
    """Placeholder for `torchvision.transforms.functional.to_tensor` (only used by streaming.vision)."""
    raise RuntimeError("torchvision stand-in from benchmarks/peers.py: not available")


# Exactly the names `import streaming` (0.13.0) pulls from these packages at import time.
_STREAMING_STUBS: dict[str, dict[str, Any]] = {
    "torchvision": {},
    "torchvision.datasets": {"VisionDataset": type("VisionDataset", (), {})},  # a base class there
    "torchvision.transforms": {},
    "torchvision.transforms.functional": {"to_tensor": _stub_function},
    "transformers": {},
    "transformers.feature_extraction_utils": {"BatchFeature": type("BatchFeature", (_Stub,), {})},
    "transformers.tokenization_utils_base": {"BatchEncoding": type("BatchEncoding", (_Stub,), {})},
    "transformers.models": {},
    "transformers.models.auto": {},
    "transformers.models.auto.tokenization_auto": {"AutoTokenizer": _Stub},
}


def _import_streaming() -> types.ModuleType:
    """Import MosaicML Streaming, standing in for torchvision/transformers only if they are absent."""
    if "streaming" in sys.modules:
        return sys.modules["streaming"]
    if importlib.util.find_spec("streaming") is None:
        raise ImportError("No module named 'streaming'")
    added: list[str] = []
    for root in ("torchvision", "transformers"):
        if importlib.util.find_spec(root) is not None:
            continue
        for name, attrs in _STREAMING_STUBS.items():
            if name.split(".")[0] == root:
                mod = types.ModuleType(name, "stand-in from benchmarks/peers.py")
                mod.__dict__.update(attrs)
                sys.modules[name] = mod
                added.append(name)
    try:
        return importlib.import_module("streaming")
    finally:
        # Streaming keeps its own references; later `import torchvision` fails honestly again.
        for name in added:
            sys.modules.pop(name, None)


def _streaming_unavailable() -> str | None:
    try:
        _import_streaming()
    except Exception as exc:
        return f"not installed (streaming: {type(exc).__name__}: {exc}); install with: {_RECIPE}"
    return None


def _load_streaming_iterable(blob: bytes) -> _MapIterable:
    """Unpickle a streaming-backed dataset in a spawned worker, after the stand-ins are in place."""
    _import_streaming()
    return pickle.loads(blob)


class _StreamingIterable(_MapIterable):
    """`_MapIterable` whose pickle imports streaming through `_import_streaming` first.

    A spawn/forkserver DataLoader worker unpickles the dataset in a fresh interpreter, where a bare
    `import streaming` would fail on the absent torchvision/transformers.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _load_streaming_iterable, (pickle.dumps(_MapIterable(self.inner, self.fn, self.length)),)


def _mds_pair(sample: dict[str, Any], decode: Decode) -> tuple[Any, int]:
    """Turn an MDS sample dict into (decode(image), label)."""
    return decode(sample["image"]), int(sample["label"])


class StreamingPeer:
    """MosaicML Streaming: ``MDSWriter`` shards (image: bytes, label: int), read locally with ``StreamingDataset``."""

    name = "streaming"

    def __init__(self, size_limit: int = 1 << 26, batch_size: int = 64) -> None:
        self.size_limit = size_limit  # MDSWriter's default shard size (64 MiB)
        self.batch_size = batch_size  # streaming partitions samples per batch; pass the loader's batch size

    def unavailable(self) -> str | None:
        return _streaming_unavailable()

    def write(self, samples: list[Sample], out: Path) -> None:
        streaming = _import_streaming()
        columns = {"image": "bytes", "label": "int"}
        with streaming.MDSWriter(out=str(out), columns=columns, size_limit=self.size_limit) as sink:
            for path, label in samples:
                sink.write({"image": Path(path).read_bytes(), "label": int(label)})

    def dataset(self, out: Path, decode: Decode) -> tud.IterableDataset:
        streaming = _import_streaming()
        ds = streaming.StreamingDataset(local=str(out), shuffle=False, batch_size=self.batch_size)
        return _StreamingIterable(ds, functools.partial(_mds_pair, decode=decode), len(ds))


PEERS: dict[str, Callable[[], Peer]] = {
    "imagefolder": ImageFolderPeer,
    "webdataset": WebDatasetPeer,
    "litdata": LitDataPeer,
    "streaming": StreamingPeer,
}
