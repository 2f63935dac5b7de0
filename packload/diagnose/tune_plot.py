"""The tuner's picture: samples/s against num_workers, one line per prefetch_factor (and pin_memory),
with the GPU step's own rate as a horizontal line, so "where does the loader catch the GPU" is
visible at a glance. Each point is a configuration's figure as the report's table shows it (its
median trial), PackLoader's threads a line of their own. matplotlib is imported here only, and only
when a plot is asked for."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from packload.core.errors import PackloadError
from packload.diagnose.tune_search import PREFETCH_DEFAULT
from packload.diagnose.tune_trials import Trial, aggregate


class Tuned(Protocol):
    """What the plot reads of a ``tune.TuneResult`` (named here: the tuner imports this module)."""

    trials: list[Trial]
    winner: Trial
    step_samples_per_s: float
    step: dict[str, Any]
    dataset: str
    batch_size: int
    verdict: str
    fast_path: dict[str, Any] | None


class PlotUnavailableError(PackloadError, RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    """Refuse at once, before any search, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailableError("--plot needs matplotlib: pip install matplotlib (or leave out --plot; the "
                                   "rest of tune works without it)") from None


def plot_result(result: Tuned, path: str | os.PathLike[str]) -> Path:
    """Write the plot of ``result`` to ``path`` (PNG, or any format matplotlib knows by suffix): the
    median of each configuration's repeats, their spread as error bars, integer worker ticks."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    merged = aggregate(result.trials)
    spread: dict[tuple[int, int | None, bool], tuple[float, float]] = {}
    for trial in result.trials:
        if trial.valid:
            low, high = spread.get(trial.key, (trial.samples_per_s, trial.samples_per_s))
            spread[trial.key] = (min(low, trial.samples_per_s), max(high, trial.samples_per_s))
    series: dict[tuple[int | None, bool], list[tuple[int, float]]] = {}
    for (workers, prefetch, pin), trial in merged.items():
        series.setdefault((prefetch, pin), []).append((workers, trial.samples_per_s))
    no_workers = [(w, r) for (pf, _), points in series.items() if pf is None for w, r in points]
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    for (prefetch, pin), points in sorted(series.items(), key=lambda item: (item[0][0] or 0, item[0][1])):
        if prefetch is None:
            continue
        main = prefetch == PREFETCH_DEFAULT  # the searched series; other depths are single checks
        points = sorted(points + (series.get((None, pin), []) if main else []))  # its own main-process point
        label = f"prefetch_factor={prefetch}" + (", pinned" if pin else "")
        keys = [(w, None if w == 0 else prefetch, pin) for w, _ in points]
        below = [r - spread.get(k, (r, r))[0] for k, (_, r) in zip(keys, points, strict=True)]
        above = [spread.get(k, (r, r))[1] - r for k, (_, r) in zip(keys, points, strict=True)]
        axes.errorbar([w for w, _ in points], [r for _, r in points], yerr=[below, above], capsize=3,
                      marker="o" if main else "s", linestyle="-" if main else ":", label=label)
    if not any(pf is not None for pf, _ in series):
        axes.plot([w for w, _ in no_workers], [r for _, r in no_workers], marker="o", label="num_workers=0")
    fast = result.fast_path or {}
    measured = [t for t in fast.get("trials") or [] if t["batches"] and t["samples_per_s"] > 0]
    if measured:
        axes.plot([t["num_workers"] for t in measured], [t["samples_per_s"] for t in measured], marker="^",
                  linestyle="-.", label="PackLoader (threads)")
    axes.axhline(result.step_samples_per_s, color="grey", linestyle="--",
                 label=f"GPU step alone ({result.step_samples_per_s:,.0f}/s)")
    axes.plot([result.winner.num_workers], [result.winner.samples_per_s], marker="*", markersize=16,
              color="crimson", linestyle="none", label="pick")
    axes.set_xlabel("num_workers (PackLoader: threads)" if measured else "num_workers")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel("samples/s (loader + GPU step)")
    step = f"{result.step['step_ms']:g} ms step" if result.step.get("step_ms") else str(result.step.get("model"))
    loop = "sync loop" if result.step.get("sync") else "async loop"
    axes.set_title(f"packload tune: {result.dataset}, batch {result.batch_size}, {step} ({loop}): {result.verdict}",
                   fontsize=9)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    target = Path(path)
    figure.savefig(target)
    plt.close(figure)
    return target
