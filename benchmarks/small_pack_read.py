"""JPEG decode + crop to 224: packs against the ImageFolder-style loader on the original files.

    python benchmarks/small_pack_read.py ORIGINAL_FOLDER KEEP_PACK SMALL_PACK [--workers 2] [--rounds 3]

``KEEP_PACK`` holds the original JPEGs (``pack ... --encoding keep``), ``SMALL_PACK`` the same images
re-encoded at training resolution (``--encoding jpeg --max-side 256``). Contenders, interleaved
(A B C ..., A B C ...), same batch size (64) and worker count (DataLoader workers, or PackLoader
threads), warm page cache, shuffled:

* the ImageFolder-style loader (``FolderImages``, PIL) with ``ResizeCenterCrop(224)``: the baseline;
* each pack through the drop-in DataLoader path (``decode_size`` for reduced-scale decoding);
* each pack through ``PackLoader`` with ``CenterCrop(224)``.

The machine's ceiling is measured alongside: the baseline's pipeline (PIL decode + resize + crop)
and packload's (libjpeg-turbo at reduced scale + ``CenterCrop``) on in-memory bytes, one process,
times the usable cores.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from benchmarks.machine import rate, sample_files  # noqa: E402
from packload import CenterCrop, PackedImageFolder, PackLoader, collate_uint8  # noqa: E402
from packload.core.cpus import usable_cores  # noqa: E402
from packload.diagnose.measure import time_loader  # noqa: E402
from packload.loaders.decode import decode_array  # noqa: E402
from packload.loaders.folder import FolderImages  # noqa: E402
from packload.loaders.transforms import ResizeCenterCrop  # noqa: E402

BATCH = 64


def _contenders(folder: str, keep: str, small: str, workers: int) -> dict[str, Callable[[], Any]]:
    resize_crop, crop = ResizeCenterCrop(224), CenterCrop(224)

    def drop_in(pack: str) -> DataLoader:
        ds = PackedImageFolder(pack, transform=resize_crop, decode_size=(224, 224))
        return DataLoader(ds, batch_size=BATCH, sampler=ds.sampler(seed=0), num_workers=workers,
                          collate_fn=collate_uint8)

    def fast(pack: str) -> PackLoader:
        ds = PackedImageFolder(pack)
        return PackLoader(ds, BATCH, sampler=ds.sampler(seed=0), crop=crop, threads=workers)

    return {
        "original files, FolderImages + ResizeCenterCrop(224) (baseline)": lambda: DataLoader(
            FolderImages(folder, transform=resize_crop), batch_size=BATCH, shuffle=True, num_workers=workers,
            collate_fn=collate_uint8),
        "keep pack, drop-in DataLoader, decode_size=(224, 224)": lambda: drop_in(keep),
        "keep pack, PackLoader + CenterCrop(224)": lambda: fast(keep),
        "max-side-256 pack, drop-in DataLoader, decode_size=(224, 224)": lambda: drop_in(small),
        "max-side-256 pack, PackLoader + CenterCrop(224)": lambda: fast(small),
    }


def ceilings(folder: Path, cores: int) -> dict[str, float]:
    """Images/s on in-memory bytes of the original JPEGs, one process, times ``cores``."""
    items = sample_files(folder, (".jpg", ".jpeg"), 200)
    resize_crop, crop = ResizeCenterCrop(224), CenterCrop(224)

    def pil(data: bytes) -> np.ndarray:
        return resize_crop(Image.open(io.BytesIO(data)).convert("RGB"))

    def packload(data: bytes) -> np.ndarray:
        width, height = Image.open(io.BytesIO(data)).size
        pixels = decode_array(data, "JPEG", "RGB", width, height, crop.min_decode_size(height, width))
        return crop(pixels)

    return {"PIL decode + ResizeCenterCrop(224)": rate(pil, items) * cores,
            "libjpeg-turbo reduced-scale decode + CenterCrop(224)": rate(packload, items) * cores}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("keep_pack")
    parser.add_argument("small_pack")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=40, help="batches timed per run (after one warm-up batch)")
    args = parser.parse_args(argv)
    contenders = _contenders(args.folder, args.keep_pack, args.small_pack, args.workers)
    runs: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, make in contenders.items():
            loader = make()
            runs[name].append(time_loader(loader, max_batches=args.batches).samples_per_s)
            if isinstance(loader, PackLoader):
                loader.close()
            time.sleep(0.5)  # let the previous run's workers exit
    cores = usable_cores()
    limits = ceilings(Path(args.folder), cores)
    base = statistics.median(runs[next(iter(runs))])
    print(f"{args.rounds} interleaved rounds of {args.batches} batches of {BATCH}, {args.workers} workers/threads, "
          f"{cores} usable cores\n")
    print("| contender | images/s, median [min–max] | × baseline |")
    print("|---|--:|--:|")
    for name, values in runs.items():
        median = statistics.median(values)
        print(f"| {name} | {median:,.0f} [{min(values):,.0f}–{max(values):,.0f}] | {median / base:.2f}× |")
    print("\n| ceiling: in-memory bytes, one process × cores | images/s |")
    print("|---|--:|")
    for name, value in limits.items():
        print(f"| {name} | {value:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
