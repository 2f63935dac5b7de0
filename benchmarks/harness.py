"""The measuring core: a declared grid of cases, run interleaved, summarised as plain dicts.

A :class:`Case` is one contender in one setting (``run`` returns a dict of figures, one of them the
``primary`` metric). :func:`run_grid` gives every case its warm-up runs, then runs the repeats in
rounds, A B C A B C ..., so that a noisy machine affects every contender alike, and records the
peak RSS of this process plus its children during each run. :func:`summarize` gives the median and
spread, :func:`add_ratios` the ratios against a named baseline.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

try:  # optional: a better peak RSS (sampled sum over the process tree)
    import psutil
except ImportError:  # pragma: no cover - depends on the environment
    psutil = None

Figures = dict[str, Any]


@dataclass
class Case:
    """One contender in one setting.

    ``run`` does the measured work and returns its figures (it times itself; ``primary`` names the
    figure that ranks the cases; ``measure_rss=False`` when it reports its own ``peak_*`` figures). ``setup`` runs before every run, untimed (e.g. cache eviction) and
    may return figures that are kept with the run (e.g. the eviction check).
    """

    name: str
    run: Callable[[], Figures]
    primary: str
    higher_is_better: bool = True
    setup: Callable[[], Figures | None] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    skip_reason: str | None = None
    measure_rss: bool = True  # False when ``run`` measures its own peak (e.g. in a child process)


# ---------------------------------------------------------------- statistics


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default method) of already sorted values."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, float | int]:
    """Median, min, max, quartiles, IQR and relative spread ((max-min)/median) of ``values``."""
    vals = sorted(float(v) for v in values)
    if not vals:
        raise ValueError("summarize() needs at least one value")
    median = statistics.median(vals)
    q1, q3 = _quantile(vals, 0.25), _quantile(vals, 0.75)
    return {
        "n": len(vals),
        "median": median,
        "min": vals[0],
        "max": vals[-1],
        "q1": q1,
        "q3": q3,
        "iqr": q3 - q1,
        "rel_spread": (vals[-1] - vals[0]) / median if median else float("nan"),
    }


def ratio(value: float | None, base: float | None, higher_is_better: bool = True) -> float | None:
    """How many times better ``value`` is than ``base`` (>1 is better), None when either is missing."""
    if value is None or base is None or value <= 0 or base <= 0:
        return None
    return value / base if higher_is_better else base / value


def add_ratios(results: list[Figures], baseline: str, key: str = "ratio", metric: str = "median") -> None:
    """Add ``results[i][key]``: each case's ``metric`` against the case named ``baseline`` (in place)."""
    base = next((r for r in results if r["name"] == baseline), None)
    base_value = base["stats"][metric] if base and base.get("stats") else None
    for r in results:
        value = r["stats"][metric] if r.get("stats") else None
        r[key] = ratio(value, base_value, r.get("higher_is_better", True))
        r[f"{key}_vs"] = baseline


# ---------------------------------------------------------------- peak RSS


def _mb(value: int | None) -> float | None:
    return None if value is None else value / 1e6


def _smaps_pss(pid: int) -> tuple[int, int] | None:
    """(Pss, Pss_Anon) in bytes from ``/proc/PID/smaps_rollup`` (Linux), or None where unavailable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            fields = dict(line.split(":", 1) for line in f if line[:4] == "Pss:" or line.startswith("Pss_Anon:"))
    except (OSError, ValueError):
        return None
    if "Pss" not in fields:
        return None
    kb = {k: int(v.split()[0]) * 1024 for k, v in fields.items()}
    return kb["Pss"], kb.get("Pss_Anon", kb["Pss"])


class PeakRSS:
    """Peak memory of this process plus all its children while the block runs.

    With psutil the process tree is sampled every ``interval`` seconds and summed: ``peak_rss_mb``
    (plain RSS: pages shared between a parent and its forked workers, or a pack mapped by every
    worker, are counted once per process), and where Linux gives it, ``peak_pss_mb`` (proportional:
    shared pages split between the processes that map them, so the sum is the real footprint) and
    ``peak_pss_anon_mb`` (PSS without file-backed pages: heap and buffers, not the page cache of a
    mapped pack). ``peak_growth_mb``: peak PSS (else RSS) minus this process's own at the start.
    Without psutil: ``resource.getrusage``, i.e. this process's lifetime peak plus the largest
    reaped child's peak (said in ``rss_method``).

    PSS is read every ``pss_interval`` seconds only: ``smaps_rollup`` walks every page a process
    maps, so for a reader that maps a whole pack, reading it every 50 ms cost 13-20 % of the
    reader's rate (and almost nothing for a reader that maps little), which would tilt the
    comparison; RSS (cheap) is read every ``interval``.
    """

    def __init__(self, interval: float = 0.05, pss_interval: float = 0.25) -> None:
        self.interval = interval
        self.pss_interval = pss_interval
        self.peak_rss = 0
        self.peak_pss: int | None = None
        self.peak_pss_anon: int | None = None
        self.start = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        me = psutil.Process(os.getpid())
        next_pss = 0.0
        while True:
            rss = pss = anon = 0
            pss_ok = with_pss = time.monotonic() >= next_pss
            if with_pss:
                next_pss = time.monotonic() + self.pss_interval
            try:
                procs = [me, *me.children(recursive=True)]
            except psutil.Error:
                procs = [me]
            for p in procs:
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    continue
                if not with_pss:
                    continue
                both = _smaps_pss(p.pid)
                if both is None:
                    pss_ok = pss_ok and not p.is_running()
                    continue
                pss += both[0]
                anon += both[1]
            self.peak_rss = max(self.peak_rss, rss)
            if pss_ok:
                self.peak_pss = max(self.peak_pss or 0, pss)
                self.peak_pss_anon = max(self.peak_pss_anon or 0, anon)
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> PeakRSS:
        if psutil is not None:
            own = _smaps_pss(os.getpid())
            self.start = own[0] if own else psutil.Process(os.getpid()).memory_info().rss
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def figures(self) -> Figures:
        """The peaks in MB, and how they were measured."""
        if psutil is not None:
            peak = self.peak_pss if self.peak_pss is not None else self.peak_rss
            return {"peak_rss_mb": _mb(self.peak_rss), "peak_pss_mb": _mb(self.peak_pss),
                    "peak_pss_anon_mb": _mb(self.peak_pss_anon), "start_mb": _mb(self.start),
                    "peak_growth_mb": max(0, peak - self.start) / 1e6,
                    "rss_method": "psutil + smaps_rollup: sampled sum over the process tree"
                    if self.peak_pss is not None else "psutil: sampled RSS sum over the process tree"}
        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
        child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale
        return {"peak_rss_mb": (own + child) / 1e6, "peak_pss_mb": None, "peak_pss_anon_mb": None,
                "rss_method": "getrusage: lifetime peak of main + largest child (no psutil)"}


# ---------------------------------------------------------------- the grid


def _one(case: Case, phase: str, log: Callable[[str], None] | None) -> Figures:
    """Set up and run ``case`` once; an exception becomes ``{"error": ...}``."""
    figures: Figures = {"phase": phase}
    try:
        if case.setup is not None:
            figures["setup"] = case.setup() or {}
        figures["loadavg_1m"] = os.getloadavg()[0]  # other load on the machine when the run started
        with PeakRSS() if case.measure_rss else contextlib.nullcontext() as peak:
            started = time.perf_counter()
            figures.update(case.run())
            figures["wall_s"] = time.perf_counter() - started
        if peak is not None:
            figures.update(peak.figures())
    except Exception as exc:  # a failing contender is reported, never dropped
        figures["error"] = f"{type(exc).__name__}: {exc}"
        figures["traceback"] = traceback.format_exc(limit=6)
    if log is not None:
        shown = figures.get("error") or f"{case.primary}={figures.get(case.primary)!s:.10}"
        log(f"  [{phase}] {case.name}: {shown}")
    return figures


def run_grid(cases: Sequence[Case], repeats: int = 3, warmup: int = 1,
             log: Callable[[str], None] | None = None) -> list[Figures]:
    """Run every case ``warmup`` times, then ``repeats`` rounds of all cases interleaved.

    Returns one plain dict per case: name, info, every run's figures, ``stats`` (the primary
    metric's :func:`summarize`), the median of every other numeric figure, and ``error`` or
    ``skipped`` when it could not run. A case that fails is not run again.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats {repeats} must be >= 1 and warmup {warmup} >= 0")
    runs: dict[str, list[Figures]] = {c.name: [] for c in cases}
    warm: dict[str, list[Figures]] = {c.name: [] for c in cases}
    errors: dict[str, str] = {}
    if len(runs) != len(cases):
        raise ValueError("case names must be unique")

    def live() -> list[Case]:
        return [c for c in cases if c.skip_reason is None and c.name not in errors]

    for i in range(warmup):
        for case in live():
            figures = _one(case, f"warmup {i + 1}", log)
            warm[case.name].append(figures)
            if "error" in figures:
                errors[case.name] = figures["error"]
    for i in range(repeats):
        for case in live():
            figures = _one(case, f"run {i + 1}", log)
            runs[case.name].append(figures)
            if "error" in figures:
                errors[case.name] = figures["error"]

    results = []
    for case in cases:
        good = [r for r in runs[case.name] if "error" not in r and r.get(case.primary) is not None]
        result: Figures = {
            "name": case.name,
            "info": case.info,
            "primary": case.primary,
            "higher_is_better": case.higher_is_better,
            "runs": runs[case.name],
            "warmup_runs": warm[case.name],
            "stats": summarize([r[case.primary] for r in good]) if good else None,
        }
        if good:
            result["medians"] = _medians(good)
        if case.skip_reason is not None:
            result["skipped"] = case.skip_reason
        if case.name in errors:
            result["error"] = errors[case.name]
        results.append(result)
    return results


def _medians(runs: list[Figures]) -> Figures:
    """Median of every numeric figure over ``runs`` (peak memory: the maximum)."""
    keys = {k for r in runs for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    out: Figures = {}
    for key in sorted(keys):
        values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
        out[key] = max(values) if key.startswith("peak_") else statistics.median(values)
    return out


def best_of(results: list[Figures], names: Sequence[str] | None = None) -> Figures | None:
    """The result with the best median among ``names`` (all when None), or None when none ran."""
    pool = [r for r in results if r.get("stats") and (names is None or r["name"] in names)]
    if not pool:
        return None
    sign = 1 if pool[0].get("higher_is_better", True) else -1
    return max(pool, key=lambda r: sign * r["stats"]["median"])
