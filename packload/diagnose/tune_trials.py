"""A tuner's trial and how trials are compared: one measured DataLoader configuration, the median
trial that stands for a configuration measured more than once, what a configuration costs, the
pick (the cheapest within the tolerance of the fastest), and a rate and a configuration written as
every part of the report writes them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

Key = tuple[int, int | None, bool]
FAST_PATH = "fast path"  # the phase of PackLoader's trials (their "workers" are its threads)


@dataclass
class Trial:
    """One measured configuration: its settings, steady rate, GPU idle share, start-up and memory."""

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    samples_per_s: float
    batches_per_s: float
    gpu_wait: float  # share of the time the GPU step waited for data (0..1)
    startup_s: float  # from iter(loader) to the first batch: worker start-up plus one batch
    worker_rss_mb: float
    worker_pss_mb: float  # the workers' proportional share of memory: what they really add
    noise: float  # relative standard error of the steady rate, from its windows
    cpu_cores: float  # CPU used by the main process and the workers, in cores, during the steady phase
    batches: int
    seconds: float
    phase: str
    note: str = ""

    @property
    def key(self) -> Key:
        return (self.num_workers, self.prefetch_factor, self.pin_memory)

    @property
    def valid(self) -> bool:
        return self.batches > 0 and self.samples_per_s > 0

    def settings(self) -> dict[str, Any]:
        return {"num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor,
                "pin_memory": self.pin_memory}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cost(key: Key) -> tuple[int, int, bool]:
    """Cheaper first: fewer workers, a shallower queue, no pinned memory."""
    return (key[0], key[1] or 0, key[2])


def aggregate(trials: list[Trial]) -> dict[Key, Trial]:
    """One trial per configuration: the median of its measurements (the lower one of two, so a lucky
    outlier never wins), as measured: each configuration's figure is one trial's, a row of the
    report, never a blend of several."""
    groups: dict[Key, list[Trial]] = {}
    for trial in trials:
        if trial.valid:
            groups.setdefault(trial.key, []).append(trial)
    return {key: median_trial(group) for key, group in groups.items()}


def median_trial(group: list[Trial]) -> Trial:
    """The trial of ``group`` whose rate is the (lower) median; the earlier one on a tie."""
    ordered = sorted(group, key=lambda t: t.samples_per_s)
    return ordered[(len(ordered) - 1) // 2]


def rate_text(samples_per_s: float) -> str:
    """A trial's rate as every part of the report writes it (progress, table, pick, verdict)."""
    return f"{samples_per_s:,.0f} img/s"


def trial_label(trial: Trial | Key, fast_path: bool = False) -> str:
    """The configuration of a trial as the progress lines name it."""
    workers, prefetch, pin = trial.key if isinstance(trial, Trial) else trial
    if fast_path or (isinstance(trial, Trial) and trial.phase == FAST_PATH):
        return f"PackLoader threads={workers}"
    return f"workers={workers} prefetch={prefetch or '-'} pin={'yes' if pin else 'no'}"


def select(trials: list[Trial], tolerance: float) -> tuple[Trial, Trial]:
    """(pick, fastest): the cheapest configuration within ``tolerance`` of the fastest one."""
    merged = aggregate(trials)
    if not merged:
        raise RuntimeError("no trial completed a measurement; give a larger budget_s")
    fastest = max(merged.values(), key=lambda t: t.samples_per_s)
    band = (1 - tolerance) * fastest.samples_per_s
    pick = min((t for t in merged.values() if t.samples_per_s >= band), key=lambda t: (cost(t.key), t.worker_pss_mb))
    return pick, fastest
