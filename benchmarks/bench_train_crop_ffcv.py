"""Training crops against FFCV: random-resized crop 224 + horizontal flip, packload's fast path, FFCV's
pipeline and the drop-in DataLoader path, on the same images, side by side in one run.

    .venv-peers/bin/python benchmarks/bench_train_crop_ffcv.py [--data bench-data/imagenet]
        [--out bench-results/train-crop] [--limit N] [--rounds 3] [--epochs 1] [--cases jpeg,raw,keep]
        [--loaders packloader,packloader-whole,packloader-fastidct,ffcv,dropin-pil] [--crop random|center] [--reuse]

Writes (each in a forked process, 2 workers; timed once, for the record, not the point here):

* ``jpeg``: a packload pack ``--encoding jpeg --max-side 256`` (quality 90, the CLI's default) and an
  FFCV ``jpg`` write with ``max_resolution=256``, ``jpeg_quality=90``;
* ``raw``: ``--encoding raw --max-side 256`` and FFCV's ``raw`` write with ``max_resolution=256``;
* ``keep`` (not by default): ``--encoding keep``, the photos as they are, packload only (no FFCV write).

Contenders (batch 256, 2 threads/workers, random order, every record each epoch, warm page cache):

* ``packloader``: ``PackLoader(ds, 256, crop=RandomResizedCrop(224, scale=(0.08, 1.0), ratio=(3/4, 4/3)),
  flip=True, sampler=ds.sampler(seed=0), threads=2)``: BCHW uint8 batches (channels-last memory);
* ``packloader-whole``: the same, its batch decoder decoding each JPEG whole before cropping
  (``jpeg_kernel.set_crop_first(False)``): what decoding only the crop's region saves;
* ``packloader-fastidct`` (not by default): the same as ``packloader`` with ``fast_idct=True``, the
  fast integer IDCT that FFCV's decoder uses (``TJFLAG_FASTDCT``): the two at the same precision;
* ``ffcv``: ``Loader(beton, 256, num_workers=2, order=RANDOM, os_cache=True, drop_last=False)`` with
  ``[RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip(), ToTensor(), ToTorchImage()]``
  (FFCV's ImageNet training pipeline without ``ToDevice``/``NormalizeImage``): the same BCHW
  channels-last uint8 view;
* ``dropin-pil``: ``DataLoader(PackedImageFolder(pack, transform=PilRandomResizedCrop(224)),
  num_workers=2, persistent_workers=True, collate_fn=collate_uint8)``: torchvision's
  ``RandomResizedCrop`` + ``RandomHorizontalFlip`` algorithm on PIL images
  (``benchmarks/bench_random_crop.py``).

``--crop center`` measures the validation crop instead, on the same packs: ``PackLoader(ds, 256,
crop=CenterCrop(224))`` against FFCV's ``CenterCropRGBImageDecoder((224, 224), ratio=224/256)`` (+
``ToTensor(), ToTorchImage()``) and the drop-in path with torchvision's ``Resize(256) +
CenterCrop(224)`` on PIL images (``ResizeCenterCrop(224)``); no flips.

Every contender runs in a fresh forked process per round (as ``bench_crown.py`` does): it is built,
reads one warm-up epoch (FFCV's numba compiles its pipeline there, DataLoader workers start), then
``--epochs`` measured epochs whose median is that round's rate. Rounds interleave the contenders, the
order rotating each round; the table gives median [min–max] over rounds, and the per-round ratios
(median [min–max]) to FFCV and to the drop-in path. ``--limit N`` uses N images spread evenly over
the folder's ImageFolder order (symbolic links in the work folder). Results go to
``OUT/train-crop.json`` and ``OUT/train-crop.md``; packs and ``.beton`` files to ``OUT/work``.
Timings on a shared machine are noisy; read the ratios, which are steadier than the rates.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import os
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from torch.utils.data import DataLoader  # noqa: E402

from benchmarks import ffcv_peer, harness, report  # noqa: E402
from benchmarks.bench_random_crop import PilRandomResizedCrop  # noqa: E402
from benchmarks.bench_read import in_child  # noqa: E402
from packload import (  # noqa: E402
    CenterCrop,
    EncodeOptions,
    PackedImageFolder,
    PackLoader,
    RandomResizedCrop,
    collate_uint8,
    pack,
)
from packload.loaders.transforms import ResizeCenterCrop  # noqa: E402

SIZE = 224
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
CASES = ("jpeg", "raw", "keep")  # keep: the photos as they are (full size), packload only
DEFAULT_CASES = ("jpeg", "raw")
LOADERS = ("packloader", "packloader-whole", "packloader-fastidct", "ffcv", "dropin-pil")
CROPS = ("random", "center")  # RandomResizedCrop(224) + flip, or CenterCrop(224)
LABELS = {"packloader": "packload PackLoader", "packloader-whole": "packload PackLoader, whole-image decoding",
          "packloader-fastidct": "packload PackLoader, fast IDCT",
          "ffcv": "FFCV", "dropin-pil": "drop-in DataLoader, PIL"}
RATIO_BASES = ("ffcv", "dropin-pil", "packloader-whole")
CROP_LABELS = {"random": "RRC+flip", "center": "CenterCrop"}


def label(name: str, crop: str = "random") -> str:
    return f"{LABELS[name]} {CROP_LABELS[crop]}"


def _epochs(make: Callable[[], Any], epochs: int, set_epoch: Callable[[Any, int], None]) -> dict[str, Any]:
    """Build ``make()``'s loader, read 1 warm-up + ``epochs`` epochs; the median rate of the latter."""
    start = time.perf_counter()
    loader = make()
    setup_s = time.perf_counter() - start
    times, counts, first = [], [], {}
    for epoch in range(1 + epochs):
        set_epoch(loader, epoch)
        t0 = time.perf_counter()
        n = 0
        for images, _labels in loader:
            n += images.shape[0]
            if not first:
                first = {"batch_shape": list(images.shape), "batch_dtype": str(images.dtype),
                         "batch_strides": list(images.stride())}
        times.append(time.perf_counter() - t0)
        counts.append(n)
    rates = [n / t for n, t in zip(counts[1:], times[1:], strict=True)]
    if hasattr(loader, "close"):
        loader.close()
    return {"images_per_s": statistics.median(rates), "epoch_images_per_s": rates, "first_epoch_s": times[0],
            "images_per_epoch": counts[0], "setup_s": setup_s, **first}


def read_packloader(pack_path: str, batch_size: int, threads: int, epochs: int, crop: str = "random",
                    whole: bool = False, fast_idct: bool = False) -> dict[str, Any]:
    """PackLoader's training (or centre) crop; ``whole``: its batch decoder decoding every image whole,
    then cropping (``jpeg_kernel.set_crop_first(False)``), to measure what decoding only the crop saves;
    ``fast_idct``: the fast integer IDCT, FFCV's."""
    from packload.core import jpeg_kernel

    jpeg_kernel.set_crop_first(not whole)  # in this child process only

    def make() -> PackLoader:
        ds = PackedImageFolder(pack_path)
        if crop == "center":
            return PackLoader(ds, batch_size, crop=CenterCrop(SIZE), sampler=ds.sampler(seed=0), threads=threads,
                              fast_idct=fast_idct)
        return PackLoader(ds, batch_size, crop=RandomResizedCrop(SIZE, scale=SCALE, ratio=RATIO), flip=True,
                          sampler=ds.sampler(seed=0), threads=threads, fast_idct=fast_idct)
    return _epochs(make, epochs, lambda loader, e: loader.set_epoch(e))


def read_dropin_pil(pack_path: str, batch_size: int, threads: int, epochs: int, crop: str = "random") -> dict[str, Any]:
    def make() -> DataLoader:
        transform = ResizeCenterCrop(SIZE) if crop == "center" else PilRandomResizedCrop(SIZE, SCALE, RATIO)
        ds = PackedImageFolder(pack_path, transform=transform)
        return DataLoader(ds, batch_size=batch_size, sampler=ds.sampler(seed=0), num_workers=threads,
                          collate_fn=collate_uint8, persistent_workers=threads > 0)
    return _epochs(make, epochs, lambda loader, e: loader.sampler.set_epoch(e))


def read_ffcv(beton: str, batch_size: int, threads: int, epochs: int, crop: str = "random") -> dict[str, Any]:
    """FFCV's training pipeline on CPU (FFCV reshuffles each epoch itself, from ``seed`` and the epoch), or
    its validation pipeline's centre crop (``crop="center"``)."""
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage

    if crop == "center":
        image = [CenterCropRGBImageDecoder((SIZE, SIZE), ratio=ffcv_peer.CROP_RATIO), ToTensor(), ToTorchImage()]
    else:
        image = [RandomResizedCropRGBImageDecoder((SIZE, SIZE), scale=SCALE, ratio=RATIO), RandomHorizontalFlip(),
                 ToTensor(), ToTorchImage()]

    def make() -> Any:
        return Loader(beton, batch_size=batch_size, num_workers=threads, order=OrderOption.RANDOM, os_cache=True,
                      drop_last=False, seed=0, pipelines={"image": image, "label": [IntDecoder(), ToTensor()]})
    return _epochs(make, epochs, lambda loader, e: None)


def subset(source: Path, limit: int, dest: Path) -> Path:
    """``limit`` images of ``source`` spread evenly over its ImageFolder order, as links under ``dest``."""
    items = ffcv_peer.samples(source)
    if limit >= len(items):
        return source
    shutil.rmtree(dest, ignore_errors=True)
    root = source.resolve()
    step = len(items) / limit
    for k in range(limit):
        path = Path(items[int(k * step)][0])
        link = dest / path.relative_to(root)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(path)
    return dest


def _write_packload(source: Path, dst: Path, encoding: str, threads: int) -> dict[str, Any]:
    shutil.rmtree(dst, ignore_errors=True)
    start = time.perf_counter()
    options = EncodeOptions(encoding="keep") if encoding == "keep" else \
        EncodeOptions(encoding=encoding, quality=90, max_side=256)
    summary = pack(source, dst, options=options, workers=threads, progress=False)
    return {"seconds": time.perf_counter() - start, "bytes": report.dir_bytes(dst), "samples": summary["records"]}


def _write_ffcv(source: Path, dst: Path, mode: str, threads: int) -> dict[str, Any]:
    dst.unlink(missing_ok=True)
    return ffcv_peer.write(source, dst, mode=mode, max_resolution=256, quality=90, workers=threads)


def _stats(values: list[float]) -> dict[str, Any]:
    return harness.summarize(values) if values else {"n": 0, "median": None}


def run(source: Path, work: Path, *, rounds: int, epochs: int, batch_size: int, threads: int,
        cases: tuple[str, ...] = DEFAULT_CASES, loaders: tuple[str, ...] = LOADERS, reuse: bool = False,
        crop: str = "random", log: Callable[[str], None] = print) -> dict[str, Any]:
    ffcv_missing = ffcv_peer.unavailable() if "ffcv" in loaders else "not measured (--loaders)"
    if ffcv_missing is not None:
        loaders = tuple(name for name in loaders if name != "ffcv")
    results: dict[str, Any] = {"ffcv": ffcv_missing or f"ffcv {ffcv_peer.version()}", "loaders": list(loaders),
                               "crop": crop, "cases": []}
    work.mkdir(parents=True, exist_ok=True)
    for case in cases:
        pack_path, beton = work / f"imagenet-{case}256.shards", work / f"imagenet-{case}256.beton"
        if case == "keep":
            pack_path = work / "imagenet-keep.shards"
        case_loaders = tuple(name for name in loaders if not (case == "keep" and name == "ffcv"))  # packload only
        writes: dict[str, Any] = {}
        if not (reuse and pack_path.exists()):
            log(f"{case}: packing {pack_path.name}")
            writes["packload"] = in_child(functools.partial(_write_packload, source, pack_path, case, threads),
                                          timeout=3600)
        if "ffcv" in case_loaders and not (reuse and beton.exists()):
            log(f"{case}: writing {beton.name}")
            writes["ffcv"] = in_child(functools.partial(_write_ffcv, source, beton, "jpg" if case == "jpeg" else "raw",
                                                        threads), timeout=3600)
        readers = {"packloader": functools.partial(read_packloader, str(pack_path), batch_size, threads, epochs, crop),
                   "packloader-whole": functools.partial(read_packloader, str(pack_path), batch_size, threads, epochs,
                                                         crop, whole=True),
                   "packloader-fastidct": functools.partial(read_packloader, str(pack_path), batch_size, threads,
                                                            epochs, crop, fast_idct=True),
                   "ffcv": functools.partial(read_ffcv, str(beton), batch_size, threads, epochs, crop),
                   "dropin-pil": functools.partial(read_dropin_pil, str(pack_path), batch_size, threads, epochs, crop)}
        names = [name for name in LOADERS if name in case_loaders]
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                try:
                    runs[name].append(in_child(readers[name], timeout=3600))
                    log(f"  {case} round {r + 1}: {name}: {runs[name][-1]['images_per_s']:,.0f} img/s")
                except (RuntimeError, TimeoutError) as exc:
                    runs[name].append({"error": str(exc)[:2000]})
                    log(f"  {case} round {r + 1}: {name}: error {str(exc)[:200]}")
        per_round = [{name: runs[name][r].get("images_per_s") for name in names} for r in range(rounds)]
        figures: dict[str, Any] = {}
        for name in names:
            rates = [got[name] for got in per_round if got[name]]
            entry: dict[str, Any] = {"images_per_s": _stats(rates), "runs": runs[name]}
            for base in RATIO_BASES:
                if base in names:
                    entry[f"ratio_to_{base}"] = _stats([got[name] / got[base] for got in per_round
                                                        if got[name] and got[base]])
            figures[name] = entry
        images = next((run_["images_per_epoch"] for name in names for run_ in runs[name] if "images_per_epoch" in run_),
                      None)
        results["cases"].append({"case": case, "pack": str(pack_path), "beton": str(beton), "images": images,
                                 "writes": writes, "loaders": figures})
    return results


def _ratio(stats: dict[str, Any] | None) -> str:
    if not stats or not stats.get("n"):
        return "–"
    if stats["n"] == 1:
        return f"{stats['median']:.2f}×"
    return f"{stats['median']:.2f}× [{stats['min']:.2f}–{stats['max']:.2f}]"


def markdown(results: dict[str, Any]) -> str:
    lines = [f"FFCV: {results['ffcv']}. {results.get('command', '')}", "",
             f"{results.get('date', '')}; {results.get('rounds')} interleaved rounds × {results.get('epochs')} "
             f"measured epoch(s) after a warm-up epoch; batch {results.get('batch_size')}, "
             f"{results.get('threads')} threads/workers; load average {results.get('loadavg_start')} at the start, "
             f"{results.get('loadavg_end')} at the end.", ""]
    rows = []
    for case in results["cases"]:
        for name, entry in case["loaders"].items():
            stats = entry["images_per_s"]
            rows.append([f"{case['case']} ({case['images'] or 0:,} images)", label(name, results.get("crop", "random")),
                         report.spread(stats) if stats["n"] else "error",
                         *(_ratio(entry.get(f"ratio_to_{base}")) for base in RATIO_BASES)])
    lines.append(report.table(["case", "loader", "images/s, median [min–max]", "× FFCV, per round",
                               "× drop-in PIL, per round", "× whole-image decoding, per round"], rows, left=2))
    lines.append("")
    for case in results["cases"]:
        for who, w in case["writes"].items():
            lines.append(f"Write {case['case']} {who}: {w['seconds']:.1f} s, {w['bytes'] / 1e6:,.0f} MB.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/bench_train_crop_ffcv.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=ROOT / "bench-data" / "imagenet", help="an ImageFolder tree")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "train-crop")
    p.add_argument("--work", type=Path, default=None, help="packs and .beton files (default OUT/work)")
    p.add_argument("--limit", type=int, default=None, help="use N images of --data, spread evenly")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=1, help="measured epochs per run, after one warm-up epoch")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--threads", type=int, default=2, help="PackLoader threads, FFCV threads, DataLoader workers")
    p.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"comma-separated subset of {','.join(CASES)}")
    p.add_argument("--loaders", default=",".join(n for n in LOADERS if n != "packloader-fastidct"),
                   help=f"comma-separated subset of {','.join(LOADERS)}")
    p.add_argument("--crop", choices=CROPS, default="random",
                   help="random: RandomResizedCrop(224) + flip (training); center: CenterCrop(224) (validation)")
    p.add_argument("--reuse", action="store_true", help="read the packs/.beton files already in the work folder")
    args = p.parse_args(argv)
    cases, loaders = tuple(args.cases.split(",")), tuple(args.loaders.split(","))
    unknown = sorted((set(cases) - set(CASES)) | (set(loaders) - set(LOADERS)))
    if unknown:
        print(f"unknown --cases/--loaders name(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    if not args.data.is_dir():
        print(f"{args.data}: missing; make it with `python benchmarks/make_images.py imagenet {args.data}`",
              file=sys.stderr)
        return 2
    started = _dt.datetime.now(_dt.timezone.utc)
    work = args.work or args.out / "work"
    source = subset(args.data, args.limit, work / "subset") if args.limit else args.data
    loadavg_start = [round(v, 2) for v in os.getloadavg()]
    results = run(source, work, rounds=args.rounds, epochs=args.epochs, batch_size=args.batch_size,
                  threads=args.threads, cases=cases, loaders=loaders, reuse=args.reuse, crop=args.crop,
                  log=lambda line: print(line, file=sys.stderr, flush=True))
    results.update({
        "command": "python " + " ".join(shlex.quote(a) for a in ["benchmarks/bench_train_crop_ffcv.py",
                                                                 *(sys.argv[1:] if argv is None else argv)]),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "minutes": round((_dt.datetime.now(_dt.timezone.utc) - started).total_seconds() / 60, 1),
        "rounds": args.rounds, "epochs": args.epochs, "batch_size": args.batch_size, "threads": args.threads,
        "limit": args.limit, "cpus": os.cpu_count(), "loadavg_start": loadavg_start,
        "loadavg_end": [round(v, 2) for v in os.getloadavg()],
    })
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_json(results, args.out / "train-crop.json")
    (args.out / "train-crop.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
