"""Real training steps on a GPU, fed by each loader in turn: is training input-bound, and with what?

    python benchmarks/gpu_train.py IMAGES KEEP_PACK SMALL_PACK --model resnet18 --seconds 15

``IMAGES`` is the original ImageFolder-style folder of JPEGs, ``KEEP_PACK`` the same images packed
``--encoding keep``, ``SMALL_PACK`` packed ``--encoding jpeg --max-side 256``. Every contender feeds
the same model (bf16 autocast, channels-last, SGD with momentum, batch ``--batch-size``, crop 224)
for ``--seconds`` after a warm-up, with the CPU at most two steps ahead of the GPU, as a training
loop that reads its loss every step does:

* the ceiling: one batch already on the GPU, stepped again and again (what the GPU alone can do);
* the ImageFolder-style loader (``FolderImages`` + ``ResizeCenterCrop(224)``, PIL) through a
  DataLoader with ``pin_memory=True``: the usual training script;
* each pack through the drop-in DataLoader path (``decode_size``) and through ``PackLoader`` +
  ``CenterCrop(224)`` with pinned batches and ``non_blocking`` copies, and the training crop
  (``RandomResizedCrop(224)`` + flip) through ``PackLoader`` on the CPU;
* with a GPU JPEG decoder (nvImageCodec, the ``gpu`` extra, else torchvision's ``decode_jpeg``):
  ``PackLoader(device="cuda")``, JPEGs decoded, cropped and flipped on the GPU, with both crops.

It prints one JSON document: images/s of each, the share of the GPU's own rate it reaches, the rate
of a few loaders alone (no training), the best GPU-decoded row against the best CPU-fed one, which
GPU decoder ran, and checks that PackLoader's pinned batches arrive on the GPU unchanged and that a
GPU-decoded batch has the CPU batch's labels and pixels within 3 levels of 255 on average (the exit
code is 1 otherwise). The model is torchvision's ``resnet18``/``resnet50`` when torchvision is
installed (a benchmark-only dependency), else packload's ``small-cnn``. Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch.utils.data import DataLoader  # noqa: E402

from packload import (  # noqa: E402
    CenterCrop,
    PackedImageFolder,
    PackLoader,
    RandomResizedCrop,
    UsageError,
    collate_uint8,
)
from packload.core.cpus import usable_cores  # noqa: E402
from packload.diagnose.gpu_step import SmallCNN  # noqa: E402
from packload.diagnose.measure import machine_info  # noqa: E402
from packload.loaders.folder import FolderImages  # noqa: E402
from packload.loaders.transforms import ResizeCenterCrop  # noqa: E402

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


def build_model(name: str, num_classes: int) -> tuple[nn.Module, str]:
    """The model to train and where it came from (torchvision when installed, else packload's CNN)."""
    if name != "small-cnn":
        try:
            import torchvision.models as models

            return getattr(models, name)(num_classes=num_classes), f"torchvision.models.{name}"
        except ImportError:
            print(f"gpu_train: torchvision is not installed; training packload's small-cnn instead of {name}",
                  file=sys.stderr)
    return SmallCNN(num_classes=num_classes), "packload.diagnose.gpu_step.SmallCNN"


class Trainer:
    """One SGD step per batch on the GPU; ``uint8`` batches are normalised on the device."""

    def __init__(self, model: nn.Module, device: torch.device, in_flight: int = 2) -> None:
        self.device = device
        self.model = model.to(device).to(memory_format=torch.channels_last).train()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()
        self.mean, self.std = MEAN.to(device), STD.to(device)
        self.pending: deque[torch.cuda.Event] = deque()
        self.in_flight = in_flight
        self.on_gpu = device.type == "cuda"

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        x = images.float().sub_(self.mean).div_(self.std).contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            loss = self.loss_fn(self.model(x), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        if not self.on_gpu:
            return
        event = torch.cuda.Event()
        event.record()
        self.pending.append(event)
        while len(self.pending) > self.in_flight:  # the CPU stays at most in_flight steps ahead
            self.pending.popleft().synchronize()

    def synchronize(self) -> None:
        if self.on_gpu:
            torch.cuda.synchronize(self.device)

    def run(self, batches: Iterable[tuple[torch.Tensor, ...]], seconds: float, warmup: int = 3) -> dict[str, Any]:
        """Train on ``batches`` for ``seconds`` after ``warmup`` batches; images/s and batches seen."""
        count, images, start = 0, 0, 0.0
        for n, (x, y, *_) in enumerate(batches):
            self.step(x, y)
            if n + 1 == warmup:
                self.synchronize()
                start = time.perf_counter()
            elif n + 1 > warmup:
                count += 1
                images += len(y)
                if time.perf_counter() - start >= seconds:
                    break
        self.synchronize()
        elapsed = time.perf_counter() - start
        self.pending.clear()
        return {"images_per_s": round(images / elapsed, 1) if count else None, "batches": count,
                "seconds": round(elapsed, 2)}


def loader_alone(batches: Iterator[tuple[torch.Tensor, ...]], seconds: float, warmup: int = 3) -> dict[str, Any]:
    """The loader's own rate, batches taken and dropped: what it could feed a GPU without limit."""
    images, start = 0, 0.0
    for n, (_, y, *_) in enumerate(batches):
        if n + 1 == warmup:
            start = time.perf_counter()
        elif n + 1 > warmup:
            images += len(y)
            if time.perf_counter() - start >= seconds:
                break
    return {"images_per_s": round(images / (time.perf_counter() - start), 1)}


def repeat(batch: tuple[torch.Tensor, torch.Tensor]) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield batch


def epochs(make: Callable[[], Iterable[Any]]) -> Iterator[Any]:
    """Batches from ``make()``, epoch after epoch, so a small dataset still fills the time; the
    loader's workers or threads stop when the generator is closed. A loader that is a one-pass
    iterator (a generator) is made again for each epoch."""
    loader = make()
    try:
        while True:
            yield from loader
            if iter(loader) is loader:  # spent: iterating it again would yield nothing, forever
                loader = make()
    finally:
        if isinstance(loader, PackLoader):
            loader.close()
        del loader  # a DataLoader's persistent workers exit with it


def gpu_decoder_name(pack: str) -> str | None:
    """The GPU JPEG decoder ``PackLoader(device="cuda")`` picks here (None: none works; the reason on stderr)."""
    ds = PackedImageFolder(pack)
    try:
        return PackLoader(ds, 8, crop=CenterCrop(224), device="cuda").gpu.decoder.name
    except UsageError as exc:
        print(f"gpu_train: no GPU decoding rows: {exc}", file=sys.stderr)
        return None


def compare_gpu_batches(pack: str, batch_size: int) -> dict[str, Any]:
    """``PackLoader(device="cuda")``'s first training batch against the CPU path's of the same seed:
    labels, and pixels in levels of 255 (the same boxes and flips; the decoders' IDCTs differ)."""
    ds = PackedImageFolder(pack)
    crop = RandomResizedCrop(224)
    with PackLoader(ds, batch_size, sampler=ds.sampler(seed=0), crop=crop, flip=True) as cpu_loader:
        cpu_images, cpu_labels = next(iter(cpu_loader))
    with PackLoader(ds, batch_size, sampler=ds.sampler(seed=0), crop=crop, flip=True, device="cuda") as gpu_loader:
        gpu_images, gpu_labels = next(iter(gpu_loader))
    diff = (gpu_images.cpu().int() - cpu_images.int()).abs().float()
    return {"same_labels": bool(torch.equal(gpu_labels.cpu(), cpu_labels)), "mean_abs_diff": round(diff.mean().item(), 3),
            "max_abs_diff": int(diff.max().item()), "on_gpu": gpu_images.device.type == "cuda",
            "channels_last": gpu_images.is_contiguous(memory_format=torch.channels_last)}


def check_pinned_batches(pack: str, batch_size: int, device: torch.device) -> dict[str, Any]:
    """PackLoader's pinned batches: pinned, and identical on the GPU after a non_blocking copy."""
    ds = PackedImageFolder(pack)
    with PackLoader(ds, batch_size, sampler=ds.sampler(seed=0), crop=CenterCrop(224), pin_memory=True) as loader:
        images, labels = next(iter(loader))
        on_gpu = images.to(device, non_blocking=True)
        same = bool(torch.equal(on_gpu.cpu(), images))
    return {"pinned": bool(images.is_pinned() and labels.is_pinned()), "identical_on_gpu": same,
            "channels_last": images.is_contiguous(memory_format=torch.channels_last)}


def versus_best_cpu_feed(results: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The best GPU-decoded row against the best row fed by CPU decoding (the ceiling left out)."""
    rates = {name: r["images_per_s"] for name, r in results.items() if r.get("images_per_s")}
    gpu = {name: rate for name, rate in rates.items() if "device='cuda'" in name}
    cpu = {name: rate for name, rate in rates.items() if "device='cuda'" not in name and not name.startswith("ceiling")}
    if not gpu or not cpu:
        return None
    best_gpu, best_cpu = max(gpu, key=gpu.__getitem__), max(cpu, key=cpu.__getitem__)
    return {"gpu": best_gpu, "cpu": best_cpu, "ratio": round(gpu[best_gpu] / cpu[best_cpu], 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("images", help="the original image folder (ImageFolder layout)")
    parser.add_argument("keep_pack", help="the folder packed with --encoding keep")
    parser.add_argument("small_pack", help="the folder packed with --encoding jpeg --max-side 256")
    parser.add_argument("--model", default="resnet18", help="resnet18, resnet50 (torchvision) or small-cnn")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, help="DataLoader workers and PackLoader threads (default: all cores)")
    parser.add_argument("--seconds", type=float, default=15.0, help="training time per contender, after warm-up")
    parser.add_argument("--device", default="cuda",
                        help="cuda (default), or cpu to check the script itself (that measures the CPU, not a GPU)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"gpu_train: no CUDA device here (torch {torch.__version__}); run it on a machine with an "
              "NVIDIA GPU. Nothing was measured.")
        return 0
    torch.backends.cudnn.benchmark = True
    workers = args.workers or usable_cores()
    batch = args.batch_size
    classes = len(FolderImages(args.images).classes)
    model, source = build_model(args.model, classes)
    trainer = Trainer(model, device)
    resize_crop, crop, random_crop = ResizeCenterCrop(224), CenterCrop(224), RandomResizedCrop(224)
    pin = device.type == "cuda"

    def folder() -> DataLoader:
        return DataLoader(FolderImages(args.images, transform=resize_crop), batch_size=batch, shuffle=True,
                          num_workers=workers, collate_fn=collate_uint8, pin_memory=pin,
                          persistent_workers=True, prefetch_factor=4, drop_last=True)

    def drop_in(pack: str) -> Callable[[], DataLoader]:
        ds = PackedImageFolder(pack, transform=resize_crop, decode_size=(224, 224))
        return lambda: DataLoader(ds, batch_size=batch, sampler=ds.sampler(seed=0), num_workers=workers,
                                  collate_fn=collate_uint8, pin_memory=pin, persistent_workers=True,
                                  prefetch_factor=4, drop_last=True)

    def fast(pack: str) -> Callable[[], PackLoader]:
        ds = PackedImageFolder(pack)
        return lambda: PackLoader(ds, batch, sampler=ds.sampler(seed=0), crop=crop, threads=workers,
                                  pin_memory=pin, drop_last=True)

    def training(pack: str, on: str | None = None) -> Callable[[], PackLoader]:
        ds = PackedImageFolder(pack)
        threads = None if on else workers  # the GPU path's own default: a few threads
        return lambda: PackLoader(ds, batch, sampler=ds.sampler(seed=0), crop=random_crop, flip=True, threads=threads,
                                  pin_memory=pin and not on, drop_last=True, device=on)

    def gpu_centre(pack: str) -> Callable[[], PackLoader]:
        ds = PackedImageFolder(pack)
        return lambda: PackLoader(ds, batch, sampler=ds.sampler(seed=0), crop=crop, drop_last=True, device="cuda")

    resident = (torch.randint(0, 256, (batch, 3, 224, 224), dtype=torch.uint8, device=device)
                .contiguous(memory_format=torch.channels_last),
                torch.randint(0, classes, (batch,), device=device))
    contenders: dict[str, Callable[[], Iterable[Any]]] = {
        "ceiling: one batch already on the GPU": lambda: repeat(resident),
        "original files, FolderImages + ResizeCenterCrop(224), DataLoader": folder,
        "keep pack, drop-in DataLoader, decode_size=(224, 224)": drop_in(args.keep_pack),
        "keep pack, PackLoader + CenterCrop(224)": fast(args.keep_pack),
        "max-side-256 pack, drop-in DataLoader, decode_size=(224, 224)": drop_in(args.small_pack),
        "max-side-256 pack, PackLoader + CenterCrop(224)": fast(args.small_pack),
        "max-side-256 pack, PackLoader + RandomResizedCrop(224) + flip": training(args.small_pack),
    }
    decoder = gpu_decoder_name(args.small_pack) if pin else None
    if decoder:
        contenders[f"max-side-256 pack, PackLoader(device='cuda') + CenterCrop(224), {decoder}"] = \
            gpu_centre(args.small_pack)
        contenders[f"max-side-256 pack, PackLoader(device='cuda') + RandomResizedCrop(224) + flip, {decoder}"] = \
            training(args.small_pack, "cuda")
        contenders[f"keep pack, PackLoader(device='cuda') + RandomResizedCrop(224) + flip, {decoder}"] = \
            training(args.keep_pack, "cuda")
    report: dict[str, Any] = {"machine": machine_info(), "model": source, "batch_size": batch,
                              "workers_or_threads": workers, "seconds": args.seconds, "results": {},
                              "loader_alone": {}, "gpu_decoder": decoder}
    if pin:
        report["pinned_batches"] = check_pinned_batches(args.small_pack, batch, device)
    if decoder:
        report["gpu_vs_cpu_batch"] = compare_gpu_batches(args.small_pack, batch)
    faulthandler.dump_traceback_later(120, repeat=True)  # where a stuck contender waits, on stderr
    for name, make in contenders.items():
        print(f"{name}: started", file=sys.stderr, flush=True)
        batches = epochs(make)
        result = trainer.run(batches, args.seconds)
        batches.close()
        report["results"][name] = result
        print(f"{name}: {result['images_per_s']} img/s", file=sys.stderr, flush=True)
    alone = ["original files, FolderImages + ResizeCenterCrop(224), DataLoader",
             "max-side-256 pack, PackLoader + CenterCrop(224)"]
    alone += [name for name in contenders if "device='cuda'" in name and "max-side-256" in name and "Random" in name]
    for name in alone:
        batches = epochs(contenders[name])
        result = loader_alone(batches, args.seconds / 2)
        batches.close()
        report["loader_alone"][name] = result
        print(f"{name}, loader alone: {result['images_per_s']} img/s", file=sys.stderr, flush=True)
    faulthandler.cancel_dump_traceback_later()
    ceiling = report["results"]["ceiling: one batch already on the GPU"]["images_per_s"]
    for result in report["results"].values():
        result["of_gpu_rate"] = round(result["images_per_s"] / ceiling, 3) if result["images_per_s"] else None
    report["gpu_decode_vs_best_cpu_feed"] = versus_best_cpu_feed(report["results"])
    print(json.dumps(report, indent=2, default=str))
    checks = report.get("pinned_batches", {"pinned": True, "identical_on_gpu": True})
    same = report.get("gpu_vs_cpu_batch", {"same_labels": True, "mean_abs_diff": 0})
    gpu_ok = same["same_labels"] and same["mean_abs_diff"] < 3
    return 0 if checks["pinned"] and checks["identical_on_gpu"] and gpu_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
