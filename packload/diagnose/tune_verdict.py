"""What a tune's measurements mean: input-bound or compute-bound, said in one sentence with the
figures the report shows, the cause where the loader falls short (the CPU, what the workers wait
on, memory or the budget), and what would make each sample cheaper."""

from __future__ import annotations

import shlex
from typing import Any, Protocol

import torch

from packload.core.cpus import usable_cores
from packload.core.display import plural
from packload.diagnose.training_loop import assumed
from packload.diagnose.tune_search import CAP_REACHED, DESCRIPTORS_REACHED
from packload.diagnose.tune_trials import Trial, rate_text

COMPUTE_BOUND_WAIT = 0.10  # the GPU waiting less than this share of the time: compute-bound
CPU_BOUND_SHARE = 0.85  # the loader keeping this share of the usable cores busy: the CPU is the limit
CACHED_SHARE = 0.9  # the data's pages in the page cache, before and after the search: read from memory


class Measured(Protocol):
    """What the verdict reads of a ``tune_result.TuneResult`` (named here: the result imports this module)."""

    winner: Trial
    batch_size: int
    step: dict[str, Any]
    step_samples_per_s: float
    fast_path: dict[str, Any] | None
    stopped: str
    worker_limit: str
    machine: dict[str, Any]
    page_cache: dict[str, float | None]
    cpu_others: float | None
    source: str
    dataset: str

    def fast_path_wins(self) -> bool: ...


def why_emulated() -> str:
    """Why the step was a wait rather than GPU work, as the report says it."""
    return "device=cpu" if torch.cuda.is_available() else "no CUDA"


def _cache_state(result: Measured) -> str | None:
    """Where the data came from during the search, as the page cache says: ``"memory"`` (its pages
    cached before and after), ``"storage"`` (some were not), None (not measured: not files here)."""
    before, after = result.page_cache.get("before"), result.page_cache.get("after")
    if before is None or after is None:
        return None
    return "memory" if min(before, after) >= CACHED_SHARE else "storage"


def _cause(result: Measured) -> str:
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


def _advice(result: Measured) -> str:
    """What makes each sample cheaper, for what was tuned."""
    if result.source == "folder":
        return (f"pack the folder (`pack {shlex.quote(result.dataset)} data.lmdb --encoding jpeg --max-side 256`) so "
                "each sample is cheaper")
    return ("make each sample cheaper: pack with --max-side 256 (or --encoding raw --size HxW), decode at a "
            "reduced size (decode_size=...)" + ("" if result.fast_path else ", or read it with packload.PackLoader"))


def verdict_of(result: Measured) -> tuple[str, str]:
    """("input-bound" | "compute-bound", a plain sentence with the numbers and what to do). It follows
    from the figures the report shows (the pick's row, PackLoader's pick), recommends the fastest
    thing measured, and ends with what was assumed of the step and the loop."""
    step, pick = result.step, result.winner
    emulated = "" if step["on_gpu"] else f"; emulated by a wait: {why_emulated()}"
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
