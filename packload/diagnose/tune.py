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
``tune_trials.aggregate``), so the pick is always a row of the table. The result, its verdict and
its report are ``tune_result``, ``tune_verdict`` and ``tune_report``.

    result = tune(ds, batch_size=256, step_ms=120)
    loader = result.make_loader(ds)                 # a DataLoader with the winning settings
    result.save("loader.json")                      # later: DataLoader(ds, **load_loader_config(...))
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from packload.core.cpus import usable_cores
from packload.core.display import plural
from packload.core.errors import PackloadError
from packload.core.progress import progress_bar, progress_line
from packload.diagnose.data_files import cached_share, dataset_files
from packload.diagnose.gpu_step import DummyStep, iter_tensors
from packload.diagnose.loader_memory import MemoryGuard, batch_nbytes
from packload.diagnose.measure import machine_info
from packload.diagnose.training_loop import DEFAULT_STEP_MS, DEFAULT_SYNC, resolve_step
from packload.diagnose.tune_report import format_report
from packload.diagnose.tune_result import TuneResult
from packload.diagnose.tune_runner import Cycle, TrialRunner
from packload.diagnose.tune_search import WAITING_CAP, Search, descriptor_workers
from packload.diagnose.tune_trials import Trial, select
from packload.diagnose.tune_verdict import CACHED_SHARE, why_emulated
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.folder import FolderImages

__all__ = ["DEFAULT_STEP_MS", "Trial", "TuneError", "TuneResult", "format_report", "tune"]

DEFAULT_TOLERANCE = 0.04  # configurations within 4% of the fastest count as equally fast


class TuneError(PackloadError, RuntimeError):
    """The search could not measure anything (a budget too small for even one trial)."""


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
        not_measured={} if step.on_gpu else {"pin_memory": f"not measured ({why_emulated()})"},
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
