"""Packing speed and size: packload against ``tar -cf`` (the reference) and each peer's writer.

Every contender packs the same folder; each run starts from an empty destination with nothing
dirty in memory (``os.sync()`` untimed), and its time includes a final ``os.sync()``, so a writer
that leaves its data in the page cache pays for it like one that fsyncs. The source files are
warm in the page cache (the warm-up run reads them), so the figures show each writer's own cost.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import cache, harness, report
from benchmarks.peers import PEERS, Peer
from packload import EncodeOptions, pack
from packload.loaders.folder import FolderImages

TAR = "tar -cf"
TAR_TARGET = 0.8  # packload keep should pack at least this fraction of tar's speed
PEER_NAMES = ("webdataset", "litdata", "streaming")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    for extra in (Path(str(path) + "-lock"), path.with_name(path.name + ".partial")):
        if extra.is_dir():
            shutil.rmtree(extra)
        elif extra.exists():
            extra.unlink()


def _timed(work: Callable[[], Any], out: Path, files: int, source_bytes: int,
           exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run ``work`` then ``os.sync()``, timed; the figures of one packing run. ``cpu_s`` is the CPU
    time (user + system) of this process and of its children that ended meanwhile: steadier than
    the wall time on a busy machine."""
    cpu = _cpu_seconds()
    start = time.perf_counter()
    work()
    os.sync()
    seconds = time.perf_counter() - start
    cpu_s = _cpu_seconds() - cpu
    out_bytes = report.dir_bytes(out, exclude)
    return {"seconds": seconds, "files_per_s": files / seconds, "mb_per_s": source_bytes / seconds / 1e6,
            "cpu_s": cpu_s, "out_bytes": out_bytes,
            "out_vs_source": out_bytes / source_bytes if source_bytes else None}


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _setup(out: Path, source: Path, cold_source: bool) -> Callable[[], dict[str, Any]]:
    def setup() -> dict[str, Any]:
        _remove(out)
        figures: dict[str, Any] = {}
        if cold_source:
            figures["eviction"] = cache.evict_checked([source])
        os.sync()
        return figures

    return setup


def contenders(source: Path, kind: str) -> list[tuple[str, EncodeOptions | None, str]]:
    """(name, packload options or None, note) of the packload variants for a dataset of ``kind``."""
    rows: list[tuple[str, EncodeOptions | None, str]] = [
        ("packload lmdb keep", EncodeOptions(), "original bytes"),
        ("packload shards keep", EncodeOptions(), "original bytes"),
    ]
    if kind == "png":
        rows.append(("packload lmdb raw", EncodeOptions(encoding="raw"), "--encoding raw (decoded pixels)"))
    else:
        rows.append(("packload lmdb jpeg max-side 256", EncodeOptions(encoding="jpeg", max_side=256),
                     "--encoding jpeg --max-side 256 (re-encodes every image)"))
    return rows


def build_cases(name: str, source: Path, kind: str, work: Path, *, peers: dict[str, Callable[[], Peer]] | None,
                cold_source: bool = False, workers: int | None = None) -> list[harness.Case]:
    """The grid for one dataset: packload variants, tar, and every peer (skipped ones keep their reason)."""
    samples = [(Path(p), int(label)) for p, label in FolderImages(source).samples]
    files = len(samples)
    source_bytes = sum(p.stat().st_size for p, _ in samples)
    out_dir = work / "pack" / name
    out_dir.mkdir(parents=True, exist_ok=True)
    cases: list[harness.Case] = []
    info = {"files": files, "source_bytes": source_bytes}

    for label, options, note in contenders(source, kind):
        suffix = ".lmdb" if "lmdb" in label else ".shards"
        dst = out_dir / (label.replace(" ", "-") + suffix)

        def run(dst: Path = dst, options: EncodeOptions | None = options) -> dict[str, Any]:
            return _timed(lambda: pack(source, dst, options=options, workers=workers, progress=False),
                          dst, files, source_bytes)

        cases.append(harness.Case(label, run, "files_per_s", setup=_setup(dst, source, cold_source),
                                  info={**info, "kind": "packload", "note": note}))

    tar_out = out_dir / "source.tar"

    def run_tar() -> dict[str, Any]:
        cmd = ["tar", "-cf", str(tar_out), "-C", str(source.parent), source.name]
        return _timed(lambda: subprocess.run(cmd, check=True, capture_output=True), tar_out, files, source_bytes)

    tar_missing = None if shutil.which("tar") else "tar not found on PATH"
    cases.append(harness.Case(TAR, run_tar, "files_per_s", setup=_setup(tar_out, source, cold_source),
                              info={**info, "kind": "reference", "note": "GNU tar, one process"},
                              skip_reason=tar_missing))

    for peer_name in PEER_NAMES:
        out = out_dir / peer_name
        if peers is None:
            cases.append(harness.Case(peer_name, dict, "files_per_s", skip_reason="peers not run (--no-peers)",
                                      info={**info, "kind": "peer"}))
            continue
        factory = peers.get(peer_name)
        peer = factory() if factory is not None else None
        reason = "no adapter" if peer is None else peer.unavailable()

        def run_peer(peer: Peer | None = peer, out: Path = out) -> dict[str, Any]:
            assert peer is not None
            return _timed(lambda: peer.write(samples, out), out, files, source_bytes, exclude=("cache",))

        cases.append(harness.Case(peer_name, run_peer, "files_per_s", setup=_setup(out, source, cold_source),
                                  info={**info, "kind": "peer", "note": _peer_note(peer_name)},
                                  skip_reason=reason))
    return cases


def _peer_note(name: str) -> str:
    return {"webdataset": "ShardWriter, one process", "litdata": "litdata.optimize, its own worker processes",
            "streaming": "MDSWriter, one process"}.get(name, "")


def run(datasets: dict[str, tuple[Path, str]], work: Path, *, peers: bool = True, repeats: int = 3,
        warmup: int = 1, cold_source: bool = False, workers: int | None = None,
        peer_factories: dict[str, Callable[[], Peer]] | None = None,
        log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Pack every dataset ``{name: (folder, "jpeg"|"png")}`` with every contender; all figures as a dict."""
    factories = (peer_factories if peer_factories is not None else PEERS) if peers else None
    out: dict[str, Any] = {"settings": {"repeats": repeats, "warmup": warmup, "cold_source": cold_source,
                                        "packload_workers": workers or "all CPUs", "peers": peers,
                                        "timing": "includes a final os.sync(); destination emptied before"},
                           "datasets": {}}
    for name, (source, kind) in datasets.items():
        if log:
            log(f"pack: {name} ({source})")
        cases = build_cases(name, source, kind, work, peers=factories, cold_source=cold_source, workers=workers)
        results = harness.run_grid(cases, repeats=repeats, warmup=warmup, log=log)
        harness.add_ratios(results, TAR, key="vs_tar")
        for r in results:
            if r["name"].endswith("keep") and r.get("vs_tar") is not None:
                r["meets_tar_target"] = r["vs_tar"] >= TAR_TARGET
        out["datasets"][name] = {"source": str(source), "kind": kind, **cases[0].info, "results": results}
        shutil.rmtree(work / "pack" / name, ignore_errors=True)  # GBs of outputs; the figures are kept
    return out


def _memory_header(results: list[dict[str, Any]]) -> str:
    pss = any(r.get("medians", {}).get("peak_pss_mb") is not None for r in results)
    return "peak PSS MB" if pss else "peak RSS MB (sum)"


def markdown(result: dict[str, Any]) -> str:
    """The pack tables: one per dataset, absolute figures and the ratio to tar."""
    parts = []
    s = result["settings"]
    for name, d in result["datasets"].items():
        rows = []
        for r in d["results"]:
            m = r.get("medians", {})
            rows.append([
                r["name"], report.spread(r["stats"]), report.num(m.get("mb_per_s"), 1),
                report.num(m.get("seconds"), 2), report.num(m.get("cpu_s"), 2),
                report.num(m["out_bytes"] / 1e6, 1) if "out_bytes" in m else "—",
                report.num(m.get("out_vs_source"), 2), report.times(r.get("vs_tar")),
                report.num(m.get("peak_pss_mb", m.get("peak_rss_mb"))), report.num(m.get("peak_growth_mb")),
                report.status(r) or r["info"].get("note", ""),
            ])
        parts.append(f"**{name}**: {d['files']:,} files, {d['source_bytes'] / 1e6:,.1f} MB ({d['source']}); "
                     f"load average {report.load_range(d['results'])}\n\n"
                     + report.table(["contender", "files/s median [min–max]", "MB/s", "s", "CPU s", "output MB",
                                     "output/source", "× tar", _memory_header(d["results"]), "added MB", "notes"],
                                    rows))
    head = (f"Packing, {s['repeats']} interleaved runs after {s['warmup']} warm-up; source "
            f"{'cold' if s['cold_source'] else 'warm'} in the page cache; times include a final `os.sync()`. "
            f"Target: packload keep ≥ {TAR_TARGET}× tar. CPU s: user + system time of the packing process "
            f"and its children (tar's is its own). Peak memory: summed over this process and "
            f"its children (PSS: shared pages split; RSS counts a page once per process that maps it), the "
            f"benchmark driver included; added: the peak minus the driver's own before the run.")
    return head + "\n\n" + "\n\n".join(parts)
