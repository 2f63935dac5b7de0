"""``tune``: the DataLoader settings that keep a GPU fed, measured on this machine.

``tune(dataset, batch_size=256, step_ms=120)`` feeds batches to a dummy training step of that
length (``packload.diagnose.gpu_step.DummyStep``: real GPU work on CUDA, a CPU-free wait elsewhere) and searches
``num_workers``, ``prefetch_factor`` and, on CUDA, ``pin_memory`` within a time budget
(``packload.diagnose.tune_search``). It picks the cheapest configuration within a few percent of the fastest,
says whether training is input-bound or compute-bound, and projects an epoch's time.
``persistent_workers`` never changes the steady rate; it saves the worker start-up that every
trial measures, at each epoch after the first, so it is set whenever there are workers.

    result = tune(ds, batch_size=256, step_ms=120)
    loader = result.make_loader(ds)                 # a DataLoader with the winning settings
    result.save("loader.json")                      # later: DataLoader(ds, **load_loader_config(...))
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from packload.core.cpus import usable_cores
from packload.core.errors import PackloadError
from packload.core.progress import progress_bar
from packload.diagnose.gpu_step import DummyStep, iter_tensors
from packload.diagnose.loader_config import CONFIG_KEY, CONFIG_VERSION
from packload.diagnose.loader_memory import MemoryGuard, batch_nbytes
from packload.diagnose.measure import machine_info
from packload.diagnose.tune_search import (
    CAP_REACHED,
    DESCRIPTORS_REACHED,
    WAITING_CAP,
    Cycle,
    Search,
    Trial,
    TrialRunner,
    descriptor_workers,
    select,
)
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.folder import FolderImages

__all__ = ["Trial", "TuneError", "TuneResult", "format_report", "tune"]

DEFAULT_TOLERANCE = 0.04  # configurations within 4% of the fastest count as equally fast
COMPUTE_BOUND_WAIT = 0.10  # the GPU waiting less than this share of the time: compute-bound


class TuneError(PackloadError, RuntimeError):
    """The search could not measure anything (a budget too small for even one trial)."""


@dataclass
class TuneResult:
    """Every trial, the pick (``settings``, ``winner``), the verdict and the projection of an epoch."""

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
        """Everything but the callables, JSON-ready."""
        plain = {name: getattr(self, name) for name in self.__dataclass_fields__
                 if name not in ("collate_fn", "sampler", "trials", "winner", "fastest")}
        return {**plain, "loader": self.loader_kwargs(), "winner": self.winner.as_dict(),
                "fastest": self.fastest.as_dict(), "trials": [t.as_dict() for t in self.trials]}

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
        partial = target.with_name(target.name + ".partial")
        partial.write_text(json.dumps(document, indent=2) + "\n")
        partial.replace(target)
        return target

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """Throughput against num_workers per prefetch setting, the GPU step's rate as a line (PNG);
        needs matplotlib."""
        from packload.diagnose.tune_plot import plot_result

        return plot_result(self, path)


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
         tolerance: float = DEFAULT_TOLERANCE, trial_s: float | None = None, sync: bool = True) -> TuneResult:
    """Search the DataLoader settings for ``dataset`` that keep a GPU step of ``step_ms`` (or the
    small CNN, ``model="small-cnn"``) fed, within ``budget_s`` seconds; see the module docstring.

    ``max_workers`` caps the workers tried. By default the search tries up to the usable cores
    (affinity and cgroup quota) while the workers keep them busy, and climbs past them while they
    wait instead (a network disk), up to ``WAITING_CAP`` or what the open-file limit allows; the
    result's ``stopped`` says what ended it. ``sampler`` defaults to a pack's ``sampler()`` or a shuffle.

    ``sync`` (default) measures a training loop that waits for every step before it asks for the next
    batch (``loss.item()`` each step): there loading in the main process stalls the GPU, so the pick
    has workers when they pay, and it holds for a loop that does not wait as well. ``sync=False``
    measures the loop that never waits (the step queued, the next batch loaded meanwhile).
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
    cores = usable_cores()
    bound = cores if max_workers is None else max_workers
    if bound < 0:
        raise ValueError(f"max_workers {max_workers} must be 0 or more")
    descriptors = descriptor_workers()
    climb_to = bound if max_workers is not None else max(bound, min(WAITING_CAP, descriptors))
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

    runner = TrialRunner(dataset, batch_size, sampler, collate_fn, step, step_rate, guard, tick)
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
    limit = f"max_workers={bound}" if max_workers is not None else f"{bound} usable cores"
    verdict, message = _verdict(pick, step_rate, reason, limit, dataset, step)
    return TuneResult(batch_size=batch_size, samples_per_epoch=size,
                      step={"description": step.description, "step_ms": step.step_ms, "model": step.model_name,
                            "sync": sync,
                            "device": str(step.device), "on_gpu": step.on_gpu, "calibration": step.calibration},
                      step_samples_per_s=step_rate, trials=search.trials, winner=pick, fastest=fastest,
                      settings=settings, verdict=verdict, message=message, epoch_s=size / pick.samples_per_s,
                      not_measured={} if step.on_gpu else {"pin_memory": f"not measured ({_why_emulated()})"},
                      stopped=reason, skipped=search.skipped, notes=_notes(search.trials),
                      elapsed_s=time.perf_counter() - start, budget_s=budget_s, max_workers=search.max_workers, tolerance=tolerance,
                      machine=machine_info(), collate_fn=collate_fn, sampler=sampler,
                      transform=describe_transform(getattr(dataset, "transform", None)),
                      dataset=str(getattr(dataset, "root", "") or type(dataset).__name__),
                      broken=list(getattr(dataset, "broken", [])))


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


def _verdict(pick: Trial, step_rate: float, reason: str, limit: str, dataset: Dataset,
             step: DummyStep) -> tuple[str, str]:
    """("input-bound" | "compute-bound", a plain sentence with the numbers and what to do)."""
    emulated = "" if step.on_gpu else f" (GPU step emulated by a {step.step_ms:g} ms wait: {_why_emulated()})"
    loop = ("a loop that waits for every step (as with loss.item())" if step.sync else
            "a loop that never waits for the step")
    assumed = f"; assumed {loop}"
    workers = f"{pick.num_workers} worker{'s' if pick.num_workers != 1 else ''}"
    head = f"the GPU step alone could run {step_rate:,.0f} img/s{emulated}{assumed}; "
    if pick.gpu_wait < COMPUTE_BOUND_WAIT:
        return "compute-bound", (head + f"the loader keeps up with {workers} ({pick.samples_per_s:,.0f} img/s): "
                                 f"training is compute-bound and the GPU waits {pick.gpu_wait:.0%} of the time; "
                                 "more workers or faster data would not speed it up")
    text = (head + f"the best loader delivers {pick.samples_per_s:,.0f} img/s with {workers}: training is "
            f"input-bound and the GPU waits {pick.gpu_wait:.0%} of the time; ")
    cores = usable_cores()
    busy = f"{pick.cpu_cores:.1f} of {cores} usable cores busy"
    if pick.cpu_cores >= 0.85 * cores:
        text += f"the CPU is the limit ({busy}), so more CPU cores would help; "
    elif reason == "cores":
        text += f"the workers keep the usable cores busy ({busy}), so more CPU cores would help; "
    elif reason == "worker bound":
        text += (f"throughput still rose at the most workers allowed ({limit}) with only {busy}: samples wait on "
                 "storage, so a larger max_workers would help; ")
    elif reason in (CAP_REACHED, DESCRIPTORS_REACHED):
        text += (f"the workers wait on storage ({busy}) and throughput still rose at {pick.num_workers} workers, "
                 f"where {reason} ended the search; ")
    elif reason == "plateau":
        text += f"more workers stopped helping with only {busy}: the limit is storage or the main process; "
    elif reason == "memory":
        text += "more workers would not fit in memory; "
    elif reason == "budget":
        text += "the time budget ended the search early (give a larger budget_s for a full search); "
    if isinstance(dataset, FolderImages):
        text += "pack the folder (`pack FOLDER data.lmdb --encoding jpeg --max-side 256`) so each sample is cheaper"
    else:
        text += ("make each sample cheaper: pack with --max-side 256 (or --encoding raw --size HxW), decode at a "
                 "reduced size (decode_size=...), or use packload.batch_loader")
    return "input-bound", text


def _notes(trials: list[Trial]) -> list[str]:
    """Caveats about the measurement itself: other processes competing for the CPU."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover - not available on this platform
        return []
    ours, cores = max(t.cpu_cores for t in trials), usable_cores()
    others = load - ours
    if others > 0.5 * cores:
        return [f"other processes kept the CPU busy during the search (load average {load:.1f} on {cores} usable "
                f"cores, about {others:.1f} of it not the loader's): on an idle machine the loader may be faster"]
    return []


def _worker_memory(trial: Trial) -> str:
    """The workers' proportional share of memory (PSS: shared pages such as the CUDA libraries a
    forked worker maps count once, not once per worker); RSS, marked, where PSS cannot be read."""
    if trial.worker_pss_mb:
        return f"{trial.worker_pss_mb:.0f} MB"
    return f"{trial.worker_rss_mb:.0f} MB RSS" if trial.worker_rss_mb else "-"


def _fast_path_lines(result: TuneResult) -> list[str]:
    """What PackLoader's threads gave against the DataLoader pick, and which to use."""
    fast = result.fast_path
    if not fast:
        return []
    if fast.get("pick") is None:
        return [f"  fast path (PackLoader): {fast.get('note', 'not measured')}"]
    ratio = fast["samples_per_s"] / result.winner.samples_per_s if result.winner.samples_per_s else float("inf")
    head = (f"  fast path: PackLoader with {fast['threads']} threads: {fast['samples_per_s']:,.0f} img/s, "
            f"{ratio:.2f}x the DataLoader pick")
    if ratio > 1 + result.tolerance:
        return [head + "; use it:", f"    {fast['code']}"]
    return [head + "; the DataLoader pick is as fast or faster here: keep it"]


def format_report(result: TuneResult) -> list[str]:
    """The result for a terminal: the step, every trial, the pick, the verdict, an epoch's time."""
    lines = [f"packload tune: {result.samples_per_epoch:,} samples per epoch, batch {result.batch_size}; "
             f"{result.step['description']}",
             f"  the GPU step alone: {result.step_samples_per_s:,.0f} img/s "
             f"({result.step_samples_per_s / result.batch_size:,.1f} batches/s)",
             f"  transform timed: {result.transform}",
             "  workers  prefetch  pin    img/s  batches/s  GPU waits  CPU cores  start-up  worker PSS  phase"]
    for t in result.trials:
        lines.append(f"  {t.num_workers:7d}  {t.prefetch_factor or '-':>8}  {'yes' if t.pin_memory else 'no':>3}  "
                     f"{t.samples_per_s:7,.0f}  {t.batches_per_s:9.2f}  {t.gpu_wait:9.0%}  {t.cpu_cores:9.1f}  "
                     f"{t.startup_s:7.2f}s  "
                     f"{_worker_memory(t):>10}  {t.phase}" + (f" ({t.note})" if t.note else ""))
    pin = result.not_measured.get("pin_memory")
    settings = ", ".join(f"{k}={v}" + (f" [{pin}]" if k == "pin_memory" and pin else "")
                         for k, v in result.settings.items())
    lines += [f"  pick: {settings}: {result.winner.samples_per_s:,.0f} img/s, the cheapest within "
              f"{result.tolerance:.0%} of the fastest ({result.fastest.samples_per_s:,.0f} img/s)",
              f"  verdict: {result.message}",
              f"  one epoch: {result.epoch_s:,.1f} s at {result.winner.samples_per_s:,.0f} img/s"
              + (f" (plus {result.winner.startup_s:.1f} s of worker start-up in the first epoch; "
                 "persistent_workers saves it in the next ones)" if result.winner.num_workers else "")]
    lines += _fast_path_lines(result)
    if result.broken:
        shown = "; ".join(f"{b['path']} ({b['reason']})" for b in result.broken[:5])
        more = f"; and {len(result.broken) - 5} more" if len(result.broken) > 5 else ""
        lines.append(f"  left out {len(result.broken)} broken file(s), as pack would skip them: {shown}{more}")
    lines += [f"  skipped {reason}" for reason in result.skipped]
    lines += [f"  note: {note}" for note in result.notes]
    lines.append(f"  {len(result.trials)} trials in {result.elapsed_s:.1f} s of a {result.budget_s:g} s budget; "
                 f"the worker search ended: {result.stopped}")
    return lines
