"""``packload demo``: the whole job on a generated dataset, so a new user sees it work in minutes.

Generates ImageNet-like JPEGs, packs them into an LMDB file and a shards folder, verifies them,
reads the same epoch through a DataLoader from the original files and from each pack, reports the
speed-up (undecoded bytes; decode + resize + crop), then tunes the loader against an emulated GPU
step, says whether training would be input-bound, and ends with the commands to run on your own
images. Its files go into ``./demo-data`` unless told otherwise (the checkout's .gitignore names it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from packload.core.cpus import usable_cores
from packload.core.display import plural
from packload.core.errors import UsageError
from packload.core.storage import unwritable_reason
from packload.diagnose.measure import time_loader
from packload.diagnose.tune import format_report as format_tune_report
from packload.diagnose.tune_inputs import tune_with_fast_path
from packload.loaders.collate import collate_as_list, collate_uint8
from packload.loaders.crop import CenterCrop
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.folder import FolderImages
from packload.loaders.pack_loader import PackLoader
from packload.loaders.transforms import ResizeCenterCrop
from packload.loaders.verify import verify
from packload.packer.pipeline import pack
from packload.packer.synthetic import make_imagenet_like

DEMO_STEP_MS = 50.0  # the emulated GPU step of the demo's tune, said in its report


def _make_folder(root: Path) -> None:
    """Create the demo's folder, or one clear line saying why it cannot be."""
    why = unwritable_reason(root)
    if why:
        raise UsageError(f"--dir {root}: cannot be written there: {why}; give a folder on a disk you can write to")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--dir {root}: cannot create it ({exc.strerror}); give a folder you can write to") from None


def next_steps(root: Path) -> list[str]:
    """The report's end: how to do the same with your own images, and where the demo's files are."""
    return [
        "next, on your own ImageFolder tree (one sub-folder per class):",
        "    pack ./images ./data.lmdb",
        "    packload verify ./data.lmdb",
        "    packload tune ./data.lmdb --batch-size 256 --step-ms 120   # your batch size and GPU step time",
        "  and in your training script, two lines change:",
        "    from packload import PackedImageFolder",
        "    ds = PackedImageFolder(\"./data.lmdb\", transform=tf)   # was ImageFolder(\"./images\", transform=tf)",
        f"the demo's files (about {_size_mb(root):.0f} MB) are in {root.resolve()}; remove that folder when done",
    ]


def _size_mb(root: Path) -> float:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 1e6


def _rate(dataset: Any, collate: Any, workers: int, batch_size: int, sampler: Any = None) -> float:
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, sampler=sampler,
                        collate_fn=collate, persistent_workers=False)
    return time_loader(loader).samples_per_s


def run_demo(folder: str | os.PathLike[str], count: int = 2000, progress: bool = True,
             tune_budget_s: float = 20.0) -> dict[str, Any]:
    """Generate, pack, verify, load and tune; return every figure and a readable report."""
    if count < 100:
        raise UsageError(f"--count {count}: give at least 100 images so the timings mean something")
    root = Path(folder)
    _make_folder(root)
    images = root / "images"
    if not images.is_dir() or sum(1 for _ in images.rglob("*.jpg")) != count:
        make_imagenet_like(images, count=count, classes=10, seed=0, progress=progress)
    workers = min(4, usable_cores())
    packs = {}
    for name in ("demo.lmdb", "demo.shards"):
        packs[name] = pack(images, root / name, overwrite=True, progress=progress)
    checks = {name: verify(root / name, progress=False)["ok"] for name in packs}

    batch = 64
    crop = ResizeCenterCrop(160)
    rates: dict[str, dict[str, float]] = {"bytes": {}, "decode+crop": {}}
    # Undecoded bytes are pure I/O: read in the main process (num_workers=0), as the tuner would pick.
    rates["bytes"]["folder"] = _rate(FolderImages(images, output="bytes"), collate_as_list, 0, batch)
    rates["decode+crop"]["folder"] = _rate(FolderImages(images, transform=crop), collate_uint8, workers, batch)
    for name in packs:
        ds = PackedImageFolder(root / name, output="bytes")
        rates["bytes"][name] = _rate(ds, collate_as_list, 0, batch, ds.sampler(seed=0))
        ds = PackedImageFolder(root / name, transform=crop, decode_size=(160, 160))
        rates["decode+crop"][name] = _rate(ds, collate_uint8, workers, batch, ds.sampler(seed=0))
    # The fast path: whole batches built in threads of this process, no DataLoader workers.
    ds = PackedImageFolder(root / "demo.shards")
    with PackLoader(ds, batch, sampler=ds.sampler(seed=0), crop=CenterCrop(160), threads=workers) as fast:
        rates["decode+crop"]["PackLoader"] = time_loader(fast).samples_per_s

    report = [f"packload demo: {plural(count, 'ImageNet-like JPEG')} in {images}"]
    for name, summary in packs.items():
        report.append(f"  packed {name}: {plural(summary['records'], 'image')}, {summary['pack_bytes'] / 1e6:.1f} MB "
                      f"in {summary['seconds']:.1f} s ({summary['files_per_s']:.0f} files/s); "
                      f"verify: {'ok' if checks[name] else 'FAILED'}")
    report.append(f"  one epoch through a DataLoader (batch {batch}, samples/s, original files vs packs; bytes "
                  f"read in the main process, decoding on {plural(workers, 'worker')}):")
    for kind, by_source in rates.items():
        base = by_source["folder"]
        cells = ", ".join(f"{src} {rate:,.0f}" + ("" if src == "folder" else f" ({rate / base:.1f}x)")
                          for src, rate in by_source.items())
        report.append(f"    {kind:12s} {cells}")
    report.append(f"  (PackLoader: demo.shards with CenterCrop(160), batches built by {plural(workers, 'thread')} instead of "
                  "DataLoader workers; a warm page cache on a local disk is the smallest gap there is, on network "
                  "disks and cold caches the packs gain much more)")

    # Tune: which DataLoader settings, or PackLoader's threads, keep an (emulated) GPU step busy? The
    # whole report of `packload tune`: every trial a row, the pick and the verdict drawn from them.
    ds = PackedImageFolder(root / "demo.shards", transform=crop, decode_size=(160, 160))
    tuned = tune_with_fast_path(ds, batch, 160, step_ms=DEMO_STEP_MS, budget_s=tune_budget_s, progress=progress)
    report.append(f"  tune (GPU step emulated as {DEMO_STEP_MS:g} ms per batch of {batch}; `packload tune` for yours):")
    report += [f"  {line}" for line in format_tune_report(tuned)]
    report += next_steps(root)
    return {"folder": str(root), "count": count, "packs": packs, "verified": checks,
            "samples_per_s": rates, "workers": workers, "batch_size": batch, "tune": tuned.as_dict(),
            "report": report}
