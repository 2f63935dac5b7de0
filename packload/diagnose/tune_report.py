"""A tune's report for a terminal: the step, one row per trial in a table, the pick, the verdict,
an epoch's time and PackLoader's trials. Every figure is the one trial's measurement that the
table shows in its row, the same number wherever the report repeats it."""

from __future__ import annotations

from typing import Any

from packload.core.display import plural
from packload.diagnose.tune_result import TuneResult
from packload.diagnose.tune_trials import Trial, aggregate, rate_text


def _worker_memory(trial: Trial | dict[str, Any]) -> str:
    """The workers' proportional share of memory (PSS: shared pages such as the CUDA libraries a
    forked worker maps count once, not once per worker); RSS, marked, where PSS cannot be read."""
    pss = trial["worker_pss_mb"] if isinstance(trial, dict) else trial.worker_pss_mb
    rss = trial["worker_rss_mb"] if isinstance(trial, dict) else trial.worker_rss_mb
    if pss:
        return f"{pss:.0f} MB"
    return f"{rss:.0f} MB RSS" if rss else "-"


TABLE_HEAD = ("     #  workers  prefetch  pin        img/s  batches/s  GPU waits  CPU cores  start-up  worker PSS  "
              "phase")


def trial_row(number: int, trial: Trial | dict[str, Any], mark: str = "") -> str:
    """One trial as a row of the table (numbered from 1); its rate written as everywhere else."""
    t = trial if isinstance(trial, dict) else trial.as_dict()
    row = (f"  {number:4d}  {t['num_workers']:7d}  {t['prefetch_factor'] or '-':>8}  {'yes' if t['pin_memory'] else 'no':>3}  "
           f"{rate_text(t['samples_per_s']) if t['batches'] else 'none':>13}  {t['batches_per_s']:9.2f}  "
           f"{t['gpu_wait']:9.0%}  {t['cpu_cores']:9.1f}  {t['startup_s']:7.2f}s  {_worker_memory(t):>10}  "
           f"{t['phase']}")
    return row + (f" ({t['note']})" if t["note"] else "") + (f"  <- {mark}" if mark else "")


def _fast_path_lines(result: TuneResult) -> list[str]:
    """PackLoader's trials (threads in place of workers) and its pick against the DataLoader pick."""
    fast = result.fast_path
    if not fast:
        return []
    if fast.get("pick") is None:
        return [f"  fast path (PackLoader): {fast.get('note', 'not measured')}"]
    chosen = fast.get("pick_index")
    lines = ["  PackLoader, batches built by threads of the training process (workers = its threads):"]
    lines += [trial_row(k + 1, t, "its pick" if k == chosen else "") for k, t in enumerate(fast["trials"])]
    ratio = fast["samples_per_s"] / result.winner.samples_per_s if result.winner.samples_per_s else float("inf")
    head = (f"  fast path: PackLoader with {plural(fast['threads'], 'thread')}: {rate_text(fast['samples_per_s'])}, "
            f"{ratio:.2f}x the DataLoader pick")
    if result.fast_path_wins():
        return [*lines, head + "; use it:", f"    {fast['code']}"]
    return [*lines, head + "; the DataLoader pick is as fast or faster here: keep it"]


def _marks(trials: list[Trial]) -> dict[int, str]:
    """For each configuration measured more than once, the row (numbered from 1) whose figure stands
    for it: ``median of #3, #5``."""
    rows: dict[Any, list[int]] = {}
    for k, t in enumerate(trials, 1):
        if t.valid:
            rows.setdefault(t.key, []).append(k)
    chosen = aggregate(trials)
    return {trials.index(chosen[key]) + 1: "median of " + ", ".join(f"#{k}" for k in numbers)
            for key, numbers in rows.items() if len(numbers) > 1}


def format_report(result: TuneResult) -> list[str]:
    """The result for a terminal: the step, every trial (one row each), the pick, the verdict, an
    epoch's time. The pick and the fastest are rows of the table, shown with that row's figure."""
    pick_row, fastest_row = result.trials.index(result.winner) + 1, result.trials.index(result.fastest) + 1
    lines = [f"packload tune: {plural(result.samples_per_epoch, 'sample')} per epoch, batch {result.batch_size}; "
             f"{result.step['description']}",
             f"  the GPU step alone: {rate_text(result.step_samples_per_s)} "
             f"({result.step_samples_per_s / result.batch_size:,.1f} batches/s)",
             f"  transform timed: {result.transform}",
             TABLE_HEAD]
    marks = _marks(result.trials)
    for k, t in enumerate(result.trials, 1):
        role = "pick" if k == pick_row else "fastest" if k == fastest_row else ""
        lines.append(trial_row(k, t, ", ".join(m for m in (role, marks.get(k, "")) if m)))
    pin = result.not_measured.get("pin_memory")
    settings = ", ".join(f"{k}={v}" + (f" [{pin}]" if k == "pin_memory" and pin else "")
                         for k, v in result.settings.items())
    within = ("the fastest configuration" if pick_row == fastest_row else
              f"the cheapest within {result.tolerance:.0%} of the fastest (#{fastest_row}: "
              f"{rate_text(result.fastest.samples_per_s)})")
    lines += [f"  pick (#{pick_row}): {settings}: {rate_text(result.winner.samples_per_s)}, {within}",
              f"  verdict: {result.message}",
              f"  one epoch: {result.epoch_s:,.1f} s at {rate_text(result.winner.samples_per_s)}"
              + (f" (plus {result.winner.startup_s:.1f} s of worker start-up in the first epoch; "
                 "persistent_workers saves it in the next ones)" if result.winner.num_workers else "")
              + (f"; with PackLoader {result.samples_per_epoch / result.fast_path['samples_per_s']:,.1f} s"
                 if result.fast_path_wins() and result.fast_path else "")]
    lines += _fast_path_lines(result)
    if result.broken:
        shown = "; ".join(f"{b['path']} ({b['reason']})" for b in result.broken[:5])
        more = f"; and {len(result.broken) - 5} more" if len(result.broken) > 5 else ""
        lines.append(f"  left out {plural(len(result.broken), 'broken file')}, as pack would skip them: {shown}{more}")
    lines += [f"  skipped {reason}" for reason in result.skipped]
    lines += [f"  note: {note}" for note in result.notes]
    lines.append(f"  {plural(len(result.trials), 'trial')} in {result.elapsed_s:.1f} s of a {result.budget_s:g} s "
                 f"budget; the worker search ended: {result.stopped}")
    return lines
