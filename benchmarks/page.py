"""BENCHMARKS.md's generated parts and its chart, from the raw results in benchmarks/results/*.json.

    python benchmarks/page.py                 # rewrite BENCHMARKS.md's generated blocks and headline.png
    python benchmarks/page.py --check         # exit 1 when either would change (the page drifted)
    .venv-peers/bin/python benchmarks/page.py --run   # run the headline set (about an hour on 2 cores),
                                                       # keep its raw JSON here, then rewrite the page

The hand-written prose of BENCHMARKS.md stays as it is; only the text between
``<!-- BEGIN GENERATED: name -->`` and ``<!-- END GENERATED: name -->`` is replaced, so running
this twice gives byte-identical files. Every figure is recomputed from the rounds kept in the JSON
(median and [min–max] over the interleaved rounds; ratios of medians from the same run).

``--run`` calls, with this interpreter, ``benchmarks/run.py`` (machine, pack, read: warm and cold,
every contender and peer), ``benchmarks/bench_crown.py`` (PackLoader against FFCV, reads) and
``bench_crown.py --writes-only`` (packing against FFCV's writer), samples the load average while
they run, and writes ``run.json``, ``crown.json``, ``crown-writes.json`` and ``session.json`` into
``--results`` with paths made relative to the checkout and tracebacks left out.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from benchmarks import harness, report  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "BENCHMARKS.md"
CHART = "headline.png"  # in the results folder
REPEATS = 3
BASELINE = "FolderImages (baseline)"
TAR = "tar -cf"
PEERS = {"webdataset": "WebDataset", "litdata": "LitData", "streaming": "MosaicML Streaming"}
DATASETS = {"imagenet": "20k JPEGs", "cifar": "50k PNGs"}


# ---------------------------------------------------------------- running the headline set


def headline_commands(python: str, data: Path, scratch: Path, repeats: int = REPEATS) -> list[list[str]]:
    """The three commands of a headline run (paths as given: relative to the checkout by default)."""
    crown = scratch / "crown"
    return [
        [python, "benchmarks/run.py", "--data", str(data), "--out", str(scratch), "--fresh",
         "--repeats", str(repeats)],
        [python, "benchmarks/bench_crown.py", "--data", str(data), "--out", str(crown), "--repeats", str(repeats),
         "--epochs", "1", "--loaders", "fast,ffcv"],
        [python, "benchmarks/bench_crown.py", "--data", str(data), "--out", str(crown), "--repeats", str(repeats),
         "--writes-only"],
    ]


class LoadSampler:
    """The 1/5/15-minute load averages every ``interval`` seconds while the block runs."""

    def __init__(self, interval: float = 15.0) -> None:
        self.interval = interval
        self.samples: list[list[float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._start = 0.0

    def _loop(self) -> None:
        while True:
            self.samples.append([round(time.monotonic() - self._start, 1), *(round(x, 2) for x in os.getloadavg())])
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> LoadSampler:
        self._start = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def run_headline(data: Path, scratch: Path, results: Path, repeats: int = REPEATS) -> int:
    """Run the headline set, then keep its raw JSON (sanitized) in ``results``."""
    python = Path(sys.executable)
    shown = os.path.relpath(python, ROOT) if python.is_relative_to(ROOT) else python.name
    commands = headline_commands(str(python), data, scratch, repeats)
    session: dict[str, Any] = {"date": _now(), "command": f"{shown} benchmarks/page.py --run"
                               + (f" --repeats {repeats}" if repeats != REPEATS else ""), "steps": []}
    with LoadSampler() as load:
        for cmd in commands:
            step = {"command": " ".join(shlex.quote(c) for c in [shown, *cmd[1:]]), "started": _now()}
            print(f"[page] {step['command']}", flush=True)
            started = time.perf_counter()
            step["returncode"] = subprocess.run(cmd, cwd=ROOT).returncode
            step["minutes"] = round((time.perf_counter() - started) / 60, 2)
            step["ended"] = _now()
            session["steps"].append(step)
            if step["returncode"]:
                print(f"[page] failed ({step['returncode']}): {step['command']}", file=sys.stderr)
                break
    session["loadavg"] = {"interval_s": load.interval, "columns": ["seconds", "1m", "5m", "15m"],
                          "samples": load.samples}
    from benchmarks import machine  # after the run: peer versions as installed in this interpreter

    session["machine"] = machine.describe(data)
    (scratch / "session.json").write_text(json.dumps(session, indent=1) + "\n")
    collect(scratch, results, session)
    return max(s["returncode"] for s in session["steps"])


def collect(scratch: Path, results: Path, session: dict[str, Any]) -> list[Path]:
    """Copy the run's JSON from ``scratch`` into ``results``, sanitized; the files written."""
    results.mkdir(parents=True, exist_ok=True)
    sources = {"run.json": scratch / "results.json", "crown.json": scratch / "crown" / "crown.json",
               "crown-writes.json": scratch / "crown" / "crown-writes.json"}
    written = []
    for name, src in sources.items():
        if src.exists():
            written.append(_write(results / name, sanitize(json.loads(src.read_text()))))
    written.append(_write(results / "session.json", sanitize(session)))
    return written


def _write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, indent=1, sort_keys=False, ensure_ascii=False) + "\n")
    return path


_DROP = {"traceback", "python_executable"}


def sanitize(data: Any) -> Any:
    """``data`` with absolute paths under the checkout made relative, other absolute paths of this
    machine (interpreters, home folders) cut to their last part, and tracebacks dropped."""
    root = str(ROOT)
    prefixes = sorted({p for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path.home())) if p and p != "/"},
                      key=len, reverse=True)

    def text(s: str) -> str:
        s = s.replace(root + "/", "").replace(root, ".")
        for prefix in prefixes:
            s = re.sub(re.escape(prefix) + r"(/[^\s'\"]*)?", lambda m: Path(m.group(0)).name or "python", s)
        return s

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items() if k not in _DROP}
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, str):
            return text(v)
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v

    return walk(data)


# ---------------------------------------------------------------- the figures


def load(results: Path) -> dict[str, Any]:
    """The raw JSON of one headline run: ``run``, ``crown``, ``crown_writes``, ``session`` ({} when missing)."""
    out = {}
    for key, name in (("run", "run.json"), ("crown", "crown.json"), ("crown_writes", "crown-writes.json"),
                      ("session", "session.json")):
        path = results / name
        out[key] = json.loads(path.read_text()) if path.exists() else {}
    return out


@dataclass
class Row:
    """One line of the headline table: packload's figure against the baseline and the best peer."""

    section: str
    case: str
    unit: str
    packload: str  # which packload path gave the figure
    stats: dict[str, Any]
    higher_is_better: bool = True
    baseline: str | None = None
    baseline_stats: dict[str, Any] | None = None
    peer: str | None = None
    peer_stats: dict[str, Any] | None = None
    per_round: list[float] | None = None  # paired rounds (writes against FFCV): the ratio of each round

    def vs(self, other: dict[str, Any] | None) -> float | None:
        return harness.ratio(self.stats["median"], other["median"] if other else None, self.higher_is_better)

    @property
    def vs_baseline(self) -> float | None:
        return self.vs(self.baseline_stats)

    @property
    def vs_peer(self) -> float | None:
        return self.vs(self.peer_stats)


def stats(values: Sequence[float]) -> dict[str, Any] | None:
    """Median, min, max and n of ``values`` (:func:`benchmarks.harness.summarize`), None when empty."""
    return harness.summarize(values) if values else None


def _rounds(result: dict[str, Any] | None, key: str) -> list[float]:
    """The measured rounds of one harness result (warm-ups and failed rounds left out)."""
    if not result:
        return []
    return [r[key] for r in result.get("runs", []) if "error" not in r and isinstance(r.get(key), (int, float))]


def _best(results: list[dict[str, Any]], names: Callable[[str], bool], key: str,
          higher_is_better: bool = True) -> tuple[str | None, dict[str, Any] | None]:
    """The name and stats of the result with the best median among those ``names`` accepts."""
    best: tuple[str | None, dict[str, Any] | None] = (None, None)
    sign = 1 if higher_is_better else -1
    for r in results:
        s = stats(_rounds(r, key))
        if names(r["name"]) and s and (best[1] is None or sign * s["median"] > sign * best[1]["median"]):
            best = (r["name"], s)
    return best


# (dataset, mode, what, which packload results count): the fixed rule, decided before any run.
READ_ROWS: list[tuple[str, str, str, Callable[[str], bool]]] = [
    ("imagenet", "bytes", "undecoded bytes", lambda n: n.startswith("packload")),
    ("imagenet", "decoded+crop224", "decode + ResizeCenterCrop(224)",
     lambda n: n in ("packload lmdb", "packload shards", "packload lmdb, batch_loader")),
    ("imagenet", "decoded+crop224", "decode + crop 224, fast paths (pixels differ slightly)",
     lambda n: n.startswith("packload") and ("CenterCrop" in n or "decode_size" in n)),
    ("cifar", "bytes", "undecoded bytes", lambda n: n.startswith("packload")),
    ("cifar", "decoded", "decoded",
     lambda n: n in ("packload lmdb", "packload shards", "packload shards, PackLoader", "packload lmdb, batch_loader")),
    ("cifar", "decoded", "decoded, pack made with `--encoding raw`", lambda n: n.startswith("packload lmdb raw")),
]
CROWN_CONTENDER = "packload PackLoader"


def _short(name: str) -> str:
    return name.removeprefix("packload ").replace(" keep", "")


def read_rows(run: dict[str, Any]) -> list[Row]:
    """Warm and cold rows of :data:`READ_ROWS` that the run measured."""
    rows = []
    datasets = run.get("read", {}).get("data", {}).get("datasets", {})
    for cache in ("cold", "warm"):
        for name, mode, what, accept in READ_ROWS:
            results = datasets.get(name, {}).get("modes", {}).get(mode, {}).get(cache, {}).get("results")
            if not results:
                continue
            label, s = _best(results, accept, "samples_per_s")
            if s is None:
                continue
            base = next((r for r in results if r["name"] == BASELINE), None)
            peer, peer_stats = _best(results, lambda n: n in PEERS, "samples_per_s")
            rows.append(Row(f"read, {cache} cache", f"{DATASETS.get(name, name)}, {what}", "samples/s",
                            _short(label or ""), s, baseline="FolderImages", baseline_stats=stats(_rounds(base,
                            "samples_per_s")), peer=PEERS.get(peer or ""), peer_stats=peer_stats))
    return rows


def pack_rows(run: dict[str, Any]) -> list[Row]:
    """Packing the original bytes (``keep``) against ``tar -cf`` and the peers' writers."""
    rows = []
    for name, d in run.get("pack", {}).get("data", {}).get("datasets", {}).items():
        results = d.get("results", [])
        label, s = _best(results, lambda n: n.startswith("packload") and n.endswith(" keep"), "files_per_s")
        if s is None:
            continue
        tar = next((r for r in results if r["name"] == TAR), None)
        peer, peer_stats = _best(results, lambda n: n in PEERS, "files_per_s")
        rows.append(Row("pack", f"{DATASETS.get(name, name)}, original bytes (`keep`)", "files/s",
                        _short(label or ""), s, baseline="tar", baseline_stats=stats(_rounds(tar, "files_per_s")),
                        peer=PEERS.get(peer or ""), peer_stats=peer_stats))
    return rows


CROWN_CASES = {  # bench_crown.py's case names: (data, how both libraries packed it)
    "cifar raw": ("50k PNGs", "`--encoding raw` (FFCV `raw`)"),
    "imagenet jpeg 256 → crop 224": ("20k JPEGs", "`--encoding jpeg --max-side 256` (FFCV `jpg`, 256)"),
    "imagenet raw 256 → crop 224": ("20k JPEGs", "`--encoding raw --max-side 256` (FFCV `raw`, 256)"),
}


def _crown_case(name: str) -> str:
    data, how = CROWN_CASES.get(name, (name, ""))
    return f"{data}, pack {how}" if how else data


def crown_rows(crown: dict[str, Any], writes: dict[str, Any]) -> list[Row]:
    """PackLoader against FFCV (reads, warm cache), and packing against FFCV's writer (seconds)."""
    rows = []
    for case in crown.get("cases", []):
        crop = " + crop 224" if "crop 224" in case["name"] else ""
        for order, contenders in case.get("reads", {}).items():
            ours = stats(_rounds(contenders.get(CROWN_CONTENDER), "images_per_s"))
            if ours is None:
                continue
            rows.append(Row("vs FFCV, warm cache", f"{_crown_case(case['name'])}, {order} order", "images/s",
                            f"PackLoader{crop}", ours, peer="FFCV",
                            peer_stats=stats(_rounds(contenders.get("FFCV"), "images_per_s"))))
    for w in writes.get("writes", []):
        ours = stats(w.get("packload_s", []))
        if ours is None:
            continue
        pairs = zip(w.get("packload_s", []), w.get("ffcv_s", []), strict=False)
        rows.append(Row("pack vs FFCV", _crown_case(w["name"]), "seconds", "`pack --workers 2`", ours,
                        higher_is_better=False, peer="FFCV", peer_stats=stats(w.get("ffcv_s", [])),
                        per_round=[theirs / mine for mine, theirs in pairs if mine > 0]))
    return rows


def all_rows(data: dict[str, Any]) -> list[Row]:
    return read_rows(data["run"]) + pack_rows(data["run"]) + crown_rows(data["crown"], data["crown_writes"])


def _cell(name: str | None, s: dict[str, Any] | None) -> str:
    return f"{name} {report.num(s['median'])}" if name and s else "—"


def headline_table(rows: Sequence[Row]) -> str:
    """The headline table: packload's median [min–max], the baseline's and best peer's medians, ratios."""
    body = [[r.section, r.case, r.unit, r.packload, report.spread(r.stats), r.stats["n"],
             _cell(r.baseline, r.baseline_stats), report.times(r.vs_baseline), _cell(r.peer, r.peer_stats),
             report.times(r.vs_peer)] for r in rows]
    return report.table(["", "case", "unit", "packload path", "packload, median [min–max]", "rounds",
                         "baseline, median", "× baseline", "best peer, median", "× best peer"], body, left=4)


def losses(rows: Sequence[Row]) -> str:
    """Every headline row where packload is slower than the baseline or the best peer (< 1×)."""
    lines = []
    for r in rows:
        for who, s, x in ((r.baseline, r.baseline_stats, r.vs_baseline), (r.peer, r.peer_stats, r.vs_peer)):
            if x is not None and x < 1.0:
                noise = " (within the noise of this machine)" if x >= 0.95 else ""
                rounds = ("; round by round (both in the same round): "
                          + ", ".join(f"{v:.2f}×" for v in r.per_round)) if r.per_round and who == r.peer else ""
                lines.append(f"- {r.section}, {r.case}: packload {r.packload} {report.spread(r.stats)} {r.unit} "
                             f"against {who} {report.num(s['median'])}: **{x:.2f}×**{noise}{rounds}.")
    return "\n".join(lines) if lines else "- No headline row of this run is below 1×."


def _versions(d: dict[str, Any]) -> str:
    keep = ("python", "torch", "numpy", "pillow", "lmdb", "simplejpeg")
    return ", ".join(f"{k} {d['versions'][k]}" for k in keep if d.get("versions", {}).get(k))


def _os(text: str) -> str:
    """``Linux 6.18.44-custom`` -> ``Linux 6.18``: the kernel's build suffix says nothing useful here."""
    m = re.match(r"(\S+ \d+\.\d+)", text)
    return m.group(1) if m else text


def machine_block(data: dict[str, Any]) -> str:
    """The machine, versions, date, duration and load of the run."""
    run, session = data["run"], data["session"]
    d = run.get("machine", {}).get("describe") or session.get("machine") or {}
    lines = []
    if d:
        fs = d.get("filesystem", {})
        rot = {True: "reported as rotational", False: "non-rotational"}.get(fs.get("rotational"), "rotational: ?")
        meta = [part.get("meta", {}) for part in (run.get(k, {}) for k in ("machine", "pack", "read")) if part]
        commits = sorted({m.get("packload", {}).get("commit") or "?" for m in meta}) or ["?"]
        dirty = max((len(m.get("packload", {}).get("uncommitted_library_files", [])) for m in meta), default=0)
        peers = dict((session.get("machine") or d).get("peer_versions", {}))
        lines += [
            f"- **Machine:** {d.get('cpu', '?')}, {d.get('logical_cores', '?')} logical cores "
            f"({d.get('usable_cores', '?')} usable), {d.get('ram_gb', '?')} GB RAM, {_os(d.get('os', '?'))}; data on "
            f"{fs.get('fstype', '?')} ({rot}).",
            f"- **Versions:** {_versions(d)}; packload {d.get('versions', {}).get('packload', '?')} at commit "
            f"{', '.join(commits)}" + (f" (+{dirty} uncommitted library files)" if dirty else "") + ".",
            "- **Peers:** " + ", ".join(f"{PEERS.get(k, 'FFCV' if k == 'ffcv' else k)} {v or 'not installed'}"
                                        for k, v in peers.items()) + ".",
        ]
    else:
        lines.append("- **Machine:** not recorded.")
    loads = [s[1] for s in session.get("loadavg", {}).get("samples", [])]
    minutes = sum(s.get("minutes", 0) for s in session.get("steps", []))
    lines.append(f"- **Run:** {session.get('date', '?')[:16].replace('T', ' ')} UTC, {minutes:.0f} min"
                 + (f"; 1-minute load average {min(loads):.1f}–{max(loads):.1f} (median "
                    f"{statistics.median(loads):.1f}) over {len(loads)} samples, every "
                    f"{session['loadavg']['interval_s']:g} s" if loads else "") + ".")
    return "\n".join(lines)


def command_block(data: dict[str, Any]) -> str:
    """The one command, and the three it ran."""
    session = data["session"]
    steps = "\n".join(f"#   {s['command']}" for s in session.get("steps", []))
    return "```\n" + f"{session.get('command', '.venv-peers/bin/python benchmarks/page.py --run')}\n" \
        + ("# which ran, one after the other:\n" + steps + "\n" if steps else "") + "```"


def blocks(data: dict[str, Any]) -> dict[str, str]:
    """Every generated block of the page, by marker name."""
    rows = all_rows(data)
    return {"machine": machine_block(data), "command": command_block(data), "headline": headline_table(rows),
            "losses": losses(rows)}


_BLOCK = re.compile(r"(<!-- BEGIN GENERATED: ([\w-]+)[^>]*-->\n)(.*?)(<!-- END GENERATED: \2 -->)", re.S)


def fill(page: str, generated: dict[str, str]) -> str:
    """``page`` with the text between each pair of markers replaced by its block."""
    found = set()

    def sub(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in generated:
            raise ValueError(f"no generator for the block {name!r}")
        found.add(name)
        return m.group(1) + generated[name].rstrip("\n") + "\n" + m.group(4)

    out = _BLOCK.sub(sub, page)
    missing = sorted(set(generated) - found)
    if missing:
        raise ValueError(f"the page has no markers for: {', '.join(missing)}")
    return out


# ---------------------------------------------------------------- the chart (Pillow only)

CHART_WIDTH = 1000
CHART_TOP = 78
CHART_ROW = 40
CHART_BOTTOM = 46
CHART_LEFT = 380
CHART_RIGHT = 30
BLUE, GREY, INK, RULE = (31, 119, 180), (150, 150, 150), (30, 30, 30), (215, 215, 215)


def chart_size(n_rows: int) -> tuple[int, int]:
    """Width and height of the chart for ``n_rows`` read rows."""
    return CHART_WIDTH, CHART_TOP + max(1, n_rows) * CHART_ROW + CHART_BOTTOM


def _font(size: int) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: the bitmap font, one size
        return ImageFont.load_default()


def chart(rows: Sequence[Row]) -> Any:
    """A PIL image: each read row's packload and best-peer medians as multiples of the baseline's
    median (log scale), min-max whiskers, the baseline at 1x (ASCII only: the default font lacks ×)."""
    from PIL import Image, ImageDraw

    rows = [r for r in rows if r.section.startswith("read") and r.baseline_stats]
    width, height = chart_size(len(rows))
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    small, normal = _font(12), _font(14)
    base = [r.baseline_stats["median"] for r in rows]  # type: ignore[index]
    values = [v / b for r, b in zip(rows, base, strict=True) for s in (r.stats, r.peer_stats) if s
              for v in (s["min"], s["max"])] or [1.0]
    lo = min(0.5, min(values) / 1.2)
    hi = max(2.0, max(values) * 1.2)
    ticks = [t * 10 ** e for e in range(-2, 4) for t in (1, 2, 5) if lo <= t * 10 ** e <= hi]
    x0, x1 = CHART_LEFT, width - CHART_RIGHT

    def x(v: float) -> float:
        return x0 + (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * (x1 - x0)

    draw.text((12, 10), "Read speed as a multiple of the ImageFolder-style baseline (FolderImages), log scale",
              font=normal, fill=INK)
    n = max((r.stats["n"] for r in rows), default=0)
    draw.text((12, 32), f"bars: median of {n} interleaved rounds; whiskers: min to max; all from one run on one machine",
              font=small, fill=INK)
    draw.rectangle((x0, 56, x0 + 12, 66), fill=BLUE)
    draw.text((x0 + 18, 54), "packload", font=small, fill=INK)
    draw.rectangle((x0 + 100, 56, x0 + 112, 66), fill=GREY)
    draw.text((x0 + 118, 54), "best peer (LitData, WebDataset or MosaicML Streaming)", font=small, fill=INK)
    bottom = CHART_TOP + len(rows) * CHART_ROW
    for t in ticks:
        draw.line((x(t), CHART_TOP - 4, x(t), bottom), fill=RULE)
        label = f"{t:g}x"
        draw.text((x(t) - draw.textlength(label, font=small) / 2, bottom + 6), label, font=small, fill=INK)
    for i, (r, b) in enumerate(zip(rows, base, strict=True)):
        top = CHART_TOP + i * CHART_ROW
        if i:
            draw.line((12, top, x1, top), fill=RULE)
        case = r.case.replace("`", "")
        draw.text((12, top + 5), f"{r.section.removeprefix('read, ')}: {case.split(',')[0]}", font=small, fill=INK)
        draw.text((12, top + 21), ", ".join(case.split(", ")[1:])[:56], font=small, fill=INK)
        for j, (s, colour) in enumerate(((r.stats, BLUE), (r.peer_stats, GREY))):
            if not s:
                continue
            y = top + 7 + j * 14
            draw.rectangle((x(lo), y, x(s["median"] / b), y + 11), fill=colour)
            draw.line((x(s["min"] / b), y + 5, x(s["max"] / b), y + 5), fill=INK)
            for v in (s["min"], s["max"]):
                draw.line((x(v / b), y + 2, x(v / b), y + 9), fill=INK)
            label = f"{s['median'] / b:.2f}x"
            draw.text((max(x(s["median"] / b), x(s["max"] / b)) + 5, y - 1), label, font=small, fill=INK)
    draw.line((x(1), CHART_TOP - 4, x(1), bottom), fill=INK, width=2)
    draw.text((x(1) - draw.textlength("baseline", font=small) / 2, bottom + 22), "baseline", font=small, fill=INK)
    return img


def chart_bytes(rows: Sequence[Row]) -> bytes:
    import io

    buffer = io.BytesIO()
    chart(rows).save(buffer, format="PNG")
    return buffer.getvalue()


def generate(results: Path, page: Path, chart_path: Path) -> tuple[str, bytes]:
    """The page's new text and the chart's PNG bytes (nothing written)."""
    data = load(results)
    return fill(page.read_text(), blocks(data)), chart_bytes(all_rows(data))


# ---------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/page.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS, help="the raw JSON (default benchmarks/results)")
    p.add_argument("--page", type=Path, default=PAGE, help="the page whose generated blocks are rewritten")
    p.add_argument("--chart", type=Path, default=None, help="the chart PNG (default RESULTS/headline.png)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page or chart would change")
    p.add_argument("--run", action="store_true", help="run the headline set first (needs the peer venv)")
    p.add_argument("--data", type=Path, default=Path("bench-data"), help="--run: the datasets (made when missing)")
    p.add_argument("--scratch", type=Path, default=Path("bench-results") / "headline",
                   help="--run: packs, peer outputs and the harness's own results")
    p.add_argument("--repeats", type=int, default=REPEATS, help="--run: interleaved rounds")
    args = p.parse_args(argv)
    if args.run:
        code = run_headline(args.data, args.scratch, args.results, args.repeats)
        if code:
            return code
    chart_path = args.chart or args.results / CHART
    text, png = generate(args.results, args.page, chart_path)
    if args.check:
        stale = [str(p) for p, new in ((args.page, text.encode()), (chart_path, png))
                 if not p.exists() or p.read_bytes() != new]
        for path in stale:
            print(f"{path}: out of date; run python benchmarks/page.py", file=sys.stderr)
        return 1 if stale else 0
    for path, new in ((args.page, text.encode()), (chart_path, png)):
        if not path.exists() or path.read_bytes() != new:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(new)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
