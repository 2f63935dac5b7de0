"""Does a training loop that holds the GIL slow ``PackLoader``, and by how much? No GPU needed.

``PackLoader`` builds batches in threads of the training process, so its threads share the GIL with
the training loop; ``batch_loader`` and the drop-in DataLoader build them in worker processes, which
have a GIL each. This script emulates the training step in the main thread as "holds the GIL for a
fraction f of the step without using CPU": libc ``usleep`` called through ``ctypes.PyDLL`` (which
keeps the GIL held) in short slices from a Python loop, then a wait with the GIL released until the
step's time has passed (a loop whose GPU work is queued). The held part is a fixed amount of work, as
a loop's Python is: when other threads take the GIL from it, it takes longer, and the table shows by
how much. The wait is made of the same ``usleep`` slices through ``ctypes.CDLL`` by default, so the
thread wakes as often at every fraction and only the GIL differs (on a virtual machine frequent
wake-ups alone change how fast other processes get woken); ``--rest sleep`` waits in one
``time.sleep``. The main thread uses almost no CPU, so what slows a contender is the GIL, not a lost
core. Per batch the loop does what a training loop does: take the next batch, run the step.

    python benchmarks/bench_gil.py PACK [--fractions 0,25,50,90] [--switch-ms 5,0.5,0.1] [--quick]

Reported per contender (same pack, same sampler, same crop, threads/workers = usable cores):
images/s with the loop at each GIL-held fraction, the share of the run the loop spent in its held
part (lower than f when the loop waits for batches), that part's milliseconds per step, and the
slowdown against the same contender at fraction 0. ``PackLoader`` is also run at other
``sys.setswitchinterval`` values (the default is 5 ms): a thread that wants the GIL waits up to one
switch interval before it asks the holder to let go.

``--hold cpu`` holds the GIL in a pure-Python busy loop instead (GIL and a CPU core: the loop's
Python competes for the cores too); ``--hold gil-ops`` lets go of the GIL for an instant between
slices, as a torch op does while it dispatches.

What the GIL costs ``PackLoader``: each call that lets go of the GIL must take it back, and while the
loop holds it the pool thread waits up to one switch interval each time. Decoding JPEGs one by one
(simplejpeg, then the compiled resize kernel: ``_CropFill.fill`` in loaders/batch_fill.py) takes it
back three times per image; the compiled batch decoder (packload/core/jpeg_kernel.py, used where it
was built) decodes, crops and resizes a whole batch in one call, so a handful of times per batch.
The contender ``packloader_per_image`` is ``PackLoader`` with the batch decoder switched off, to
measure the two in the same run (benchmarks/NOTES.md has the figures). ``--random-crop`` measures
training crops (``RandomResizedCrop`` and flips) instead of ``CenterCrop``.

``--step-ms`` is the loop's step; by default 0.8 × the time ``PackLoader`` alone takes per batch
(measured first), so the loader, not the step, sets the pace at fraction 0.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from packload import CenterCrop, PackedImageFolder, PackLoader, RandomResizedCrop, collate_uint8  # noqa: E402
from packload.core import jpeg_kernel  # noqa: E402
from packload.core.cpus import usable_cores  # noqa: E402
from packload.loaders.batches import batch_loader  # noqa: E402

CONTENDERS = ("packloader", "packloader_per_image", "batch_loader", "drop_in")
LABELS = {
    "packloader": "PackLoader (threads)",
    "packloader_per_image": "PackLoader, JPEGs one by one (threads)",
    "batch_loader": "batch_loader (processes)",
    "drop_in": "drop-in DataLoader (processes)",
}
DEFAULT_SWITCH_MS = 5.0  # CPython's default sys.getswitchinterval()


def _libc(held: bool) -> Any:
    """libc through ctypes: ``PyDLL`` calls keep the GIL held, ``CDLL`` calls release it."""
    try:
        lib = ctypes.PyDLL(None) if held else ctypes.CDLL(None)
        lib.usleep.argtypes = [ctypes.c_uint]
        return lib
    except (OSError, AttributeError) as exc:  # pragma: no cover - not a POSIX libc
        raise SystemExit(f"libc usleep is not reachable through ctypes here ({exc}); try --hold cpu") from exc


class Step:
    """The emulated training step: work that holds the GIL for ``fraction`` of ``step_s``, then a wait
    with the GIL released until ``step_s`` has passed (a loop whose GPU work is queued).

    The held part is a fixed amount of work, as a training loop's Python is: ``fraction * step_s``
    worth of ``slice_us`` slices, timed once uncontended. When other threads take the GIL from it, the
    held part takes longer and the step with it, as a real loop's would. ``hold``: ``gil`` (``usleep``
    through ``PyDLL``: GIL held, no CPU), ``gil-ops`` (the same with a GIL-releasing zero-length
    ``usleep`` after each slice, as torch ops release the GIL while they dispatch) or ``cpu`` (a
    pure-Python busy loop: GIL held and a core busy). ``rest``: ``slices`` (``usleep`` slices through
    ``CDLL``, so the thread wakes as often at every fraction and only the GIL differs) or ``sleep``
    (one ``time.sleep``). Calling it runs one step and returns the seconds spent in the held part."""

    def __init__(self, step_s: float, fraction: float, hold: str = "gil", slice_us: int = 100,
                 rest: str = "slices") -> None:
        if not 0 <= fraction <= 1:
            raise ValueError(f"fraction must be in [0, 1], got {fraction}")
        if hold not in ("gil", "gil-ops", "cpu"):
            raise ValueError(f"hold must be gil, gil-ops or cpu, got {hold!r}")
        if rest not in ("slices", "sleep"):
            raise ValueError(f"rest must be slices or sleep, got {rest!r}")
        self.step_s, self.fraction, self.hold, self.slice_us, self.rest = step_s, fraction, hold, int(slice_us), rest
        self._held = _libc(held=True) if hold != "cpu" else None
        self._released = _libc(held=False)
        self._spin = 1000  # busy-loop iterations in one cpu slice
        self.slices = 0
        if fraction > 0 and step_s > 0:
            self._slice(20)  # warm
            start = time.perf_counter()
            self._slice(50)
            one = (time.perf_counter() - start) / 50
            if hold == "cpu":  # scale the busy loop to one slice
                self._spin = max(1, round(self._spin * slice_us * 1e-6 / one))
                one = slice_us * 1e-6
            self.slices = max(1, round(fraction * step_s / one))

    def _slice(self, count: int) -> None:
        """``count`` slices of work holding the GIL."""
        if self._held is None:
            spin = self._spin
            for _ in range(count):
                for _ in range(spin):
                    pass
            return
        usleep, slice_us = self._held.usleep, self.slice_us
        if self.hold == "gil-ops":
            release = self._released.usleep
            for _ in range(count):
                usleep(slice_us)
                release(0)
        else:
            for _ in range(count):
                usleep(slice_us)

    def wait_until(self, end: float) -> None:
        """Wait with the GIL released until ``time.perf_counter()`` reaches ``end``."""
        clock = time.perf_counter
        if self.rest == "sleep":
            rest = end - clock()
            if rest > 0:
                time.sleep(rest)
            return
        usleep, slice_us = self._released.usleep, self.slice_us
        while clock() < end:
            usleep(slice_us)

    def __call__(self) -> float:
        """One step; the seconds it held the GIL (none at fraction 0: the clock read twice around
        nothing can still count a moment this thread was not running, on a busy machine)."""
        start = time.perf_counter()
        if self.slices:
            self._slice(self.slices)
        held = time.perf_counter() - start
        self.wait_until(start + self.step_s)
        return held if self.slices else 0.0


@contextlib.contextmanager
def switch_interval(seconds: float) -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def make_loader(name: str, pack: str, batch_size: int, crop: int, workers: int,
                random_crop: bool = False) -> tuple[Any, Callable[[int], None]]:
    """A fresh loader of contender ``name`` and its ``set_epoch`` (``random_crop``: training crops,
    ``RandomResizedCrop(crop)`` and flips, instead of ``CenterCrop(crop)``)."""
    cropping = RandomResizedCrop(crop, flip=0.5) if random_crop else CenterCrop(crop)
    if name in ("packloader", "packloader_per_image"):
        ds = PackedImageFolder(pack)
        loader = PackLoader(ds, batch_size, sampler=ds.sampler(seed=0), crop=cropping, threads=workers,
                            drop_last=True)
        return loader, loader.set_epoch
    if name == "batch_loader":
        ds = PackedImageFolder(pack)
        sampler = ds.sampler(seed=0)
        loader = batch_loader(ds, batch_size, sampler=sampler, crop=cropping, channels_last=True,
                              drop_last=True, num_workers=workers, persistent_workers=workers > 0)
        return loader, sampler.set_epoch
    if name == "drop_in":
        ds = PackedImageFolder(pack, transform=cropping, decode_size=None if random_crop else (crop, crop))
        sampler = ds.sampler(seed=0)
        loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=workers, collate_fn=collate_uint8,
                            drop_last=True, persistent_workers=workers > 0)
        return loader, sampler.set_epoch
    raise ValueError(f"unknown contender {name!r}; choose from {', '.join(CONTENDERS)}")


def endless(loader: Any, set_epoch: Callable[[int], None]) -> Iterator[tuple[torch.Tensor, ...]]:
    """The loader's batches, epoch after epoch."""
    epoch = 0
    while True:
        set_epoch(epoch)
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the pack holds fewer images than one batch")
        epoch += 1


def measure(name: str, pack: str, batch_size: int, crop: int, workers: int, step: Step | None, seconds: float,
            warmup: int, random_crop: bool = False) -> dict[str, Any]:
    """Images/s of the loop "take a batch, run ``step``" over ``seconds`` after ``warmup`` batches."""
    loader, set_epoch = make_loader(name, pack, batch_size, crop, workers, random_crop)
    batches = endless(loader, set_epoch)
    jpeg_kernel.set_enabled(name != "packloader_per_image")  # the compiled batch decoder, or simplejpeg per image
    try:
        for _ in range(warmup):
            next(batches)
        images = steps = 0
        held = stepping = 0.0
        start = time.perf_counter()
        while True:
            _, labels = next(batches)
            if step is not None:
                began = time.perf_counter()
                held += step()
                stepping += time.perf_counter() - began
            images += len(labels)
            steps += 1
            wall = time.perf_counter() - start
            if wall >= seconds:
                break
    finally:
        batches.close()
        if isinstance(loader, PackLoader):
            loader.close()
        del loader
        jpeg_kernel.set_enabled(True)
    return {"images_per_s": images / wall, "seconds": wall, "batches": steps, "gil_held": held / wall,
            "held_ms": 1000 * held / steps, "step_ms": 1000 * stepping / steps}


def parse_list(text: str, cast: Callable[[str], Any]) -> list[Any]:
    return [cast(item) for item in text.split(",") if item.strip()]


def run(args: argparse.Namespace) -> dict[str, Any]:
    workers = args.workers or usable_cores()
    fractions = [f / 100 for f in parse_list(args.fractions, float)]
    if 0.0 not in fractions:
        fractions.insert(0, 0.0)
    switches = parse_list(args.switch_ms, float)
    if DEFAULT_SWITCH_MS not in switches:
        switches.insert(0, DEFAULT_SWITCH_MS)
    contenders = parse_list(args.contenders, str)
    for name in contenders:
        if name not in CONTENDERS:
            raise SystemExit(f"unknown contender {name!r}; choose from {', '.join(CONTENDERS)}")
    # (contender, switch interval): PackLoader at every interval, the process-based ones at the default
    cases = [(name, switch) for name in contenders
             for switch in (switches if name == "packloader" else [DEFAULT_SWITCH_MS])]

    began = time.perf_counter()
    with switch_interval(DEFAULT_SWITCH_MS / 1000):
        alone = measure("packloader", args.pack, args.batch_size, args.crop, workers, None, args.calibrate_s,
                        args.warmup, args.random_crop)
    step_ms = args.step_ms if args.step_ms is not None else 0.8 * 1000 * args.batch_size / alone["images_per_s"]
    say = print if args.verbose else (lambda *a, **k: None)
    say(f"PackLoader alone: {alone['images_per_s']:.0f} img/s; step {step_ms:.2f} ms", flush=True)

    samples: dict[tuple[str, float, float], list[dict[str, Any]]] = {}
    for round_ in range(args.repeats):  # interleaved rounds in a shuffled order: noise hits every case alike
        order = [(name, switch, fraction) for fraction in fractions for name, switch in cases]
        random.Random(round_).shuffle(order)
        for name, switch, fraction in order:
            step = Step(step_ms / 1000, fraction, args.hold, args.slice_us, args.rest)
            with switch_interval(switch / 1000):
                result = measure(name, args.pack, args.batch_size, args.crop, workers, step, args.seconds,
                                 args.warmup, args.random_crop)
            samples.setdefault((name, switch, fraction), []).append(result)
            say(f"  {name:12s} switch {switch:g} ms  f={fraction:.2f}: {result['images_per_s']:.0f} img/s, "
                f"GIL held {result['gil_held']:.0%}, held part {result['held_ms']:.2f} ms, step "
                f"{result['step_ms']:.2f} ms", flush=True)

    rows = []
    for name, switch in cases:
        base = statistics.median(r["images_per_s"] for r in samples[(name, switch, 0.0)])
        for fraction in fractions:
            runs = samples[(name, switch, fraction)]
            rate = statistics.median(r["images_per_s"] for r in runs)
            rows.append({
                "contender": name, "switch_ms": switch, "fraction": fraction,
                "images_per_s": round(rate, 1),
                "images_per_s_runs": [round(r["images_per_s"], 1) for r in runs],
                "gil_held": round(statistics.median(r["gil_held"] for r in runs), 3),
                "held_ms": round(statistics.median(r["held_ms"] for r in runs), 3),
                "step_ms": round(statistics.median(r["step_ms"] for r in runs), 3),
                "vs_fraction_0": round(rate / base, 3) if base else None,
            })
    return {
        "pack": args.pack, "batch_size": args.batch_size, "crop": args.crop, "workers": workers,
        "random_crop": args.random_crop,
        "hold": args.hold, "rest": args.rest, "slice_us": args.slice_us, "step_ms": round(step_ms, 3),
        "seconds": args.seconds, "repeats": args.repeats, "fractions": fractions, "switch_ms": switches,
        "contenders": contenders,
        "alone": {"images_per_s": round(alone["images_per_s"], 1),
                  "batch_ms": round(1000 * args.batch_size / alone["images_per_s"], 3)},
        "rows": rows,
        "took_s": round(time.perf_counter() - began, 1),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "python": sys.version.split()[0], "torch": torch.__version__,
    }


def render(result: dict[str, Any]) -> str:
    """The results as a markdown table (one row per contender and switch interval) and notes."""
    fractions = result["fractions"]
    head = "| contender | switch interval | " + " | ".join(f"f = {f:.0%}" for f in fractions) + " |"
    lines = [
        f"batch {result['batch_size']}, {'RandomResizedCrop + flip' if result['random_crop'] else 'CenterCrop'} "
        f"{result['crop']}, {result['workers']} threads/workers, "
        f"step {result['step_ms']:.2f} ms (hold: {result['hold']}, rest: {result['rest']}, "
        f"{result['slice_us']} us slices), "
        f"{result['seconds']:g} s x {result['repeats']} per case; PackLoader alone "
        f"{result['alone']['images_per_s']:.0f} img/s; took {result['took_s']:.0f} s",
        "",
        "images/s (x same contender at f = 0) [GIL-held part's share of the run; that part's ms per step, "
        "nominal f x step]",
        "",
        head,
        "|---|--:|" + "--:|" * len(fractions),
    ]
    by_case: dict[tuple[str, float], dict[float, dict[str, Any]]] = {}
    for row in result["rows"]:
        by_case.setdefault((row["contender"], row["switch_ms"]), {})[row["fraction"]] = row
    for (name, switch), cells in by_case.items():
        text = []
        for f in fractions:
            row = cells[f]
            held = f"; {row['held_ms']:.1f} ms" if f else ""
            text.append(f"{row['images_per_s']:,.0f} ({row['vs_fraction_0']:.2f}x) [{row['gil_held']:.0%}{held}]")
        lines.append(f"| {LABELS[name]} | {switch:g} ms | " + " | ".join(text) + " |")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pack", help="a JPEG (or other) pack: shards folder or LMDB file")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--crop", type=int, default=224, help="CenterCrop side (with --random-crop: RandomResizedCrop's)")
    p.add_argument("--random-crop", action="store_true", help="training crops: RandomResizedCrop and flips")
    p.add_argument("--workers", type=int, help="PackLoader threads and DataLoader workers (default: usable cores)")
    p.add_argument("--contenders", default="packloader,batch_loader,drop_in")
    p.add_argument("--fractions", default="0,25,50,90", help="GIL-held percent of the step (0 is always run)")
    p.add_argument("--switch-ms", default="5,0.5,0.1", help="sys.setswitchinterval values for PackLoader, ms")
    p.add_argument("--hold", choices=("gil", "gil-ops", "cpu"), default="gil")
    p.add_argument("--rest", choices=("slices", "sleep"), default="slices",
                   help="the GIL-free rest of the step: usleep slices (same wake-ups at every fraction) or one sleep")
    p.add_argument("--slice-us", type=int, default=100, help="length of one GIL-holding usleep call")
    p.add_argument("--step-ms", type=float, help="the loop's step (default: 0.8 x PackLoader's batch time alone)")
    p.add_argument("--seconds", type=float, default=4.0, help="timed window per case")
    p.add_argument("--warmup", type=int, default=3, help="batches before the window")
    p.add_argument("--calibrate-s", type=float, default=3.0, help="window for PackLoader alone")
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds (median reported)")
    p.add_argument("--quick", action="store_true", help="a smoke run under 20 s: f 0/50, 5 and 0.5 ms, 1 s windows")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--verbose", action="store_true", help="print each case as it finishes")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.fractions, args.switch_ms, args.contenders = "0,50", "5,0.5", "packloader,batch_loader"
        args.seconds, args.calibrate_s, args.warmup, args.repeats = 1.0, 0.5, 2, 1
    result = run(args)
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
