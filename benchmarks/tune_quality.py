"""Does ``tune`` pick well, and cheaply? The tuner against an exhaustive grid on known workloads.

Each workload's samples cost a fixed wait (``time.sleep``: no CPU, so the rate scales with workers
even on a small machine, like reading from a slow or networked disk), some with rare long stalls,
or a fixed amount of CPU work (a busy loop: the cores are the limit); the GPU step is emulated (or
real, on CUDA) with a fast or a slow step, in a loop that waits for every step or one that never
does. For each workload the tuner runs with its defaults and budget (no ``max_workers``: it decides
how far to climb), then every configuration of num_workers 0..16 and prefetch_factor 2/4 is
measured once with the same trial routine and longer trials (the grid's time is that pass). Then the tuner's pick and the grid's fastest configuration are measured again,
interleaved, and their medians compared. Reported: the pick's rate as a share of the fastest's,
and the tuner's time as a share of the grid's. Targets: at least 95% at most 25% of the time.

    python benchmarks/tune_quality.py            # ~20 minutes on 2 cores
    python benchmarks/tune_quality.py --quick    # ~10 minutes
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packload.diagnose.gpu_step import DummyStep  # noqa: E402
from packload.diagnose.loader_memory import MemoryGuard  # noqa: E402
from packload.diagnose.tune import DEFAULT_TOLERANCE, tune  # noqa: E402
from packload.diagnose.tune_runner import TrialRunner  # noqa: E402
from packload.diagnose.tune_search import PREFETCH_DEEPER, PREFETCH_DEFAULT  # noqa: E402
from packload.diagnose.tune_trials import Key, select  # noqa: E402


class WaitingSamples(Dataset):
    """``ms`` of waiting per sample, plus a ``stall_ms`` wait for one sample in ``stall_every``
    (chosen by a hash of the index, so the same samples stall in every run)."""

    def __init__(self, ms: float, stall_ms: float = 0.0, stall_every: int = 0, size: int = 100_000,
                 cpu_ms: float = 0.0) -> None:
        self.ms, self.stall_ms, self.stall_every, self.size = ms, stall_ms, stall_every, size
        self.cpu_ms = cpu_ms

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        wait = self.ms
        if self.stall_every and zlib.crc32(index.to_bytes(8, "little")) % self.stall_every == 0:
            wait += self.stall_ms
        if wait:
            time.sleep(wait / 1000)
        if self.cpu_ms:  # CPU work, as decoding is: a busy loop on this process's clock
            until = time.thread_time() + self.cpu_ms / 1000
            while time.thread_time() < until:
                pass
        return torch.zeros(16), index % 10


@dataclass(frozen=True)
class Workload:
    name: str
    sample_ms: float
    step_ms: float
    batch_size: int = 32
    grid_workers: int = 16
    stall_ms: float = 0.0
    stall_every: int = 0
    cpu_ms: float = 0.0
    sync: bool = True

    def dataset(self) -> WaitingSamples:
        return WaitingSamples(self.sample_ms, self.stall_ms, self.stall_every, cpu_ms=self.cpu_ms)


WORKLOADS = (
    Workload("network disk: 4 ms wait a sample, 5 ms step", sample_ms=4.0, step_ms=5),
    Workload("CPU-bound: 1 ms of CPU a sample, 5 ms step", sample_ms=0.0, cpu_ms=1.0, step_ms=5),
    Workload("network disk, 150 ms step, loop waits every step", sample_ms=4.0, step_ms=150),
    Workload("network disk, 150 ms step, loop never waits", sample_ms=4.0, step_ms=150, sync=False),
    Workload("slow samples, slow step", sample_ms=2.0, step_ms=40),
    Workload("fast samples, fast step", sample_ms=0.1, step_ms=10),
    Workload("stalling samples, fast step", sample_ms=1.0, step_ms=10, stall_ms=30, stall_every=50),
)


def grid(work: Workload, trial_s: float, runner: TrialRunner) -> dict[str, Any]:
    """Every configuration measured once with the tuner's own trial routine: rates and total time."""
    pins = (False, True) if runner.step.on_gpu else (False,)  # pin_memory matters only with CUDA
    configs = [(0, None, pin) for pin in pins] + [(w, pf, pin) for w in range(1, work.grid_workers + 1)
                                                  for pf in (PREFETCH_DEFAULT, PREFETCH_DEEPER[0]) for pin in pins]
    start = time.perf_counter()
    trials = [runner.run(w, pf, pin, trial_s, float("inf"), "grid") for w, pf, pin in configs]
    seconds = time.perf_counter() - start
    cheapest, best = select(trials, DEFAULT_TOLERANCE)
    return {"seconds": seconds, "trials": trials, "best": best, "cheapest": cheapest}


def remeasure(runner: TrialRunner, keys: list[Key], trial_s: float, repeats: int) -> dict[Key, float]:
    """The median rate of each configuration over ``repeats`` interleaved runs: the ground truth
    for the comparison (one grid pass on a shared machine has outliers, and its maximum is biased up)."""
    rates: dict[Key, list[float]] = {key: [] for key in keys}
    for _ in range(repeats):
        for key in keys:
            rates[key].append(runner.run(key[0], key[1], key[2], trial_s, float("inf"), "check").samples_per_s)
    return {key: statistics.median(values) for key, values in rates.items()}


def compare(work: Workload, budget_s: float, trial_s: float, repeats: int) -> dict[str, Any]:
    start = time.perf_counter()
    result = tune(work.dataset(), work.batch_size, step_ms=work.step_ms, budget_s=budget_s, progress=False,
                  sync=work.sync)
    tuner_s = time.perf_counter() - start
    step = DummyStep(step_ms=work.step_ms, sync=work.sync)
    runner = TrialRunner(work.dataset(), work.batch_size, None, None, step, step.step_rate(work.batch_size),
                         MemoryGuard(), lambda _: None)
    full = grid(work, trial_s, runner)
    best_key, pick_key = full["best"].key, result.winner.key
    truth = remeasure(runner, list(dict.fromkeys((pick_key, best_key))), trial_s, repeats)
    return {"workload": work.name, "step_samples_per_s": result.step_samples_per_s,
            "pick": result.settings, "tuner_rate": result.winner.samples_per_s,
            "grid_best": full["best"].settings(), "grid_cheapest": full["cheapest"].settings(),
            "pick_rate": truth[pick_key], "best_rate": truth[best_key],
            "share_of_best": min(1.0, truth[pick_key] / truth[best_key]),
            "tuner_s": tuner_s, "tuner_trials": len(result.trials), "grid_s": full["seconds"],
            "grid_trials": len(full["trials"]), "share_of_time": tuner_s / full["seconds"],
            "verdict": result.verdict, "stopped": result.stopped, "sync": work.sync}


def _config(settings: dict[str, Any]) -> str:
    return f"w={settings['num_workers']}, pf={settings['prefetch_factor'] or '-'}"


def markdown(rows: list[dict[str, Any]], repeats: int) -> list[str]:
    lines = ["| workload | GPU step alone | grid's fastest | grid's cheapest within 4% | tuner's pick | "
             f"pick's rate (median of {repeats}) | fastest's rate (median of {repeats}) | pick / fastest | "
             "tuner time (trials) | grid time (trials) | tuner / grid time | verdict |",
             "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['step_samples_per_s']:,.0f}/s | {_config(r['grid_best'])} | "
                     f"{_config(r['grid_cheapest'])} | {_config(r['pick'])} | {r['pick_rate']:,.0f}/s | "
                     f"{r['best_rate']:,.0f}/s | {r['share_of_best']:.1%} | {r['tuner_s']:.1f} s "
                     f"({r['tuner_trials']}) | {r['grid_s']:.1f} s ({r['grid_trials']}) | {r['share_of_time']:.1%} | "
                     f"{r['verdict']} |")
    worst_rate = min(r["share_of_best"] for r in rows)
    total_share = sum(r["tuner_s"] for r in rows) / sum(r["grid_s"] for r in rows)
    met = worst_rate >= 0.95 and max(r["share_of_time"] for r in rows) <= 0.25
    lines.append("")
    lines.append(f"Worst pick: {worst_rate:.1%} of the grid's best; tuner time {total_share:.1%} of the grid's in "
                 f"all. Targets (>= 95% of the best, <= 25% of the time): {'met' if met else 'NOT met'}.")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter grid trials and tuner budgets")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    budget_s, trial_s, repeats = (8.0, 1.0, 3) if args.quick else (15.0, 2.0, 3)
    rows = []
    for work in WORKLOADS:
        print(f"{work.name} ...", file=sys.stderr, flush=True)
        rows.append(compare(work, budget_s, trial_s, repeats))
    print("\n".join(markdown(rows, repeats)))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
