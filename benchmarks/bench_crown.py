"""packload's fast path against FFCV on the same data in the same run (the "speed crown").

    python benchmarks/bench_crown.py [--data bench-data] [--out bench-results/crown] [--repeats 3]
        [--cases cifar,jpeg,raw] [--loaders fast,batches,drop-in,ffcv] [--reuse]

Three cases, batch 64, 2 threads/workers (FFCV's numba threads, packload's ``PackLoader`` threads;
the DataLoader paths get 2 worker processes), warm page cache:

* ``cifar`` (32×32 PNGs) packed ``raw``: undecoded uint8 batches, sequential and random order;
* ``imagenet`` re-encoded at max side 256 as JPEG quality 90, centre crop 224 (FFCV ``jpg``);
* ``imagenet`` stored raw at max side 256, centre crop 224 (FFCV ``raw``).

Writes are timed too (packload ``--max-side 256`` against FFCV's ``DatasetWriter`` with
``max_resolution=256``). Every read runs in a fresh forked process: one warm-up epoch (FFCV compiles
its pipeline with numba there), then ``--epochs`` epochs whose median rate is the figure; the
contenders take turns (A B C, A B C, ...) so the machine's noise hits them alike. Beside the fast
path, the drop-in paths are measured: ``PackedImageFolder`` in a ``DataLoader`` (per-sample
pickling, ``collate_uint8``) and ``batch_loader`` (whole batches built in worker processes).
Pixels are compared too: the fast path against FFCV, and both against torchvision's
``Resize(256) + CenterCrop(224)`` of the original file done with PIL. For the JPEG case PackLoader is
also measured with ``fast_idct=True`` (the fast integer IDCT FFCV decodes with). ``--cases`` and
``--loaders`` run a subset; ``--reuse`` reads the packs already in the work folder (no write figures).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
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

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from benchmarks import ffcv_peer, harness, machine, report  # noqa: E402
from benchmarks.bench_read import in_child  # noqa: E402
from packload import (  # noqa: E402
    CenterCrop,
    EncodeOptions,
    PackedImageFolder,
    PackLoader,
    batch_loader,
    collate_uint8,
    pack,
)
from packload.loaders.transforms import ResizeCenterCrop  # noqa: E402

BATCH = 64
THREADS = 2
CROP = 224


def _epochs(make: Callable[[], Any], epochs: int, set_epoch: Callable[[Any, int], None] | None = None) -> dict[str, Any]:
    """Iterate ``make()``'s loader for 1 warm-up + ``epochs`` epochs; the median rate of the latter."""
    start = time.perf_counter()
    loader = make()
    setup_s = time.perf_counter() - start
    times, counts = [], []
    for epoch in range(1 + epochs):
        if set_epoch is not None:
            set_epoch(loader, epoch)
        t0 = time.perf_counter()
        n = 0
        for images, _labels in loader:
            n += images.shape[0]
        times.append(time.perf_counter() - t0)
        counts.append(n)
    rates = [n / t for n, t in zip(counts[1:], times[1:], strict=True)]
    return {"images_per_s": statistics.median(rates), "epoch_images_per_s": rates, "first_epoch_s": times[0],
            "images_per_epoch": counts[0], "setup_s": setup_s}


def _sampler(ds: PackedImageFolder, order: str) -> Any:
    return ds.sampler(shuffle=order != "sequential", order="random" if order == "random" else "block", seed=0)


def read_fast(pack_path: str, order: str, crop: int | None, epochs: int, fast_idct: bool = False) -> dict[str, Any]:
    """packload's ``PackLoader`` (threads in this process); ``fast_idct`` as FFCV decodes JPEGs."""
    def make() -> PackLoader:
        ds = PackedImageFolder(pack_path)
        return PackLoader(ds, BATCH, sampler=_sampler(ds, order), crop=crop,
                          threads=None if crop is None else THREADS, fast_idct=fast_idct)
    figures = _epochs(make, epochs, lambda loader, e: loader.set_epoch(e))
    figures["threads"] = "in the loop's thread" if crop is None else THREADS
    return figures


def read_batches(pack_path: str, order: str, crop: int | None, epochs: int) -> dict[str, Any]:
    """``batch_loader``: whole batches built in DataLoader worker processes."""
    def make() -> DataLoader:
        ds = PackedImageFolder(pack_path)
        sampler = _sampler(ds, order)
        return batch_loader(ds, BATCH, sampler=sampler, num_workers=THREADS, persistent_workers=True,
                            channels_last=True, crop=crop)
    return _epochs(make, epochs, lambda loader, e: loader.sampler.sampler.set_epoch(e))


def read_drop_in(pack_path: str, order: str, crop: int | None, epochs: int) -> dict[str, Any]:
    """The drop-in path: ``PackedImageFolder`` samples through a DataLoader, ``collate_uint8``."""
    def make() -> DataLoader:
        ds = PackedImageFolder(pack_path, output="numpy", transform=CenterCrop(crop) if crop else None)
        return DataLoader(ds, batch_size=BATCH, sampler=_sampler(ds, order), num_workers=THREADS,
                          collate_fn=collate_uint8, persistent_workers=True)
    return _epochs(make, epochs, lambda loader, e: loader.sampler.set_epoch(e))


def read_ffcv(beton: str, order: str, crop: int | None, epochs: int) -> dict[str, Any]:
    return ffcv_peer.read(beton, batch_size=BATCH, workers=THREADS, order=order, crop=crop, epochs=epochs)


def _write_packload(source: Path, dst: Path, options: EncodeOptions) -> dict[str, Any]:
    shutil.rmtree(dst, ignore_errors=True)
    start = time.perf_counter()
    summary = pack(source, dst, options=options, workers=THREADS, progress=False)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "bytes": report.dir_bytes(dst), "samples": summary["records"]}


def _write_ffcv(source: Path, dst: Path, mode: str, max_resolution: int | None) -> dict[str, Any]:
    dst.unlink(missing_ok=True)
    return ffcv_peer.write(source, dst, mode=mode, max_resolution=max_resolution, quality=90, workers=THREADS)


def _torchvision_like(path: str) -> np.ndarray:
    """torchvision's ``Resize(256) + CenterCrop(224)`` of the original file, on PIL (bilinear)."""
    return ResizeCenterCrop(CROP)(Image.open(path).convert("RGB"))


def pixel_check(source: Path, pack_path: Path, beton: Path | None, count: int = 16) -> dict[str, Any]:
    """Mean |difference| (0-255 levels) of the fast path against FFCV and torchvision's recipe."""
    ds = PackedImageFolder(pack_path)
    indices = np.linspace(0, len(ds) - 1, count).astype(np.int64)
    ours = ds.get_batch(indices, crop=CenterCrop(CROP), channels_last=True)[0].permute(0, 2, 3, 1).numpy()
    reference = np.stack([_torchvision_like(str(source / ds.path(int(i)))) for i in indices])
    figures = {"records": count, "vs_torchvision_resize_crop": float(np.abs(ours.astype(np.int16) - reference).mean())}
    if ds.encoding == "jpeg":  # what PackLoader(fast_idct=True) changes
        fast = ds.get_batch(indices, crop=CenterCrop(CROP), channels_last=True, fast_idct=True)[0]
        figures["fast_idct_vs_exact"] = float(np.abs(fast.permute(0, 2, 3, 1).numpy().astype(np.int16) - ours).mean())
    if beton is not None and ffcv_peer.unavailable() is None:
        theirs, _ = ffcv_peer.pixels(beton, indices.tolist(), crop=CROP)
        figures["vs_ffcv"] = float(np.abs(ours.astype(np.int16) - theirs).mean())
        figures["ffcv_vs_torchvision_resize_crop"] = float(np.abs(theirs.astype(np.int16) - reference).mean())
    return figures


CASES = ("cifar", "jpeg", "raw")  # --cases names, in _cases' order
LOADERS = ("fast", "batches", "drop-in", "ffcv")  # --loaders names


def _cases(data: Path, work: Path) -> list[dict[str, Any]]:
    cifar, imagenet = data / "cifar", data / "imagenet"
    return [
        {"name": "cifar raw", "source": cifar, "pack": work / "cifar-raw.shards", "beton": work / "cifar-raw.beton",
         "options": EncodeOptions(encoding="raw"), "ffcv": ("raw", None), "crop": None,
         "orders": ("sequential", "random")},
        {"name": "imagenet jpeg 256 → crop 224", "source": imagenet, "pack": work / "imagenet-j256.shards",
         "beton": work / "imagenet-j256.beton", "options": EncodeOptions(encoding="jpeg", quality=90, max_side=256),
         "ffcv": ("jpg", 256), "crop": CROP, "orders": ("random",)},
        {"name": "imagenet raw 256 → crop 224", "source": imagenet, "pack": work / "imagenet-r256.shards",
         "beton": work / "imagenet-r256.beton", "options": EncodeOptions(encoding="raw", max_side=256),
         "ffcv": ("raw", 256), "crop": CROP, "orders": ("random",)},
    ]


def run(data: Path, work: Path, repeats: int, epochs: int, log: Callable[[str], None] = print, *,
        cases: tuple[str, ...] = CASES, loaders: tuple[str, ...] = LOADERS, reuse: bool = False) -> dict[str, Any]:
    """Write every case with both libraries (``reuse``: keep packs already in ``work``), then read
    them in interleaved rounds."""
    ffcv_missing = ffcv_peer.unavailable() if "ffcv" in loaders else "not measured (--loaders)"
    results: dict[str, Any] = {"ffcv": ffcv_missing or f"ffcv {ffcv_peer.version()}", "cases": []}
    work.mkdir(parents=True, exist_ok=True)
    for key, case in zip(CASES, _cases(data, work), strict=True):
        if key not in cases:
            continue
        figures: dict[str, Any] = {"name": case["name"], "writes": {}, "reads": {}}
        if reuse and case["pack"].exists():
            log(f"{case['name']}: reusing {case['pack']}")
        else:
            log(f"{case['name']}: packing")
            figures["writes"]["packload"] = in_child(functools.partial(_write_packload, case["source"], case["pack"],
                                                                       case["options"]), timeout=1800)
        if ffcv_missing is None and not (reuse and case["beton"].exists()):
            mode, resolution = case["ffcv"]
            figures["writes"]["ffcv"] = in_child(functools.partial(_write_ffcv, case["source"], case["beton"], mode,
                                                                   resolution), timeout=1800)
        for order in case["orders"]:
            pack_path, crop = str(case["pack"]), case["crop"]
            contenders: dict[str, Callable[[], dict[str, Any]]] = {}
            if "fast" in loaders:
                contenders["packload PackLoader"] = functools.partial(read_fast, pack_path, order, crop, epochs)
                if case["options"].encoding == "jpeg":
                    contenders["packload PackLoader, fast IDCT"] = functools.partial(read_fast, pack_path, order,
                                                                                    crop, epochs, True)
            if "batches" in loaders:
                contenders["packload batch_loader (DataLoader)"] = functools.partial(read_batches, pack_path, order,
                                                                                     crop, epochs)
            if "drop-in" in loaders:
                contenders["packload drop-in (DataLoader)"] = functools.partial(read_drop_in, pack_path, order, crop,
                                                                                epochs)
            if ffcv_missing is None:
                contenders["FFCV"] = functools.partial(read_ffcv, str(case["beton"]), order, case["crop"], epochs)
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
            for round_ in range(repeats):
                for name, fn in contenders.items():
                    try:
                        runs[name].append(in_child(fn, timeout=1800))
                    except (RuntimeError, TimeoutError) as exc:
                        runs[name].append({"error": str(exc)[:2000]})
                    last = runs[name][-1]
                    log(f"  {order} round {round_ + 1}: {name}: "
                        f"{last.get('images_per_s', 0):,.0f} img/s" if "error" not in last else f"  {name}: error")
            figures["reads"][order] = {name: _summary(r) for name, r in runs.items()}
        if case["crop"] is not None:
            figures["pixels"] = pixel_check(case["source"], case["pack"],
                                            case["beton"] if ffcv_missing is None else None)
        results["cases"].append(figures)
    return results


def run_writes(data: Path, work: Path, repeats: int, log: Callable[[str], None] = print, *,
               cases: tuple[str, ...] = CASES) -> dict[str, Any]:
    """Write every case with both libraries, ``repeats`` rounds, the order alternating from round to
    round; each output is removed once measured (raw packs take gigabytes). No reads."""
    ffcv_missing = ffcv_peer.unavailable()
    results: dict[str, Any] = {"ffcv": ffcv_missing or f"ffcv {ffcv_peer.version()}", "writes": []}
    scratch = work / "writes"
    scratch.mkdir(parents=True, exist_ok=True)
    chosen = [case for key, case in zip(CASES, _cases(data, scratch), strict=True) if key in cases]
    figures = {case["name"]: {"packload": [], "ffcv": []} for case in chosen}
    for round_ in range(repeats):
        for case in chosen:
            writers = ["packload"] + ([] if ffcv_missing else ["ffcv"])
            for who in writers if round_ % 2 == 0 else writers[::-1]:
                if who == "packload":
                    out = in_child(functools.partial(_write_packload, case["source"], case["pack"], case["options"]),
                                   timeout=1800)
                    shutil.rmtree(case["pack"], ignore_errors=True)
                else:
                    mode, resolution = case["ffcv"]
                    out = in_child(functools.partial(_write_ffcv, case["source"], case["beton"], mode, resolution),
                                   timeout=1800)
                    case["beton"].unlink(missing_ok=True)
                figures[case["name"]][who].append(out["seconds"])
                log(f"  round {round_ + 1}: {case['name']}: {who} {out['seconds']:.1f} s")
    for name, times in figures.items():
        ratios = [ours / theirs for ours, theirs in zip(times["packload"], times["ffcv"], strict=False)]
        results["writes"].append({"name": name, "packload_s": times["packload"], "ffcv_s": times["ffcv"],
                                  "ratios": ratios})
    return results


def writes_markdown(results: dict[str, Any]) -> str:
    """One row per case: each round's seconds and packload ÷ FFCV."""
    rows = [[w["name"], " ".join(f"{t:.1f}" for t in w["packload_s"]), " ".join(f"{t:.1f}" for t in w["ffcv_s"]),
             " ".join(f"{r:.2f}" for r in w["ratios"]) or "–"] for w in results["writes"]]
    return "\n".join([f"FFCV: {results['ffcv']}.", "",
                      report.table(["case", "packload s, per round", "FFCV s, per round", "packload ÷ FFCV"], rows),
                      ""])


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["images_per_s"] for r in runs if "images_per_s" in r]
    stats: dict[str, Any] = harness.summarize(rates) if rates else {"n": 0, "median": None}
    return {**stats, "runs": runs}


def markdown(results: dict[str, Any]) -> str:
    lines = [f"FFCV: {results['ffcv']}.", ""]
    for case in results["cases"]:
        lines.append(f"**{case['name']}**")
        lines.append("")
        writes = case["writes"]
        if "packload" in writes:
            ours = writes["packload"]["seconds"]
            theirs = writes.get("ffcv", {}).get("seconds")
            lines.append(f"Write: packload {ours:.1f} s ({writes['packload']['bytes'] / 1e6:,.0f} MB)"
                         + (f", FFCV {theirs:.1f} s ({writes['ffcv']['bytes'] / 1e6:,.0f} MB): packload takes "
                            f"**{ours / theirs:.2f}×** FFCV's time" if theirs else "") + ".")
        else:
            lines.append("Write: not measured (packs reused, `--reuse`).")
        lines.append("")
        rows = []
        for order, contenders in case["reads"].items():
            ffcv = contenders.get("FFCV", {}).get("median")
            for name, stats in contenders.items():
                rows.append([order, name, report.spread(stats) if stats["n"] else "error",
                             report.times(stats["median"] / ffcv) if ffcv and stats["median"] else "–"])
        lines.append(report.table(["order", "loader", "images/s, median [min–max]", "× FFCV"], rows))
        if "pixels" in case:
            p = case["pixels"]
            lines.append("")
            lines.append(f"Pixels ({p['records']} records, mean |difference| in levels of 255): packload fast path "
                         f"vs torchvision's Resize(256)+CenterCrop(224) of the original "
                         f"{p['vs_torchvision_resize_crop']:.1f}"
                         + (f"; vs FFCV {p['vs_ffcv']:.1f}; FFCV vs torchvision's "
                            f"{p['ffcv_vs_torchvision_resize_crop']:.1f}" if "vs_ffcv" in p else "")
                         + (f"; fast IDCT vs exact IDCT {p['fast_idct_vs_exact']:.1f}" if "fast_idct_vs_exact" in p
                            else "") + ".")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/bench_crown.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=ROOT / "bench-data", help="holds cifar/ and imagenet/")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "crown", help="crown.md/crown.json go here")
    p.add_argument("--work", type=Path, default=None, help="scratch for packs and .beton files (default OUT/work)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds of reads")
    p.add_argument("--epochs", type=int, default=2, help="measured epochs per read run (after one warm-up)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    p.add_argument("--loaders", default=",".join(LOADERS), help=f"comma-separated subset of {','.join(LOADERS)}")
    p.add_argument("--reuse", action="store_true",
                   help="read packs and .beton files already in the work folder instead of writing them again "
                        "(no write figures then)")
    p.add_argument("--writes-only", action="store_true",
                   help="time the writes only, --repeats rounds with the order alternating (outputs removed)")
    args = p.parse_args(argv)
    cases, loaders = tuple(args.cases.split(",")), tuple(args.loaders.split(","))
    unknown = sorted((set(cases) - set(CASES)) | (set(loaders) - set(LOADERS)))
    if unknown:
        print(f"unknown --cases/--loaders name(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    for name in ("cifar", "imagenet"):
        if not (args.data / name).is_dir():
            print(f"{args.data / name}: missing; make it with `python benchmarks/make_images.py {name} "
                  f"{args.data / name}`", file=sys.stderr)
            return 2
    started = _dt.datetime.now(_dt.timezone.utc)
    work = args.work or args.out / "work"
    if args.writes_only:
        results, name, render = run_writes(args.data, work, args.repeats, cases=cases), "crown-writes", writes_markdown
    else:
        results = run(args.data, work, args.repeats, args.epochs, cases=cases, loaders=loaders, reuse=args.reuse)
        name, render = "crown", markdown
    results["command"] = "python " + " ".join(shlex.quote(a) for a in ["benchmarks/bench_crown.py", *sys.argv[1:]])
    results["date"] = started.strftime("%Y-%m-%d %H:%M UTC")
    results["machine"] = machine.describe(args.data)
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_json(results, args.out / f"{name}.json")
    (args.out / f"{name}.md").write_text(render(results))
    print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
