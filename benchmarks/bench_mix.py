"""A mixed epoch against a single pack of the same records: what ``packload.mix`` costs.

    python benchmarks/bench_mix.py [--data DIR] [--count 4000] [--rounds 5] [--paired 3]
                                   [--batch-size 256] [--crop 224] [--threads N] [--json]

Two halves of one ImageNet-like set (``packer/synthetic.py``, 200-500 px JPEGs) are packed apart
(``a.shards``, ``b.shards``) and merged into one pack of the same records (``all.shards``,
``packload.merge``). Contenders, each one epoch of ``--count`` images with
``RandomResizedCrop(crop)`` and flips through ``PackLoader``:

* ``single``: ``PackLoader(all, B, sampler=all.sampler(seed=0))``;
* ``mix``: ``PackLoader(mix([a, b], weights=[0.5, 0.5]), B)``: every batch drawn from both packs,
  each pack building its part, the parts put back in the sampler's order.

Two measurements, each after one warm-up epoch per contender (page cache warm, threads started):

* **rounds**: whole epochs with ``--threads`` threads (default: usable cores), the contenders
  interleaved (the order alternating each round): each one's median images/s, and the median over
  rounds of the per-round ratio mix/single, by the wall clock and by the process's CPU time
  (images per CPU-second: what an image costs, which other load on a shared machine disturbs less);
* **paired**: epochs built in the loop's own thread (``threads=0``), the two loaders' batches taken
  in turn (single, mix, mix, single, ...) and each batch timed, so that whatever else the machine
  does falls on both alike: the ratio of the two epochs' summed times, per epoch, and its median.

Target: a ratio of 0.95 or more.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packload import PackedImageFolder, PackLoader, RandomResizedCrop, merge, mix, pack  # noqa: E402
from packload.core.cpus import usable_cores  # noqa: E402
from packload.packer.synthetic import make_imagenet_like  # noqa: E402

NAMES = ("single", "mix")


def make_packs(data: Path, count: int) -> dict[str, Path]:
    """The two halves packed apart and the merged pack of both (made once per count; reused)."""
    data = data / f"count-{count}"
    packs = {name: data / f"{name}.shards" for name in ("a", "b", "all")}
    if all((path / "manifest.json").exists() for path in packs.values()):
        return packs
    for seed, name in enumerate(("a", "b")):
        source = data / f"src-{name}"
        if not source.exists():
            make_imagenet_like(source, count=count // 2, classes=10, seed=seed, progress=False)
        pack(source, packs[name], overwrite=True, progress=False)
    merge(packs["all"], [packs["a"], packs["b"]], overwrite=True, progress=False)
    return packs


def loaders(packs: dict[str, Path], batch_size: int, crop: int, threads: int) -> dict[str, PackLoader]:
    """The two contenders over the same records, the same crop and flips."""
    train = RandomResizedCrop(crop, flip=0.5)
    whole = PackedImageFolder(packs["all"])
    halves = mix([PackedImageFolder(packs["a"]), PackedImageFolder(packs["b"])], [0.5, 0.5])
    return {"single": PackLoader(whole, batch_size, sampler=whole.sampler(seed=0), crop=train, threads=threads),
            "mix": PackLoader(halves, batch_size, sampler=halves.sampler(seed=0), crop=train, threads=threads)}


def epoch_rates(loader: PackLoader, epoch: int) -> tuple[float, float]:
    """Images per second over one whole epoch, by the wall clock and per CPU-second of the process."""
    loader.set_epoch(epoch)
    started, cpu, images = time.perf_counter(), time.process_time(), 0
    for batch, _ in loader:
        images += batch.shape[0]
    return images / (time.perf_counter() - started), images / (time.process_time() - cpu)


def rounds(contenders: dict[str, PackLoader], count: int) -> dict[str, Any]:
    """``count`` interleaved rounds of one epoch each: rates and per-round ratios mix/single."""
    for loader in contenders.values():
        epoch_rates(loader, 0)
    wall: dict[str, list[float]] = {name: [] for name in NAMES}
    cpu: dict[str, list[float]] = {name: [] for name in NAMES}
    for number in range(count):
        for name in NAMES if number % 2 == 0 else reversed(NAMES):
            rate, cpu_rate = epoch_rates(contenders[name], number + 1)
            wall[name].append(rate)
            cpu[name].append(cpu_rate)
    ratios = [m / s for m, s in zip(wall["mix"], wall["single"], strict=True)]
    cpu_ratios = [m / s for m, s in zip(cpu["mix"], cpu["single"], strict=True)]
    return {"rates": wall, "cpu_rates": cpu, "ratios": ratios, "ratio": statistics.median(ratios),
            "cpu_ratios": cpu_ratios, "cpu_ratio": statistics.median(cpu_ratios),
            "median": {name: statistics.median(wall[name]) for name in NAMES},
            "cpu_median": {name: statistics.median(cpu[name]) for name in NAMES}}


def paired(contenders: dict[str, PackLoader], count: int) -> dict[str, Any]:
    """``count`` epochs in the loop's thread, batches of the two contenders taken in turn."""
    ratios, cpu_ratios = [], []
    for epoch in range(count + 1):  # epoch 0 warms up
        for loader in contenders.values():
            loader.set_epoch(epoch)
        batches = {name: iter(contenders[name]) for name in NAMES}
        wall = dict.fromkeys(NAMES, 0.0)
        cpu = dict.fromkeys(NAMES, 0.0)
        for number in range(min(len(loader) for loader in contenders.values())):
            for name in NAMES if number % 2 == 0 else reversed(NAMES):
                started, cpu_started = time.perf_counter(), time.process_time()
                next(batches[name])
                wall[name] += time.perf_counter() - started
                cpu[name] += time.process_time() - cpu_started
        if epoch:
            ratios.append(wall["single"] / wall["mix"])
            cpu_ratios.append(cpu["single"] / cpu["mix"])
    return {"ratios": ratios, "ratio": statistics.median(ratios), "cpu_ratios": cpu_ratios,
            "cpu_ratio": statistics.median(cpu_ratios)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("bench-data/mix"), help="where the images and packs go")
    parser.add_argument("--count", type=int, default=4000, help="images in all (half per pack)")
    parser.add_argument("--rounds", type=int, default=5, help="epochs per contender with threads (0: none)")
    parser.add_argument("--paired", type=int, default=3, help="epochs per contender in one thread (0: none)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--crop", type=int, default=224, help="side of the RandomResizedCrop")
    parser.add_argument("--threads", type=int, default=None, help="PackLoader threads (default: usable cores)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    packs = make_packs(args.data, args.count)
    threads = usable_cores() if args.threads is None else args.threads
    result: dict[str, Any] = {"images": args.count // 2 * 2, "batch_size": args.batch_size, "crop": args.crop,
                              "threads": threads}
    if args.rounds:
        contenders = loaders(packs, args.batch_size, args.crop, threads)
        result["rounds"] = rounds(contenders, args.rounds)
        for loader in contenders.values():
            loader.close()
    if args.paired:
        result["paired"] = paired(loaders(packs, args.batch_size, args.crop, 0), args.paired)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['images']} images, batch {args.batch_size}, RandomResizedCrop({args.crop}) + flip")
    if "rounds" in result:
        found = result["rounds"]
        print(f"rounds ({threads} threads, {args.rounds} epochs each):")
        for name in NAMES:
            print(f"  {name:<7} {found['median'][name]:8.0f} images/s, "
                  f"{found['cpu_median'][name]:8.0f} images per CPU-second (medians)")
    for kind in ("rounds", "paired"):
        if kind in result:
            for label, key in (("wall clock", "ratio"), ("CPU time", "cpu_ratio")):
                per_epoch = " ".join(f"{ratio:.3f}" for ratio in result[kind][key + "s"])
                print(f"  {kind}: mix / single by {label}: {result[kind][key]:.3f} (median; each {per_epoch})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
