"""Run the benchmark suite and write results.md, results.json (and PNG charts with matplotlib).

    python benchmarks/run.py [--quick] [--data DIR] [--out DIR] [--only pack|read|machine] [--no-peers]
                             [--storage slow:LATENCY_MS[:MBPS]]

Full scale reads DATA/imagenet (20,000 JPEGs) and DATA/cifar (50,000 PNGs); ``--quick`` uses
2,000 JPEGs and 10,000 PNGs. Missing datasets are generated (``packload.packer.synthetic``, seeded). Parts
run separately (``--only``) are merged into the results already in ``--out``. ``--storage slow:2``
reads through an emulated slow disk (``benchmarks/slowfs.py``; root or fusermount, a C compiler, libfuse-dev).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_pack, bench_read, machine, plots, report, slowfs  # noqa: E402
from packload.packer.synthetic import make_cifar_like, make_imagenet_like  # noqa: E402

PARTS = ("machine", "pack", "read")
SCALES: dict[str, dict[str, Any]] = {
    "full": {"jpegs": 20000, "pngs": 50000, "repeats": 3, "warmup": 1, "workers": "0,1,2,4",
             "bytes_samples": 20000, "decoded_samples": 20000, "crop_samples": 2560,
             "decode_seconds": 1.5, "read_mb": 1024},
    "quick": {"jpegs": 2000, "pngs": 10000, "repeats": 2, "warmup": 1, "workers": "0,2",
              "bytes_samples": 10000, "decoded_samples": 5000, "crop_samples": 500,
              "decode_seconds": 0.5, "read_mb": 256},
}
FFCV_NOTE = ("FFCV: benchmark-only peer, not part of this run; measured by benchmarks/ffcv_measure.py "
             "(install recipe in BENCHMARKS.md).")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a few minutes: 2,000 JPEGs, 10,000 PNGs, fewer runs")
    p.add_argument("--data", type=Path, default=ROOT / "bench-data", help="datasets folder (generated if missing)")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results", help="where results.md/.json go")
    p.add_argument("--work", type=Path, default=None, help="scratch for packs (default OUT/work)")
    p.add_argument("--only", choices=PARTS, action="append", help="run only this part (repeatable)")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                   help="include WebDataset, LitData, MosaicML Streaming (unavailable ones are reported)")
    p.add_argument("--cold", action=argparse.BooleanOptionalAction, default=True, help="cold-cache read runs")
    p.add_argument("--fresh", action="store_true", help="do not merge with results already in --out")
    p.add_argument("--render-only", action="store_true", help="rewrite results.md and charts from results.json")
    for key in ("jpegs", "pngs", "repeats", "warmup", "bytes_samples", "decoded_samples", "crop_samples", "read_mb"):
        p.add_argument("--" + key.replace("_", "-"), type=int, default=None, help="override the scale's value")
    p.add_argument("--decode-seconds", type=float, default=None, help="time per decode-rate measurement")
    p.add_argument("--workers", default=None, help="num_workers to sweep, comma separated (e.g. 0,1,2,4)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--modes", default=None, help="read modes to run, comma separated (bytes, decoded, "
                   "decoded+crop224); default all")
    p.add_argument("--contenders", default=None, help="read contenders to run: comma separated name prefixes "
                   "(e.g. 'packload,litdata,FolderImages'); default all")
    p.add_argument("--storage", type=_storage, default=None, metavar="local|slow:LATENCY_MS[:MBPS]",
                   help="read benchmarks with the images and every format behind a slowfs mount "
                        "(benchmarks/slowfs.py): LATENCY_MS added to every open and read request, "
                        "optionally capped at MBPS MB/s; cold cache only")
    return p


def _storage(spec: str) -> dict[str, Any] | None:
    """``local`` -> None; ``slow:2`` or ``slow:2:200`` -> {"latency_ms": 2.0, "mbps": 200.0 or None}."""
    if spec == "local":
        return None
    kind, _, rest = spec.partition(":")
    fields = rest.split(":") if rest else []
    try:
        numbers = [float(f) for f in fields]
    except ValueError:
        numbers = []
    if kind != "slow" or not 1 <= len(numbers) <= 2 or numbers[0] < 0 or (len(numbers) == 2 and numbers[1] <= 0):
        raise argparse.ArgumentTypeError(f"{spec!r}: give local or slow:LATENCY_MS[:MBPS], e.g. slow:2 or slow:2:200")
    return {"latency_ms": numbers[0], "mbps": numbers[1] if len(numbers) == 2 else None}


def _names(spec: str | None) -> list[str] | None:
    """``"a,b"`` -> ``["a", "b"]``; None or empty -> None (everything)."""
    names = [n.strip() for n in (spec or "").split(",") if n.strip()]
    return names or None


def _dataset_dir(data: Path, kind: str, count: int) -> Path:
    default = SCALES["full"]["jpegs" if kind == "imagenet" else "pngs"]
    return data / (kind if count == default else f"{kind}-{count}")


def ensure_data(data: Path, jpegs: int, pngs: int, log: Any = print) -> dict[str, tuple[Path, str]]:
    """The two datasets ``{name: (folder, jpeg|png)}``, generated (seeded) when missing."""
    out = {}
    for kind, count, make, fmt in (("imagenet", jpegs, make_imagenet_like, "jpeg"),
                                   ("cifar", pngs, make_cifar_like, "png")):
        folder = _dataset_dir(data, kind, count)
        if not folder.is_dir() or not any(folder.iterdir()):
            log(f"generating {count:,} {kind}-like images into {folder}")
            make(folder, count=count, seed=0, progress=False)
        out[kind] = (folder, fmt)
    return out


def _load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def markdown(results: dict[str, Any]) -> str:
    """results.md: machine, versions, commands, then every table."""
    lines = ["# packload benchmark results", ""]
    for part in PARTS:
        if part in results:
            meta = results[part]["meta"]
            code = meta.get("packload", {})
            dirty = f", {len(code['uncommitted_library_files'])} uncommitted library files" \
                if code.get("uncommitted_library_files") else ""
            lines.append(f"- `{part}`: `{meta['command']}` — {meta['date']}, {meta['minutes']:.1f} min, "
                         f"packload at {code.get('commit') or '?'}{dirty}")
    lines.append("")
    m = results.get("machine", {}).get("describe")
    if m:
        fs = m["filesystem"]
        lines += ["## Machine", "",
                  f"{m['cpu']}, {m['logical_cores']} logical cores ({m['usable_cores']} usable), "
                  f"{m['ram_gb']} GB RAM, {m['os']}; data on {fs['device']} ({fs['fstype']}, "
                  f"{'rotational' if fs['rotational'] else 'non-rotational' if fs['rotational'] is False else '?'}) "
                  f"mounted at {fs['mount']}.", "",
                  "Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v) + ".",
                  "Peers: " + ", ".join(f"{k} {v or 'not installed'}" for k, v in m["peer_versions"].items())
                  + ". " + FFCV_NOTE, ""]
    lim = results.get("machine", {}).get("limits")
    if lim:
        lines += ["## Machine limits", "", limits_markdown(lim), ""]
    if "pack" in results:
        lines += ["## Pack", "", bench_pack.markdown(results["pack"]["data"]), ""]
    if "read" in results:
        data = results["read"]["data"]
        storage = data["settings"].get("storage", "local")
        if isinstance(storage, dict):
            fs = storage["slowfs"]
            lines += [f"**Storage: slowfs**, {fs['latency_ms']:g} ms per open and read request"
                      + (f", {fs['mbps']:g} MB/s" if fs.get("mbps") else ", no bandwidth cap")
                      + "; cold cache only (slowfs remounted before every run, the sweep included).", ""]
        if any("warm" in m for d in data["datasets"].values() for m in d["modes"].values()):
            lines += ["## Read — warm cache", "", bench_read.markdown(data, "warm"), ""]
        if any("cold" in m for d in data["datasets"].values() for m in d["modes"].values()):
            lines += ["## Read — cold cache", "", bench_read.markdown(data, "cold"), ""]
        lines += ["## num_workers sweep", "", bench_read.sweep_markdown(data), ""]
    lines += ["Ratios: > 1 means the row is faster than the reference; **bold** ≥ 1.05×, ▼ ≤ 0.95×. "
              "Spreads are [min–max] over the interleaved runs.", ""]
    return "\n".join(lines)


def limits_markdown(lim: dict[str, Any]) -> str:
    """Per-core and all-core decode ceilings, cold read and memcpy bandwidth."""
    per = lim["per_core"]
    rows = [[k, report.num(v), report.num(lim["all_cores"].get(k.replace("jpeg_", "all_cores_jpeg_")
                                                           .replace("png_", "all_cores_png_")))]
            for k, v in per.items() if k.startswith(("jpeg_decode", "png_decode"))]
    cold = lim["cold_read"]
    ev = cold.get("eviction", {})
    text = report.table(["images/s on in-memory bytes", "one core", f"× {lim['usable_cores']} usable cores"], rows)
    sampled = f"{per.get('jpeg_files_sampled', 0)} JPEGs (mean {report.num(per.get('jpeg_mean_kb'), 1)} KB), " \
              f"{per.get('png_files_sampled', 0)} PNGs sampled from the benchmark data."
    return (text + "\n\n" + sampled + f"\n\nCold sequential read: **{report.num(cold['mb_per_s'])} MB/s** "
            f"({cold['bytes'] / 1e6:,.0f} MB; eviction {'verified' if cold.get('cold') else 'NOT verified'}: "
            f"resident {ev.get('resident_before', 0) or 0:.0%} → {ev.get('resident_after', 0) or 0:.0%}). "
            f"Memory copy: **{lim['memcpy_gb_per_s']:.1f} GB/s** (one core).")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen parts and write results.md, results.json and charts into --out."""
    args = _parser().parse_args(argv)
    if args.storage and slowfs.unavailable():
        _parser().error(f"--storage slow: cannot mount a slowfs here: {slowfs.unavailable()}")
    scale = dict(SCALES["quick" if args.quick else "full"])
    for key in scale:
        value = getattr(args, key, None)
        if value is not None:
            scale[key] = value
    workers = [int(w) for w in str(scale["workers"]).split(",") if w.strip()]
    parts = args.only or list(PARTS)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    work: Path = args.work or out / "work"
    work.mkdir(parents=True, exist_ok=True)
    args.data.mkdir(parents=True, exist_ok=True)
    command = " ".join(shlex.quote(a) for a in [Path(sys.executable).as_posix(), "benchmarks/run.py",
                                                *(sys.argv[1:] if argv is None else argv)])

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    results = {} if args.fresh else _load(out / "results.json")
    if args.render_only:
        parts = []
    else:
        datasets = ensure_data(args.data, scale["jpegs"], scale["pngs"], log)
    for part in PARTS:
        if part not in parts:
            continue
        started = time.perf_counter()
        code = machine.code_state(ROOT)  # what this part measures (the library changes between parts)
        log(f"== {part} (packload at {code['commit']})")
        if part == "machine":
            data: dict[str, Any] = {
                "describe": machine.describe(args.data),
                "limits": machine.limits(datasets["imagenet"][0], datasets["cifar"][0], args.data,
                                         seconds=scale["decode_seconds"], read_mb=scale["read_mb"]),
            }
        elif part == "pack":
            data = {"data": bench_pack.run(datasets, work, peers=args.peers, repeats=scale["repeats"],
                                           warmup=scale["warmup"], log=log)}
        else:
            budgets = {"bytes": scale["bytes_samples"], "decoded": scale["decoded_samples"],
                       "decoded+crop224": scale["crop_samples"]}
            limits = results.get("machine", {}).get("limits")
            data = {"data": bench_read.run(datasets, work, peers=args.peers, repeats=scale["repeats"],
                                           warmup=scale["warmup"], workers=workers, batch_size=args.batch_size,
                                           budgets=budgets, cold=args.cold, limits=limits, log=log,
                                           slow=args.storage, modes=_names(args.modes),
                                           only=_names(args.contenders))}
        data["meta"] = {"command": command, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                        "minutes": (time.perf_counter() - started) / 60, "scale": scale,
                        "datasets": {k: str(v[0]) for k, v in datasets.items()},
                        "packload": code, "loadavg_end": os.getloadavg()}
        if part == "machine":
            data["meta"]["describe_date"] = data["describe"]["date"]
        results[part] = data
        report.write_json(results, out / "results.json")
        (out / "results.md").write_text(markdown(results))
    charts = plots.write_charts(results, out)
    md = markdown(results)
    if charts:
        md += "\n" + "\n".join(f"![{c.stem}]({c.name})" for c in charts) + "\n"
    (out / "results.md").write_text(md)
    log(f"wrote {out / 'results.md'} and {out / 'results.json'}" + (f" and {len(charts)} charts" if charts else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
