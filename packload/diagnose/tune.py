"""``tune``: the DataLoader settings that keep a GPU fed, measured on this machine.

``tune(dataset, batch_size=256, step_ms=120)`` feeds batches to a dummy training step of that
length (``packload.diagnose.gpu_step.DummyStep``: real GPU work on CUDA, a CPU-free wait elsewhere;
``training_loop.DEFAULT_STEP_MS`` when no step is given, said in the verdict) and searches
``num_workers``, ``prefetch_factor`` and, on CUDA, ``pin_memory`` within a time budget
(``packload.diagnose.tune_search``). It picks the cheapest configuration within a few percent of the fastest,
says whether training is input-bound or compute-bound, and projects an epoch's time.
``persistent_workers`` never changes the steady rate; it saves the worker start-up that every
trial measures, at each epoch after the first, so it is set whenever there are workers.

Every figure the report shows is one trial's measurement: the progress lines, the table (one row
per trial), the plot, ``--json``, the pick and the verdict all show the same number for a trial,
and a configuration measured more than once is represented by its median trial (see
``tune_search.aggregate``), so the pick is always a row of the table.

    result = tune(ds, batch_size=256, step_ms=120)
    loader = result.make_loader(ds)                 # a DataLoader with the winning settings
    result.save("loader.json")                      # later: DataLoader(ds, **load_loader_config(...))
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from packload.core.cpus import usable_cores
from packload.core.display import plural
from packload.core.errors import PackloadError
from packload.core.format import PARTIAL_SUFFIX
from packload.core.progress import progress_bar, progress_line
from packload.diagnose.data_files import cached_share, dataset_files
from packload.diagnose.gpu_step import DummyStep, iter_tensors
from packload.diagnose.loader_config import CONFIG_KEY, CONFIG_VERSION
from packload.diagnose.loader_memory import MemoryGuard, batch_nbytes
from packload.diagnose.measure import machine_info
from packload.diagnose.training_loop import DEFAULT_STEP_MS, DEFAULT_SYNC, assumed, resolve_step
from packload.diagnose.tune_search import (
    CAP_REACHED,
    DESCRIPTORS_REACHED,
    WAITING_CAP,
    Cycle,
    Search,
    Trial,
    TrialRunner,
    aggregate,
    descriptor_workers,
    rate_text,
    select,
)
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.folder import FolderImages

__all__ = ["DEFAULT_STEP_MS", "Trial", "TuneError", "TuneResult", "format_report", "tune"]

DEFAULT_TOLERANCE = 0.04  # configurations within 4% of the fastest count as equally fast
COMPUTE_BOUND_WAIT = 0.10  # the GPU waiting less than this share of the time: compute-bound
CPU_BOUND_SHARE = 0.85  # the loader keeping this share of the usable cores busy: the CPU is the limit
CACHED_SHARE = 0.9  # the data's pages in the page cache, before and after the search: read from memory


class TuneError(PackloadError, RuntimeError):
    """The search could not measure anything (a budget too small for even one trial)."""


@dataclass
class TuneResult:
    """Every trial, the pick (``settings``, ``winner``), the verdict and the projection of an epoch.

    ``winner`` and ``fastest`` are trials of ``trials`` (each configuration's median measurement), so
    their figures are rows of the report."""

    batch_size: int
    samples_per_epoch: int
    step: dict[str, Any]
    step_samples_per_s: float
    trials: list[Trial]
    winner: Trial
    fastest: Trial
    settings: dict[str, Any]
    verdict: str  # "input-bound" or "compute-bound"
    message: str
    epoch_s: float
    not_measured: dict[str, str]
    stopped: str
    skipped: list[str]
    notes: list[str]
    elapsed_s: float
    budget_s: float
    max_workers: int
    tolerance: float
    machine: dict[str, Any]
    transform: str = ""  # the dataset's transform that was timed, as the report names it
    dataset: str = ""  # what was read: the pack's or folder's path, or the dataset's class
    fast_path: dict[str, Any] | None = None  # PackLoader's threads, when measured (``packload tune PACK``)
    broken: list[dict[str, str]] = field(default_factory=list)  # files of a folder left out as pack skips them
    page_cache: dict[str, float | None] = field(default_factory=dict)  # share of the data cached, before/after
    cpu_others: float | None = None  # cores other processes kept busy during the search (load average)
    worker_limit: str = ""  # what bounded the workers tried: "max_workers 4" or "2 usable cores"
    source: str = ""  # "pack", "folder" or "" (another dataset): what the advice can name
    collate_fn: Callable[[Any], Any] | None = field(default=None, repr=False, compare=False)
    sampler: Sampler[int] | None = field(default=None, repr=False, compare=False)

    def loader_kwargs(self) -> dict[str, Any]:
        """The winning DataLoader arguments, batch size included."""
        return {"batch_size": self.batch_size, **self.settings}

    def make_loader(self, dataset: Dataset, sampler: Sampler[int] | None = None,
                    collate_fn: Callable[[Any], Any] | None = None, **overrides: Any) -> DataLoader:
        """A DataLoader over ``dataset`` with the winning settings (``overrides`` win over them).
        The sampler and collate function default to the ones tuned with (for a pack, its
        ``sampler()``; otherwise a shuffle)."""
        return make_loader(dataset, self.loader_kwargs(), sampler if sampler is not None else self.sampler,
                           collate_fn if collate_fn is not None else self.collate_fn, **overrides)

    def as_dict(self) -> dict[str, Any]:
        """Everything but the callables, JSON-ready; ``winner_index`` and ``fastest_index`` say which
        of ``trials`` the pick and the fastest are."""
        plain = {name: getattr(self, name) for name in self.__dataclass_fields__
                 if name not in ("collate_fn", "sampler", "trials", "winner", "fastest")}
        return {**plain, "loader": self.loader_kwargs(), "winner": self.winner.as_dict(),
                "winner_index": self.trials.index(self.winner), "fastest": self.fastest.as_dict(),
                "fastest_index": self.trials.index(self.fastest), "trials": [t.as_dict() for t in self.trials]}

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.as_dict(), indent=indent, default=str)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the winning DataLoader arguments, what they achieved and the machine they were
        measured on; ``load_loader_config(path)`` reads them back."""
        document = {CONFIG_KEY: CONFIG_VERSION, "loader": self.loader_kwargs(),
                    "measured": {"samples_per_s": round(self.winner.samples_per_s, 1),
                                 "step_samples_per_s": round(self.step_samples_per_s, 1),
                                 "gpu_wait": round(self.winner.gpu_wait, 3), "verdict": self.verdict,
                                 "step": self.step["description"], "startup_s": round(self.winner.startup_s, 3)},
                    "not_measured": self.not_measured, "machine": self.machine}
        target = Path(path)
        partial = target.with_name(target.name + PARTIAL_SUFFIX)
        partial.write_text(json.dumps(document, indent=2) + "\n")
        partial.replace(target)
        return target

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """Throughput against num_workers per prefetch setting, the GPU step's rate as a line (PNG);
        needs matplotlib."""
        from packload.diagnose.tune_plot import plot_result

        return plot_result(self, path)

    def fast_path_wins(self) -> bool:
        """Whether PackLoader was measured faster than the DataLoader pick beyond the tolerance."""
        fast = self.fast_path
        return bool(fast and fast.get("pick") is not None
                    and fast["samples_per_s"] > (1 + self.tolerance) * self.winner.samples_per_s)

    def conclude(self) -> None:
        """Set ``verdict`` and ``message`` from the measurements (again, once ``fast_path`` is measured)."""
        self.verdict, self.message = _verdict(self)


def make_loader(dataset: Dataset, kwargs: dict[str, Any], sampler: Sampler[int] | None = None,
                collate_fn: Callable[[Any], Any] | None = None, **overrides: Any) -> DataLoader:
    """A DataLoader with ``kwargs`` (as ``load_loader_config`` returns them)."""
    args = {**kwargs, **overrides}
    if sampler is None and "shuffle" not in args:
        if isinstance(dataset, PackedImageFolder):
            sampler = dataset.sampler()
        else:
            args["shuffle"] = True
    return DataLoader(dataset, sampler=sampler, collate_fn=collate_fn, **args)


def tune(dataset: Dataset, batch_size: int, step_ms: float | None = None, model: str | None = None,
         budget_s: float = 60.0, max_workers: int | None = None, collate_fn: Callable[[Any], Any] | None = None,
         sampler: Sampler[int] | None = None, progress: bool = True, device: str | None = None, *,
         tolerance: float = DEFAULT_TOLERANCE, trial_s: float | None = None, sync: bool = DEFAULT_SYNC) -> TuneResult:
    """Search the DataLoader settings for ``dataset`` that keep a GPU step of ``step_ms`` (or the
    small CNN, ``model="small-cnn"``; neither: ``training_loop.DEFAULT_STEP_MS``, said in the verdict)
    fed, within ``budget_s`` seconds; see the module docstring.

    ``max_workers`` caps the workers tried. By default the search tries up to the usable cores
    (affinity and cgroup quota) while the workers keep them busy, and climbs past them while they
    wait instead (a network disk; never for data found in the page cache), up to ``WAITING_CAP`` or
    what the open-file limit allows; the result's ``stopped`` says what ended it. ``sampler``
    defaults to a pack's ``sampler()`` or a shuffle.

    ``sync`` (default) measures a training loop that waits for every step before it asks for the next
    batch (``loss.item()`` each step): there loading in the main process stalls the GPU, so the pick
    has workers when they pay, and it holds for a loop that does not wait as well (see
    ``training_loop``). ``sync=False`` measures the loop that never waits (the step queued, the next
    batch loaded meanwhile).
    """
    start = time.perf_counter()
    if isinstance(dataset, IterableDataset):
        raise ValueError("tune needs a map-style Dataset (with __getitem__ and __len__), not an IterableDataset")
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size} must be at least 1")
    if not budget_s > 0:
        raise ValueError(f"budget_s {budget_s} must be a positive number of seconds")
    if not 0 < tolerance < 0.5:
        raise ValueError(f"tolerance {tolerance} must be between 0 and 0.5 (e.g. 0.04 for 4%)")
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise ValueError("the dataset is empty")
    step_ms, step_given = resolve_step(step_ms, model)
    cores = usable_cores()
    bound = cores if max_workers is None else max_workers
    if bound < 0:
        raise ValueError(f"max_workers {max_workers} must be 0 or more")
    files = dataset_files(dataset)
    cached_before = cached_share(files)
    in_memory = cached_before is not None and cached_before >= CACHED_SHARE
    descriptors = descriptor_workers()
    # Past the cores only while workers may wait on storage: never for data already in memory.
    climb_to = bound if max_workers is not None or in_memory else max(bound, min(WAITING_CAP, descriptors))
    step = DummyStep(step_ms=step_ms, model=model, device=device, sync=sync)
    if sampler is None and isinstance(dataset, PackedImageFolder):
        sampler = dataset.sampler(seed=0)
    guard = MemoryGuard()
    example = next(iter(DataLoader(dataset, batch_size, sampler=Cycle(sampler, len(dataset)),  # type: ignore[arg-type]
                                   collate_fn=collate_fn)))
    guard.batch_bytes = batch_nbytes(example)
    images = next((t for t in iter_tensors(example) if t.dim() == 4), None)
    step_rate = step.step_rate(batch_size, tuple(images.shape[1:]) if images is not None else None)

    bar = progress_bar(total=round(budget_s), desc="tune", unit="s", disable=not progress, leave=False,
                       bar_format="{desc}: {bar} {n:.0f}/{total} s{postfix}")

    def tick(status: str) -> None:
        bar.n = min(bar.total, time.perf_counter() - start)
        bar.set_postfix_str(status, refresh=True)

    runner = TrialRunner(dataset, batch_size, sampler, collate_fn, step, step_rate, guard, tick,
                         announce=lambda text: progress_line(bar, f"tune: {text}"))
    search = Search(runner, bound, tolerance, budget_s, start, pin_default=step.on_gpu, try_pin=step.on_gpu,
                    trial_s=trial_s, climb_to=climb_to, cores=cores)
    try:
        reason = search.run()
    finally:
        bar.close()
    if not any(t.valid for t in search.trials):
        raise TuneError(f"no configuration could be measured within budget_s={budget_s:g}; one batch of "
                        f"{batch_size} takes long here: give a larger budget_s or a smaller batch_size")
    pick, fastest = select(search.trials, tolerance)
    size = len(sampler) if sampler is not None and hasattr(sampler, "__len__") else len(dataset)  # type: ignore[arg-type]
    settings = {"num_workers": pick.num_workers, "prefetch_factor": pick.prefetch_factor,
                "pin_memory": pick.pin_memory, "persistent_workers": pick.num_workers > 0}
    limit = f"max_workers {bound}" if max_workers is not None else plural(cores, "usable core")
    others = _other_cores(search.trials)
    result = TuneResult(
        batch_size=batch_size, samples_per_epoch=size,
        step={"description": step.description, "step_ms": step.step_ms, "model": step.model_name, "sync": sync,
              "given": step_given, "device": str(step.device), "on_gpu": step.on_gpu,
              "calibration": step.calibration},
        step_samples_per_s=step_rate, trials=search.trials, winner=pick, fastest=fastest, settings=settings,
        verdict="", message="", epoch_s=size / pick.samples_per_s,
        not_measured={} if step.on_gpu else {"pin_memory": f"not measured ({_why_emulated()})"},
        stopped=reason, skipped=search.skipped, notes=_notes(others, search.trials, cores),
        elapsed_s=time.perf_counter() - start, budget_s=budget_s, max_workers=search.max_workers,
        tolerance=tolerance, machine=machine_info(), collate_fn=collate_fn, sampler=sampler,
        transform=describe_transform(getattr(dataset, "transform", None)),
        dataset=str(getattr(dataset, "root", "") or type(dataset).__name__),
        broken=list(getattr(dataset, "broken", [])),
        page_cache={"before": cached_before, "after": cached_share(files)}, cpu_others=others,
        worker_limit=limit,
        source="folder" if isinstance(dataset, FolderImages) else "pack" if isinstance(dataset, PackedImageFolder)
        else "")
    result.conclude()
    return result


def describe_transform(transform: Callable[[Any], Any] | None) -> str:
    """What a transform is called in the report: its module and name, or its repr ("none")."""
    if transform is None:
        return "none"
    name = getattr(transform, "__qualname__", None) or type(transform).__qualname__
    module = getattr(transform, "__module__", None) or type(transform).__module__
    text = f"{module}.{name}" if module and not module.startswith("packload.") else repr(transform)
    return text if len(text) <= 120 else text[:117] + "..."


def _why_emulated() -> str:
    return "device=cpu" if torch.cuda.is_available() else "no CUDA"


def _cache_state(result: TuneResult) -> str | None:
    """Where the data came from during the search, as the page cache says: ``"memory"`` (its pages
    cached before and after), ``"storage"`` (some were not), None (not measured: not files here)."""
    before, after = result.page_cache.get("before"), result.page_cache.get("after")
    if before is None or after is None:
        return None
    return "memory" if min(before, after) >= CACHED_SHARE else "storage"


def _cause(result: TuneResult) -> str:
    """Why the best DataLoader falls short of the step, from what the search measured: the CPU (the
    loader's and other processes'), what the workers wait on (the page cache says whether storage),
    memory or the budget."""
    pick, reason = result.winner, result.stopped
    cores = result.machine.get("usable_cores") or usable_cores()
    busy = f"{pick.cpu_cores:.1f} of {plural(cores, 'usable core')} busy with the loader"
    others = result.cpu_others or 0.0
    if others >= 0.5:
        busy += f", about {others:.1f} with other processes"
    state = _cache_state(result)
    cached = result.page_cache.get("after")
    if state == "memory":  # read from memory: the disk is no part of it, and the report does not name it
        where = f"the data was in the page cache ({cached:.0%} of its pages)"
    elif state == "storage":
        where = f"only {cached:.0%} of the data's pages were in the page cache: samples wait on storage"
    else:  # not files this process can look at: what the samples wait on is not measured
        where = "samples wait on something other than the CPU"
    if pick.cpu_cores >= CPU_BOUND_SHARE * cores:
        return f"the CPU is the limit ({busy}), so more CPU cores would help; "
    if reason == "cores":
        return f"the workers keep the usable cores busy ({busy}), so more CPU cores would help; "
    if reason == "worker bound":
        return (f"throughput still rose at the most workers allowed ({result.worker_limit}) with only {busy}: "
                f"{where}, so a larger max_workers would help; ")
    if reason in (CAP_REACHED, DESCRIPTORS_REACHED):
        return (f"throughput still rose at {plural(pick.num_workers, 'worker')}, where {reason} ended the search, "
                f"with only {busy}: {where}; ")
    if reason == "plateau":
        if state == "memory":
            rivals = ", or the other processes that kept the CPU busy" if others >= 0.5 * cores else ""
            return (f"more workers stopped helping with only {busy}, and {where}: the limit is the main process, "
                    f"which receives and unpickles every batch the workers send{rivals}; ")
        return f"more workers stopped helping with only {busy}: {where}, or the main process is the limit; "
    if reason == "memory":
        return "more workers would not fit in memory; "
    if reason == "budget":
        return "the time budget ended the search early (give a larger budget_s for a full search); "
    return ""


def _advice(result: TuneResult) -> str:
    """What makes each sample cheaper, for what was tuned."""
    if result.source == "folder":
        return (f"pack the folder (`pack {shlex.quote(result.dataset)} data.lmdb --encoding jpeg --max-side 256`) so "
                "each sample is cheaper")
    return ("make each sample cheaper: pack with --max-side 256 (or --encoding raw --size HxW), decode at a "
            "reduced size (decode_size=...)" + ("" if result.fast_path else ", or read it with packload.PackLoader"))


def _verdict(result: TuneResult) -> tuple[str, str]:
    """("input-bound" | "compute-bound", a plain sentence with the numbers and what to do). It follows
    from the figures the report shows (the pick's row, PackLoader's pick), recommends the fastest
    thing measured, and ends with what was assumed of the step and the loop."""
    step, pick = result.step, result.winner
    emulated = "" if step["on_gpu"] else f"; emulated by a wait: {_why_emulated()}"
    tail = (f"; the GPU step alone could run {rate_text(result.step_samples_per_s)}; "
            + assumed(step["step_ms"], step.get("given", True), step["model"], result.batch_size, step["sync"],
                      emulated if step["model"] is None else ""))
    workers = plural(pick.num_workers, "worker")
    loader = f"the best DataLoader delivers {rate_text(pick.samples_per_s)} with {workers}"
    fast = result.fast_path if result.fast_path and result.fast_path.get("pick") is not None else None
    if result.fast_path_wins():
        assert fast is not None
        ratio = fast["samples_per_s"] / pick.samples_per_s
        packloader = (f"PackLoader with {plural(fast['threads'], 'thread')} delivers {rate_text(fast['samples_per_s'])}, "
                      f"{ratio:.2f}x the DataLoader pick")
        if fast["gpu_wait"] < COMPUTE_BOUND_WAIT:
            return "compute-bound", (f"{packloader}, and keeps up: training is compute-bound and the GPU waits "
                                     f"{fast['gpu_wait']:.0%} of the time; use PackLoader (the code below); "
                                     f"{loader} (the GPU would wait {pick.gpu_wait:.0%})" + tail)
        return "input-bound", (f"{packloader}: use it (the code below); training is input-bound all the same, the GPU "
                               f"waits {fast['gpu_wait']:.0%} of the time with PackLoader; {loader} (the GPU would "
                               f"wait {pick.gpu_wait:.0%}): " + _cause(result) + _advice(result) + tail)
    also = (f" (PackLoader, also measured: {rate_text(fast['samples_per_s'])} with "
            f"{plural(fast['threads'], 'thread')}, no faster)" if fast else "")
    if pick.gpu_wait < COMPUTE_BOUND_WAIT:
        return "compute-bound", (f"the loader keeps up with {workers} ({rate_text(pick.samples_per_s)}){also}: "
                                 f"training is compute-bound and the GPU waits {pick.gpu_wait:.0%} of the time; "
                                 "more workers or faster data would not speed it up" + tail)
    return "input-bound", (f"{loader}{also}: training is input-bound and the GPU waits {pick.gpu_wait:.0%} of the "
                           "time; " + _cause(result) + _advice(result) + tail)


def _other_cores(trials: list[Trial]) -> float | None:
    """Cores that other processes kept busy during the search: the load average less the loader's own
    CPU (None where there is no load average)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover - not available on this platform
        return None
    return max(0.0, load - max(t.cpu_cores for t in trials))


def _notes(others: float | None, trials: list[Trial], cores: float) -> list[str]:
    """Caveats about the measurement itself: other processes competing for the CPU."""
    if others is not None and others > 0.5 * cores:
        load = others + max(t.cpu_cores for t in trials)
        return [f"other processes kept the CPU busy during the search (load average {load:.1f} on "
                f"{plural(cores, 'usable core')}, about {others:.1f} of it not the loader's): on an idle machine "
                "the loader may be faster"]
    return []


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
