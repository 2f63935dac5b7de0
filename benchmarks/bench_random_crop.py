"""Training crops side by side: ``PackLoader(crop=RandomResizedCrop(224), flip=True)`` against the
drop-in DataLoader path with a PIL random-resized-crop and flip, on the same pack, in one run.

    python benchmarks/bench_random_crop.py PACK [PACK ...] [--rounds 5] [--batch-size 256] [--json]

Contenders, each reading whole epochs of the same pack in the sampler's order (``ds.sampler(seed=0)``):

* ``packloader``: ``PackLoader(ds, B, crop=RandomResizedCrop(224), flip=True)``, threads = usable cores;
* ``packloader-per-image``: the same with the compiled batch decoder switched off
  (``jpeg_kernel.set_enabled(False)`` during its epochs): JPEGs decoded one by one through simplejpeg,
  the route before the batch decoder (the same pixels);
* ``dataloader-pil``: ``DataLoader(PackedImageFolder(pack, transform=PilRandomResizedCrop(224)))`` with
  ``num_workers`` = usable cores (persistent) and ``collate_uint8``: torchvision's ``RandomResizedCrop``
  + ``RandomHorizontalFlip`` on PIL images (the box by ``get_params``' algorithm, then PIL's bilinear
  resize of the box, as ``F.resized_crop`` does for PIL images), without torchvision;
* ``dataloader-packload``: the same DataLoader with packload's ``RandomResizedCrop(224, flip=0.5)`` as
  the transform (the drop-in path of the same crops as ``packloader``).

Each contender is built once and warmed up for one epoch (workers started, page cache warm); then
rounds interleave the contenders (the order rotates each round), one epoch each, and the table
gives the median images/s over rounds and the ratio to ``dataloader-pil``. The machine's other
load moves every contender alike within a round, so the ratios are steadier than the rates.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from packload import PackedImageFolder, PackLoader, RandomResizedCrop  # noqa: E402
from packload.core import jpeg_kernel  # noqa: E402
from packload.diagnose.measure import usable_cores  # noqa: E402
from packload.loaders.collate import collate_uint8  # noqa: E402


class PilRandomResizedCrop:
    """torchvision's ``RandomResizedCrop(size)`` + ``RandomHorizontalFlip()`` on PIL images, from
    Python's ``random`` (a class, so spawned workers can pickle it); returns an HxWx3 uint8 array."""

    def __init__(self, size: int = 224, scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> None:
        self.size, self.scale, self.ratio = size, scale, ratio

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        area = height * width
        log_low, log_high = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            target = area * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(log_low, log_high))
            w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                return random.randint(0, height - h), random.randint(0, width - w), h, w
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif in_ratio > self.ratio[1]:
            w, h = round(height * self.ratio[1]), height
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image: Image.Image) -> np.ndarray:
        top, left, h, w = self.box(image.height, image.width)
        image = image.resize((self.size, self.size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
        if random.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.asarray(image)


class PerImage:
    """A ``PackLoader`` iterated with the compiled batch decoder off (JPEGs one by one)."""

    def __init__(self, loader: PackLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Any:
        jpeg_kernel.set_enabled(False)
        try:
            yield from self.loader
        finally:
            jpeg_kernel.set_enabled(True)

    def close(self) -> None:
        self.loader.close()


def contenders(pack: Path, batch_size: int, cores: int) -> dict[str, Any]:
    """Each contender as (loader, set_epoch) built once for the run."""
    made: dict[str, Any] = {}
    ds = PackedImageFolder(pack)
    fast = PackLoader(ds, batch_size, crop=RandomResizedCrop(224), flip=True, sampler=ds.sampler(seed=0),
                      threads=cores)
    made["packloader"] = (fast, fast.set_epoch)
    per_image = PackLoader(ds, batch_size, crop=RandomResizedCrop(224), flip=True, sampler=ds.sampler(seed=0),
                           threads=cores)
    made["packloader-per-image"] = (PerImage(per_image), per_image.set_epoch)
    for name, transform in (("dataloader-pil", PilRandomResizedCrop(224)),
                            ("dataloader-packload", RandomResizedCrop(224, flip=0.5))):
        dataset = PackedImageFolder(pack, transform=transform)
        sampler = dataset.sampler(seed=0)
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=cores,
                            collate_fn=collate_uint8, persistent_workers=True, prefetch_factor=2)

        def set_epoch(epoch: int, sampler: Any = sampler, dataset: PackedImageFolder = dataset) -> None:
            sampler.set_epoch(epoch)
            dataset.set_epoch(epoch)  # the persistent workers keep their copy: the crops' epoch stays 0
        made[name] = (loader, set_epoch)
    return made


def epoch_rate(loader: Any, set_epoch: Any, epoch: int) -> float:
    """Images per second over one epoch."""
    set_epoch(epoch)
    start = time.perf_counter()
    images = 0
    for batch, _labels in loader:
        images += len(batch)
    return images / (time.perf_counter() - start)


def bench(pack: Path, rounds: int, batch_size: int, cores: int) -> dict[str, Any]:
    made = contenders(pack, batch_size, cores)
    names = list(made)
    for name in names:  # warm-up epoch: workers started, pack in the page cache
        epoch_rate(*made[name], 0)
    rates: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        got = {name: epoch_rate(*made[name], r + 1) for name in order}
        for name in names:
            rates[name].append(got[name])
            ratios[name].append(got[name] / got["dataloader-pil"])
    for name in names:
        if hasattr(made[name][0], "close"):
            made[name][0].close()
    return {
        "pack": str(pack),
        "images": len(PackedImageFolder(pack)),
        "contenders": {name: {"median_images_per_s": statistics.median(rates[name]),
                              "rounds_images_per_s": [round(v, 1) for v in rates[name]],
                              "median_ratio_to_dataloader_pil": statistics.median(ratios[name])}
                       for name in names},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packs", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--cores", type=int, default=None, help="threads and workers (default: usable cores)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    cores = args.cores or usable_cores()
    torch.set_num_threads(1)
    results = [bench(pack, args.rounds, args.batch_size, cores) for pack in args.packs]
    if args.json:
        print(json.dumps({"cores": cores, "results": results}, indent=2))
        return 0
    for result in results:
        print(f"{result['pack']} ({result['images']} images, {cores} threads/workers, {args.rounds} rounds)")
        for name, figures in result["contenders"].items():
            print(f"  {name:22s} {figures['median_images_per_s']:8.0f} images/s   "
                  f"x{figures['median_ratio_to_dataloader_pil']:.2f} of dataloader-pil")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
