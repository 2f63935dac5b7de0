"""What ``tune`` returns: every trial, the pick and the verdict drawn from them, and what the pick
is for: a DataLoader with its settings (``make_loader``), a file ``load_loader_config`` reads back
(``save``), a plot."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, Dataset, Sampler

from packload.core.format import PARTIAL_SUFFIX
from packload.diagnose.loader_config import CONFIG_KEY, CONFIG_VERSION
from packload.diagnose.tune_trials import Trial
from packload.diagnose.tune_verdict import verdict_of
from packload.loaders.dataset import PackedImageFolder


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
        self.verdict, self.message = verdict_of(self)


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
