"""Read speed: samples/s end to end through a DataLoader into batches, packload against the rest.

For each dataset and mode (``bytes`` undecoded; ``decoded`` for small PNGs; ``decoded+crop224``
for JPEGs: decode then ``ResizeCenterCrop(224)``), every contender reads the same number of
samples with the same batch size, at its best ``num_workers`` from a small sweep (warm cache),
then in interleaved repeats with a warm cache, and again with a cold cache (every file of every
format evicted before each run, the eviction checked with ``mincore``).

Contenders: packload LMDB and shards (``ds.sampler(shuffle=True, seed=0)``), the ``FolderImages``
baseline (ImageFolder-style, one ``open()`` per sample, PIL decode, shuffled), the same files read
with packload's codec (separates the storage gain from the codec gain), and the peers through
``benchmarks/peers.py``, which read in stored order (their adapters do not shuffle) and decode
with packload's codec. A run's time covers building the dataset and DataLoader, starting the
workers and every batch: ``samples_per_s`` is what a training epoch would see. Every run happens in
a fresh forked process, so no contender's leftovers (memory maps, caches) carry into the next run.

With ``slow=`` (``run.py --storage slow:MS[:MBPS]``) the folder and every format are read through a
``benchmarks/slowfs.py`` mount (:func:`slow_storage`), cold only: remounted before every run.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import io
import json
import multiprocessing
import os
import shutil
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, RandomSampler, Sampler

from benchmarks import cache, harness, report, slowfs
from benchmarks.peers import PEERS, ImageFolderPeer, Peer, StreamingPeer
from packload import CenterCrop, EncodeOptions, PackedImageFolder, PackLoader, collate_uint8, pack
from packload.diagnose.measure import time_loader
from packload.loaders.collate import collate_as_list
from packload.loaders.folder import FolderImages
from packload.loaders.transforms import ResizeCenterCrop

try:  # packload's whole-batch fast path (newer packload versions)
    from packload import batch_loader as _batch_loader
except ImportError:  # pragma: no cover - depends on the packload version
    _batch_loader = None

try:  # the codec packload itself uses for JPEG with output="numpy"
    import simplejpeg
except ImportError:  # pragma: no cover - depends on the environment
    simplejpeg = None

MODES = {"jpeg": ("bytes", "decoded+crop224"), "png": ("bytes", "decoded")}
PEER_NAMES = ("webdataset", "litdata", "streaming")
BASELINE = "FolderImages (baseline)"
CROP = ResizeCenterCrop(224)
DECODE_SIZE = (224, 224)
CHILD_TIMEOUT = 900.0  # seconds one read run may take before it counts as failed


# ---------------------------------------------------------------- decoders (module level: picklable)


def as_bytes(data: bytes) -> bytes:
    """Undecoded: the stored bytes."""
    return bytes(data)


def decode_rgb(data: bytes) -> np.ndarray:
    """HxWx3 uint8 with packload's codec: libjpeg-turbo (simplejpeg) for JPEG when installed, else PIL."""
    if simplejpeg is not None and data[:2] == b"\xff\xd8":
        try:
            return simplejpeg.decode_jpeg(data, colorspace="RGB")
        except ValueError:
            pass
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def decode_crop(data: bytes) -> np.ndarray:
    """Decode as :func:`decode_rgb`, then ``ResizeCenterCrop(224)``."""
    return CROP(decode_rgb(data))


# ---------------------------------------------------------------- contenders


@dataclass
class Contender:
    """One way of reading a dataset in one mode; ``build`` makes a fresh dataset and sampler."""

    name: str
    kind: str  # packload | baseline | files | peer
    build: Callable[[], tuple[Dataset, Sampler | None]]
    collate: Callable[[Any], Any]
    paths: list[Path]
    unavailable: str | None = None
    note: str = ""
    release: Callable[[Any], None] | None = None
    bounded: bool = True  # False when the mode's decode ceiling does not apply (a raw pack decodes nothing)
    loader: Callable[[Dataset, Sampler | None, int, int], DataLoader] | None = None  # else a plain DataLoader


def _close_reader(ds: Any) -> None:
    """Close the main process's pack reader, so no mapping keeps pages from being evicted."""
    if getattr(ds, "_reader", None) is not None:
        ds.reader().close()


def _whole_batches(ds: Any, sampler: Sampler | None, batch_size: int, workers: int,
                   encoded: bool = False) -> DataLoader:
    """packload's whole-batch loader (``packload.batch_loader``) with the same sampler and workers."""
    assert _batch_loader is not None
    return _batch_loader(ds, batch_size, sampler=sampler, num_workers=workers, persistent_workers=False,
                         encoded=encoded)


def _threads(crop: CenterCrop | None = None, encoded: bool = False) -> Callable[..., PackLoader]:
    """packload's ``PackLoader`` (batches built in threads of the reading process) with the same
    sampler; ``workers`` is its thread count where it decodes, ignored where it only copies."""
    def make(ds: Any, sampler: Sampler | None, batch_size: int, workers: int) -> PackLoader:
        copy_only = encoded or (crop is None and ds.encoding == "raw")
        return PackLoader(ds, batch_size, sampler=sampler, crop=crop, encoded=encoded,
                          threads=None if copy_only else max(1, workers))
    return make


def _seeded(ds: Dataset) -> Sampler:
    return RandomSampler(ds, generator=torch.Generator().manual_seed(0))


@dataclass
class Prepared:
    """Everything one dataset is read from: the folder, packload packs, peer outputs (or why not)."""

    source: Path
    kind: str
    packs: dict[str, Path]
    peers: dict[str, tuple[Peer | None, Path, str | None]]

    def all_paths(self) -> list[Path]:
        return [self.source, *self.packs.values(), *(out for _, out, _ in self.peers.values())]


def prepare(name: str, source: Path, kind: str, work: Path, *, peers: dict[str, Callable[[], Peer]] | None,
            batch_size: int, log: Callable[[str], None] | None = print) -> Prepared:
    """Write (once; kept under ``work/read``) every pack and peer output this dataset is read from."""
    base = work / "read" / name
    base.mkdir(parents=True, exist_ok=True)
    wanted = {"lmdb": (base / "keep.lmdb", EncodeOptions()), "shards": (base / "keep.shards", EncodeOptions())}
    if kind == "png":
        wanted["lmdb raw"] = (base / "raw.lmdb", EncodeOptions(encoding="raw"))
    packs = {}
    for label, (dst, options) in wanted.items():
        if not dst.exists():
            if log:
                log(f"read: packing {name} -> {dst.name}")
            pack(source, dst, options=options, progress=False)
        packs[label] = dst
    samples = [(Path(p), int(label)) for p, label in FolderImages(source).samples]
    prepared: dict[str, tuple[Peer | None, Path, str | None]] = {}
    files_peer = ImageFolderPeer()
    files_peer.write(samples, base / "files")
    prepared["files"] = (files_peer, base / "files", None)
    for peer_name in PEER_NAMES:
        out = base / peer_name
        if peers is None:
            prepared[peer_name] = (None, out, "peers not run (--no-peers)")
            continue
        factory = peers.get(peer_name)
        if factory is None:
            prepared[peer_name] = (None, out, "no adapter")
            continue
        peer = StreamingPeer(batch_size=batch_size) if factory is StreamingPeer else factory()
        reason = peer.unavailable()
        if reason is None and not (out / ".complete").exists():
            if log:
                log(f"read: writing {name} with {peer_name}")
            try:
                if out.exists():
                    shutil.rmtree(out)
                peer.write(samples, out)
                (out / ".complete").write_text(json.dumps({"samples": len(samples)}))
            except Exception as exc:  # reported with the reason, never dropped
                reason = f"write failed: {type(exc).__name__}: {exc}"
        prepared[peer_name] = (peer, out, reason)
    return Prepared(source, kind, packs, prepared)


def contenders(p: Prepared, mode: str) -> list[Contender]:
    """Every contender for one mode over a prepared dataset."""
    decoded = mode != "bytes"
    transform = CROP if mode == "decoded+crop224" else None
    collate = collate_uint8 if decoded else collate_as_list
    output = "numpy" if decoded else "bytes"
    rows: list[Contender] = []

    def packload(label: str, path: Path, decode_size: tuple[int, int] | None = None, note: str = "",
                 bounded: bool = True, whole_batches: bool = False,
                 loader: Callable[..., Any] | None = None, prefetch: bool = True) -> None:
        def build() -> tuple[Dataset, Sampler | None]:
            ds = PackedImageFolder(path, transform=transform, output=output, decode_size=decode_size)
            return ds, ds.sampler(shuffle=True, seed=0, prefetch=prefetch)

        rows.append(Contender(label, "packload", build, collate, [path], release=_close_reader,
                              note=note or "ds.sampler(shuffle=True, seed=0)", bounded=bounded,
                              loader=loader or (_whole_batches if whole_batches else None)))

    packload("packload lmdb", p.packs["lmdb"])
    packload("packload shards", p.packs["shards"])
    threads_note = "PackLoader: whole batches built in threads of the training process, no DataLoader"
    if mode == "bytes":
        prefetch_note = ("ds.sampler(shuffle=True, seed=0, prefetch=False): the sampler does not announce the next "
                         "window's records (the default does: posix_fadvise WILLNEED; nothing on FUSE/network storage)")
        packload("packload lmdb, no sampler prefetch", p.packs["lmdb"], prefetch=False, note=prefetch_note)
        packload("packload shards, no sampler prefetch", p.packs["shards"], prefetch=False, note=prefetch_note)
        packload("packload shards, PackLoader (encoded)", p.packs["shards"], loader=_threads(encoded=True),
                 note=threads_note + "; (data, offsets, labels) batches")
        if _batch_loader is not None:
            for backend in ("lmdb", "shards"):
                packload(f"packload {backend}, batch_loader (encoded)", p.packs[backend],
                         loader=functools.partial(_whole_batches, encoded=True),
                         note="packload.batch_loader(encoded=True): DataLoader workers hand over each batch's "
                              "stored bytes as (data, offsets, labels) tensors")
    elif mode == "decoded":
        packload("packload shards, PackLoader", p.packs["shards"], loader=_threads(), note=threads_note)
        if "lmdb raw" in p.packs:
            packload("packload lmdb raw, PackLoader", p.packs["lmdb raw"], loader=_threads(), bounded=False,
                     note=threads_note + "; raw pixels gathered from the map")
    else:
        packload("packload shards, PackLoader + CenterCrop(224)", p.packs["shards"],
                 loader=_threads(crop=CenterCrop(224)), bounded=False,
                 note=threads_note + "; reduced-scale decode and one resize of the kept square (pixels differ "
                 "slightly from ResizeCenterCrop)")
    if mode == "decoded+crop224":
        note = "decode_size=(224, 224): reduced-DCT JPEG decode, pixels differ slightly"
        packload("packload lmdb, decode_size 224", p.packs["lmdb"], DECODE_SIZE, note)
        packload("packload shards, decode_size 224", p.packs["shards"], DECODE_SIZE, note)
    if mode == "decoded" and "lmdb raw" in p.packs:
        packload("packload lmdb raw", p.packs["lmdb raw"], note="--encoding raw pack: no decode at read time",
                 bounded=False)
    if decoded and _batch_loader is not None:
        packload("packload lmdb, batch_loader", p.packs["lmdb"], whole_batches=True,
                 note="packload.batch_loader: whole batches built in the workers")
        if "lmdb raw" in p.packs:
            packload("packload lmdb raw, batch_loader", p.packs["lmdb raw"], bounded=False, whole_batches=True,
                     note="raw pack + batch_loader: pixels copied straight from the map")

    def baseline() -> tuple[Dataset, Sampler | None]:
        ds = FolderImages(p.source, transform=transform, output="pil" if decoded else "bytes")
        return ds, _seeded(ds)

    rows.append(Contender(BASELINE, "baseline", baseline, collate, [p.source],
                          note="one open() per sample, PIL decode, shuffled"))

    decode = {"bytes": as_bytes, "decoded": decode_rgb, "decoded+crop224": decode_crop}[mode]
    if decoded:
        files_peer, files_out, _ = p.peers["files"]

        def files() -> tuple[Dataset, Sampler | None]:
            assert files_peer is not None
            ds = files_peer.dataset(files_out, decode)
            return ds, _seeded(ds)

        rows.append(Contender("files + packload codec", "files", files, collate, [p.source],
                              note="same files, packload's decoder: the codec's share of the gain"))
    for peer_name in PEER_NAMES:
        peer, out, reason = p.peers[peer_name]

        def build_peer(peer: Peer | None = peer, out: Path = out) -> tuple[Dataset, Sampler | None]:
            assert peer is not None
            return peer.dataset(out, decode), None

        rows.append(Contender(peer_name, "peer", build_peer, collate, [out], unavailable=reason,
                              note="stored order (adapter does not shuffle), packload's codec"))
    return rows


# ---------------------------------------------------------------- one run


def read_once(c: Contender, workers: int, batch_size: int, budget: int) -> dict[str, Any]:
    """Build, load ``budget`` samples (rounded down to whole batches) and time it; figures as a dict.

    Runs in the calling process; :func:`read_in_child` is what the benchmark calls.
    """
    start = time.perf_counter()
    ds, sampler = c.build()
    length = len(ds)  # type: ignore[arg-type]
    batches = max(2, min(budget, length) // batch_size)
    if c.loader is not None:
        loader = c.loader(ds, sampler, batch_size, workers)
    else:
        loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=workers,
                            collate_fn=c.collate, persistent_workers=False)
    setup_s = time.perf_counter() - start
    timing = time_loader(loader, max_batches=batches - 1, warmup_batches=1)
    del loader
    if c.release is not None:
        c.release(ds)
    samples = timing.samples + min(batch_size, length)
    total = setup_s + timing.first_batch_s + timing.seconds
    return {"samples": samples, "samples_per_s": samples / total, "steady_samples_per_s": timing.samples_per_s,
            "first_batch_s": timing.first_batch_s, "setup_s": setup_s, "seconds": total, "workers": workers}


def _child(fn: Callable[[], dict[str, Any]], send: Any) -> None:
    try:
        with harness.PeakRSS() as peak:
            figures = fn()
        figures.update(peak.figures())
        send.send(("ok", figures))
    except BaseException as exc:
        send.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"))
    finally:
        send.close()
        os._exit(0)  # skip the parent's atexit handlers


def in_child(fn: Callable[[], dict[str, Any]], timeout: float = CHILD_TIMEOUT) -> dict[str, Any]:
    """Run ``fn`` in a forked child and return its figures plus the child tree's peak memory.

    Every run gets a fresh process, so nothing one contender leaves behind (an open memory map,
    a cache, a thread) can warm or slow the next run; the parent never reads the data itself.
    """
    # The objects alive now (torch and every library imported) move to the collector's permanent
    # generation, so a full collection in the child does not scan them: after importing torch one
    # takes ~80 ms here, and it landed at random inside some contenders' 100-200 ms runs and not
    # others' (a contender that allocated a few more objects paid it). Same for every contender.
    gc.freeze()
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(fn, send))  # not a daemon: DataLoader workers are its children
    proc.start()
    send.close()
    try:
        if not recv.poll(timeout):
            raise TimeoutError(f"run did not finish in {timeout:.0f} s")
        status, payload = recv.recv()
    except EOFError:
        status, payload = "error", f"child process died (exit code {proc.join(5) or proc.exitcode})"
    finally:
        if proc.is_alive():
            proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
        recv.close()
    if status != "ok":
        raise RuntimeError(payload)
    return payload


def read_in_child(c: Contender, workers: int, batch_size: int, budget: int) -> dict[str, Any]:
    """:func:`read_once` in a fresh forked process (see :func:`in_child`)."""
    return in_child(functools.partial(read_once, c, workers, batch_size, budget))


def _case(c: Contender, workers: int, batch_size: int, budget: int, name: str | None = None,
          setup: Callable[[], dict[str, Any] | None] | None = None) -> harness.Case:
    return harness.Case(name or c.name, functools.partial(read_in_child, c, workers, batch_size, budget),
                        "samples_per_s", setup=setup, skip_reason=c.unavailable, measure_rss=False,
                        info={"kind": c.kind, "note": c.note, "workers": workers, "bounded": c.bounded})


def _evictor(all_paths: list[Path], own: list[Path]) -> Callable[[], dict[str, Any]]:
    def setup() -> dict[str, Any]:
        others = [p for p in all_paths if p not in own]
        cache.evict(others)
        check = cache.evict_checked(own)
        everything = cache.residency(all_paths) if cache.supported() is None else {}
        check["all_formats_resident_after"] = everything.get("resident_fraction")
        return check

    return setup


def _remounter(fs: slowfs.SlowFS) -> Callable[[], dict[str, Any]]:
    """Cold cache on a slowfs mount: unmount and mount again, which empties every kernel cache of the
    mount (file pages, attributes, directory entries); the files under it stay cached locally, as on
    the far side of a network disk, so each request costs the configured latency and nothing more."""

    def setup() -> dict[str, Any]:
        fs.remount()
        return {"evicted": True, "method": "slowfs remount"}

    return setup


@contextlib.contextmanager
def slow_storage(p: Prepared, work: Path, name: str, latency_ms: float, mbps: float | None,
                 log: Callable[[str], None] | None = None) -> Any:
    """``p`` with its folder, packs and peer outputs read through a slowfs mount; unmounted on exit.

    The packs and peer outputs are written locally first (by :func:`prepare`, under ``work/read/NAME``);
    a link to the image folder is added there and that folder is mounted read-only at
    ``work/slowmnt/NAME``, so the images and every format sit behind the same slow disk.
    """
    base = work / "read" / name
    link = base / "images"
    if not link.exists():
        link.symlink_to(p.source.resolve(), target_is_directory=True)
    mnt = work / "slowmnt" / name
    fs = slowfs.SlowFS(base, mnt, latency_ms=latency_ms, mbps=mbps)
    # The ImageFolder-style files peer lists absolute paths: point them into the mount too.
    listing = base / "files-slow"
    listing.mkdir(exist_ok=True)
    files = FolderImages(p.source).samples
    (listing / "samples.json").write_text(json.dumps(
        [[str(mnt / "images" / Path(f).relative_to(p.source)), int(label)] for f, label in files]))
    peers = {k: (peer, mnt / out.name, reason) for k, (peer, out, reason) in p.peers.items()}
    peers["files"] = (p.peers["files"][0], mnt / listing.name, None)
    with fs:
        if log:
            log(f"read: {name} behind slowfs at {mnt} ({latency_ms} ms per request"
                + (f", {mbps} MB/s" if mbps else "") + ")")
        yield Prepared(mnt / "images", p.kind, {k: mnt / v.name for k, v in p.packs.items()}, peers), fs


def sweep(cs: Sequence[Contender], workers: Sequence[int], batch_size: int, budget: int,
          log: Callable[[str], None] | None,
          setup: Callable[[], dict[str, Any] | None] | None = None) -> dict[str, Any]:
    """One run per (contender, num_workers), interleaved (warm, or after ``setup``); the best of each."""
    cases = [_case(c, w, batch_size, budget, name=f"{c.name} @{w}", setup=setup) for w in workers for c in cs]
    results = harness.run_grid(cases, repeats=1, warmup=0, log=log)
    table: dict[str, Any] = {}
    for c in cs:
        mine = {w: r for w in workers for r in results if r["name"] == f"{c.name} @{w}"}
        rates = {w: (r["stats"]["median"] if r.get("stats") else None) for w, r in mine.items()}
        ok = {w: v for w, v in rates.items() if v is not None}
        errors = {w: r.get("error") for w, r in mine.items() if r.get("error")}
        table[c.name] = {"samples_per_s": rates, "best": max(ok, key=ok.__getitem__) if ok else None,
                         "errors": errors}
    return table


def _ratios(results: list[dict[str, Any]]) -> None:
    harness.add_ratios(results, BASELINE, key="vs_baseline")
    best_peer = harness.best_of(results, PEER_NAMES)
    for r in results:
        r["vs_best_peer"] = harness.ratio(r["stats"]["median"] if r.get("stats") else None,
                                          best_peer["stats"]["median"] if best_peer else None)
        r["best_peer"] = best_peer["name"] if best_peer else None


def ceiling(mode: str, cold: bool, limits: dict[str, Any] | None, mean_bytes: float) -> tuple[float | None, str]:
    """The machine's best possible samples/s for a mode (from machine.limits), and what bounds it."""
    if not limits:
        return None, ""
    all_cores = limits.get("all_cores", {})
    if mode == "decoded+crop224":
        keys = [k for k in all_cores if "crop224" in k and "draft" not in k]
        if keys:
            best = max(keys, key=all_cores.__getitem__)
            return all_cores[best], best.replace("all_cores_", "") + " × cores"
    if mode == "decoded" and "all_cores_png_decode_pil" in all_cores:
        return all_cores["all_cores_png_decode_pil"], "png_decode_pil × cores"
    if mode == "bytes" and cold and mean_bytes:
        mbps = limits.get("cold_read", {}).get("mb_per_s")
        if mbps:
            return mbps * 1e6 / mean_bytes, "cold sequential read MB/s ÷ mean file size"
    return None, ""


def run(datasets: dict[str, tuple[Path, str]], work: Path, *, peers: bool = True, repeats: int = 3,
        warmup: int = 1, workers: Sequence[int] = (0, 1, 2, 4), batch_size: int = 64,
        budgets: dict[str, int] | None = None, sweep_fraction: float = 0.5, cold: bool = True,
        limits: dict[str, Any] | None = None, peer_factories: dict[str, Callable[[], Peer]] | None = None,
        log: Callable[[str], None] | None = print, slow: dict[str, Any] | None = None,
        modes: Sequence[str] | None = None, only: Sequence[str] | None = None) -> dict[str, Any]:
    """Every dataset × mode: sweep num_workers, then warm and cold interleaved repeats; all figures.

    ``slow={"latency_ms": 2, "mbps": None}`` reads everything through a slowfs mount
    (:func:`slow_storage`): cold cache only (a remount before every run, the sweep included), since
    a warm page cache hides the storage entirely. ``modes`` keeps only those modes (``bytes``,
    ``decoded``, ``decoded+crop224``); ``only`` keeps the contenders whose name starts with one of
    its strings (the baseline and the peers named there still set the ratios)."""
    budgets = budgets or {}
    factories = (peer_factories if peer_factories is not None else PEERS) if peers else None
    if factories is not None and only:  # peers left out are not written either
        factories = {k: v for k, v in factories.items() if k.startswith(tuple(only))}
    out: dict[str, Any] = {
        "settings": {"repeats": repeats, "warmup": warmup, "workers_sweep": list(workers), "batch_size": batch_size,
                     "budgets": budgets, "sweep_fraction": sweep_fraction, "peers": peers,
                     "timing": "dataset + DataLoader construction, worker start and every batch",
                     "storage": {"slowfs": slow} if slow else "local",
                     "modes": list(modes) if modes else None, "only": list(only) if only else None},
        "datasets": {},
    }
    for name, (source, kind) in datasets.items():
        local = prepare(name, source, kind, work, peers=factories, batch_size=batch_size, log=log)
        with contextlib.ExitStack() as stack:
            if slow:
                prepared, fs = stack.enter_context(slow_storage(local, work, name, slow["latency_ms"],
                                                                slow.get("mbps"), log))
                cold_setup: Callable[[], dict[str, Any]] | None = _remounter(fs)
            else:
                prepared, fs, cold_setup = local, None, None
            out["datasets"][name] = _read_dataset(name, prepared, source, kind, workers, batch_size, budgets,
                                                  repeats, warmup, sweep_fraction, cold,
                                                  None if slow else limits, log, cold_setup, modes, only)
            if fs is not None:
                out["datasets"][name]["slowfs_stats_last_run"] = fs.stats().to_json()
                out["datasets"][name]["slowfs"] = fs.describe()  # its settings
    return out


def _read_dataset(name: str, prepared: Prepared, source: Path, kind: str, workers: Sequence[int], batch_size: int,
                  budgets: dict[str, int], repeats: int, warmup: int, sweep_fraction: float, cold: bool,
                  limits: dict[str, Any] | None, log: Callable[[str], None] | None,
                  cold_setup: Callable[[], dict[str, Any]] | None, modes: Sequence[str] | None = None,
                  only: Sequence[str] | None = None) -> dict[str, Any]:
    """One dataset's modes (see :func:`run`); ``cold_setup`` replaces warm runs and eviction (slowfs)."""
    files = FolderImages(source).samples
    mean_bytes = sum(Path(f).stat().st_size for f, _ in files) / max(1, len(files))
    entry: dict[str, Any] = {"source": str(source), "kind": kind, "files": len(files),
                             "mean_file_bytes": mean_bytes, "modes": {}}
    for mode in MODES[kind]:
        if modes and mode not in modes:
            continue
        budget = min(len(files), budgets.get(mode, len(files)))
        cs = [c for c in contenders(prepared, mode) if not only or c.name.startswith(tuple(only))]
        live = [c for c in cs if c.unavailable is None]
        if log:
            log(f"read: {name} {mode}: " + ("cold cache" if cold_setup else "warming the cache")
                + f", sweeping num_workers {list(workers)}")
        warm_state = cache.warm(prepared.all_paths()) if cold_setup is None else {"note": "slowfs: cold only"}
        swept = sweep(live, workers, batch_size, max(2 * batch_size, int(budget * sweep_fraction)), log,
                      setup=cold_setup)
        best = {c.name: swept[c.name]["best"] for c in live}
        mode_out: dict[str, Any] = {"budget": budget, "sweep": swept, "warm_cache": warm_state}
        for label, is_cold in (("warm", False), ("cold", True)):
            if (is_cold and not cold) or (cold_setup is not None and not is_cold):
                continue
            cases = []
            for c in cs:
                w = best.get(c.name)
                if c.unavailable is None and w is None:
                    errs = swept[c.name]["errors"]
                    c = Contender(c.name, c.kind, c.build, c.collate, c.paths, note=c.note, bounded=c.bounded,
                                  unavailable=f"failed at every num_workers: {next(iter(errs.values()), '?')}")
                setup = (cold_setup or _evictor(prepared.all_paths(), c.paths)) if is_cold else None
                cases.append(_case(c, w or 0, batch_size, budget, setup=setup))
            if log:
                log(f"read: {name} {mode} {label} cache")
            results = harness.run_grid(cases, repeats=repeats, warmup=0 if is_cold else warmup, log=log)
            _ratios(results)
            limit, bound = ceiling(mode, is_cold, limits, mean_bytes)
            for r in results:
                bounded = limit and r.get("stats") and r["info"].get("bounded", True)
                r["of_ceiling"] = r["stats"]["median"] / limit if bounded else None
                if is_cold:
                    evictions = [run.get("setup", {}) for run in r["runs"]]
                    r["cold_verified"] = bool(evictions) and all(e.get("evicted") for e in evictions)
            mode_out[label] = {"results": results, "ceiling": limit, "ceiling_bound": bound}
        entry["modes"][mode] = mode_out
    return entry


# ---------------------------------------------------------------- tables


def markdown(result: dict[str, Any], cache_state: str) -> str:
    """The read tables for one cache state (``warm`` or ``cold``): one per dataset and mode."""
    s = result["settings"]
    parts = []
    for name, d in result["datasets"].items():
        for mode, m in d["modes"].items():
            if cache_state not in m:
                continue
            block = m[cache_state]
            rows = []
            for r in block["results"]:
                med = r.get("medians", {})
                cold_cell = ""
                if cache_state == "cold" and r.get("stats"):
                    cold_cell = "yes" if r.get("cold_verified") else "NO (see JSON)"
                rows.append([
                    r["name"], r["info"].get("workers", "—"), report.spread(r["stats"]),
                    report.num(med.get("steady_samples_per_s")), report.num(med.get("first_batch_s"), 2),
                    report.times(r.get("vs_baseline")), report.times(r.get("vs_best_peer")),
                    f"{r['of_ceiling']:.0%}" if r.get("of_ceiling") else "—",
                    report.num(med.get("peak_pss_mb", med.get("peak_rss_mb"))), report.num(med.get("peak_pss_anon_mb")),
                    *([cold_cell] if cache_state == "cold" else []),
                    report.status(r) or r["info"].get("note", ""),
                ])
            headers = ["contender", "workers", "samples/s median [min–max]", "steady samples/s", "first batch s",
                       "× baseline", "× best peer", "of ceiling", _memory_header(block["results"]), "of which anon MB",
                       *(["evicted"] if cache_state == "cold" else []), "notes"]
            bound = f"; ceiling = {report.num(block['ceiling'])} samples/s ({block['ceiling_bound']})" \
                if block.get("ceiling") else ""
            best_peer = next((r["best_peer"] for r in block["results"] if r.get("best_peer")), None)
            parts.append(f"**{name} · {mode} · {cache_state} cache**: {m['budget']:,} samples per run of "
                         f"{d['files']:,}, batch {s['batch_size']}; best peer: {best_peer or 'none ran'}{bound}; "
                         f"load average {report.load_range(block['results'])}\n\n"
                         + report.table(headers, rows))
    slow = isinstance(s.get("storage"), dict)
    head = (f"Reading, samples/s end to end (dataset + DataLoader construction, worker start, every batch), "
            f"{s['repeats']} interleaved runs per contender at its best num_workers of {s['workers_sweep']} "
            + ("(swept cold too); the slowfs mount remounted before each run (its page cache empty)" if slow else
               "(swept with a warm cache)" + ("; every file of every format evicted before each cold run" if
                                             cache_state == "cold" else "")) + ". Each run in a fresh process; "
            "peak memory is summed over that process and its DataLoader workers (PSS: shared pages split; "
            "anon: without file-backed pages such as a mapped pack's page cache).")
    return head + "\n\n" + "\n\n".join(parts)


def _memory_header(results: list[dict[str, Any]]) -> str:
    pss = any(r.get("medians", {}).get("peak_pss_mb") is not None for r in results)
    return "peak PSS MB" if pss else "peak RSS MB (sum)"


def sweep_markdown(result: dict[str, Any]) -> str:
    """The num_workers sweep: samples/s per contender and worker count (warm cache, one run each)."""
    s = result["settings"]
    parts = []
    for name, d in result["datasets"].items():
        for mode, m in d["modes"].items():
            rows = [[c, *(report.num(v["samples_per_s"].get(w)) for w in s["workers_sweep"]), v["best"]]
                    for c, v in m["sweep"].items()]
            parts.append(f"**{name} · {mode}**\n\n" + report.table(
                ["contender", *(f"{w} workers" for w in s["workers_sweep"]), "best"], rows))
    state = "cold cache: slowfs remounted" if isinstance(s.get("storage"), dict) else "warm cache"
    return f"num_workers sweep ({state}, one run each, samples/s):\n\n" + "\n\n".join(parts)
