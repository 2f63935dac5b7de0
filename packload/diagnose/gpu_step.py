"""A stand-in for one training step, so a loader is measured against the GPU it has to feed.

``DummyStep(step_ms=120)`` keeps the GPU busy for 120 ms per batch (a loop of matrix multiplies,
calibrated and checked on the device); ``DummyStep(model="small-cnn")`` runs a small CNN's forward,
backward and SGD update instead. Each call copies the batch to the device as training does
(``non_blocking`` when the batch is pinned) and returns without waiting for the GPU: the CPU runs at
most ``max_in_flight`` steps ahead, as a training loop that reads its loss every step or two does,
so the loader and the GPU overlap as they do in real training. ``sync=True`` is the loop that waits
for every step before it asks for the next batch (``loss.item()`` each step, as the PyTorch tutorial
does): loading in the main process then stalls the GPU.

Without CUDA the step is emulated on a virtual GPU timeline: the same queue of steps, each taking
``step_ms``, waited for with ``time.sleep`` so that the emulation uses no CPU the loader could use.
A CNN is not emulated (running it on the CPU would measure the CPU, not a GPU): ``model`` needs CUDA.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

SMALL_CNN = "small-cnn"
MODELS = (SMALL_CNN,)
DEFAULT_IMAGE_SHAPE = (3, 224, 224)


class SmallCNN(nn.Module):
    """Five stride-2 conv-BN-ReLU blocks, global pooling and a linear classifier (~1.6 M parameters).

    Takes ``B×3×H×W`` batches, uint8 (scaled to [0, 1] and normalised on the device, as a training
    script does after the copy) or float.
    """

    def __init__(self, num_classes: int = 1000, width: int = 32) -> None:
        super().__init__()
        channels = [3, width, width * 2, width * 4, width * 8, width * 16]
        blocks: list[nn.Module] = []
        for c_in, c_out in zip(channels, channels[1:], strict=False):
            blocks += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out),
                       nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*blocks)
        self.head = nn.Linear(channels[-1], num_classes)
        self.num_classes = num_classes

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images.float().div_(255.0).sub_(0.45).div_(0.225) if images.dtype == torch.uint8 else images
        x = self.features(x)
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def iter_tensors(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a batch as a DataLoader yields it (tensor, tuple, list, dict, nested)."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for value in batch.values():
            yield from iter_tensors(value)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            yield from iter_tensors(value)


def _resolve_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine; leave device unset "
                         "to emulate the GPU step by waiting")
    if resolved.type not in ("cuda", "cpu"):
        raise ValueError(f"device {device!r}: choose cuda, cuda:N or cpu")
    return resolved


class DummyStep:
    """One training step per batch on the GPU (or its emulation), with a measured rate.

    Args:
        step_ms: GPU time per batch to emulate (a calibrated matrix-multiply loop on CUDA, a wait
            without CUDA).
        model: ``"small-cnn"`` for a small CNN's forward+backward on the GPU instead (CUDA only).
        device: ``cuda``, ``cuda:N`` or ``cpu`` (default: CUDA when available).
        max_in_flight: steps the GPU may have queued before a call waits for the oldest one.
        sync: each call waits for its own step to finish (a loop that synchronises every step).
    """

    def __init__(self, step_ms: float | None = None, model: str | None = None, device: str | None = None,
                 max_in_flight: int = 2, sync: bool = False) -> None:
        if (step_ms is None) == (model is None):
            raise ValueError("give step_ms (the GPU time of one training step, in ms) or model='small-cnn', "
                             "not both and not neither")
        if step_ms is not None and not step_ms > 0:
            raise ValueError(f"step_ms {step_ms} must be a positive number of milliseconds")
        if model is not None and model not in MODELS:
            raise ValueError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight {max_in_flight} must be at least 1")
        self.device = _resolve_device(device)
        self.on_gpu = self.device.type == "cuda"
        if model is not None and not self.on_gpu:
            raise ValueError(f"model={model!r} needs a CUDA GPU: running it on the CPU would measure the CPU, "
                             "not a GPU. On a machine without CUDA give step_ms (the GPU time of one "
                             "training step, measured on the training machine) instead")
        self.step_ms = float(step_ms) if step_ms is not None else None
        self._ms = self.step_ms or 0.0  # the same, as a float for the arithmetic (unused with a model)
        self.model_name = model
        self.max_in_flight = max_in_flight
        self.sync = sync
        self.image_shape: tuple[int, ...] = DEFAULT_IMAGE_SHAPE
        self._pending: deque[Any] = deque()  # CUDA events, or finish times on the virtual timeline
        self._gpu_free_at = 0.0
        self._rates: dict[tuple[int, tuple[int, ...]], float] = {}
        self.calibration: dict[str, Any]
        self._model: SmallCNN | None = None
        if not self.on_gpu:
            why = "no CUDA here" if not torch.cuda.is_available() else "device=cpu"
            self.calibration = {"emulated": True, "requested_ms": self.step_ms, "method": "time.sleep"}
            self.description = f"emulated GPU step: a {self.step_ms:g} ms wait per batch ({why})"
            return
        name = torch.cuda.get_device_name(self.device)
        try:
            if model is not None:
                self._build_model()
                self.calibration = {"emulated": False, "model": model}
                self.description = f"{model} forward+backward+SGD on {name}"
            else:
                self.calibration = self._calibrate()
                self.description = (f"{self.step_ms:g} ms matrix-multiply step on {name} "
                                    f"(calibrated: {self.calibration['measured_ms']:.1f} ms measured)")
        except RuntimeError as exc:  # e.g. no kernels for this GPU in this PyTorch build
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"the GPU step could not run on {name} ({first}); check the PyTorch build with "
                             "`packload doctor`, or pass device='cpu' to emulate the step by waiting") from exc

    # -- one step ---------------------------------------------------------------------------
    def __call__(self, batch: Any) -> None:
        """Run one step on ``batch`` and return as soon as the CPU may go on (see ``max_in_flight``)."""
        if not self.on_gpu:
            self._emulated_step()
            if self.sync:
                self.synchronize()
            return
        tensors = [t.to(self.device, non_blocking=t.is_pinned()) for t in iter_tensors(batch)]
        images = next((t for t in tensors if t.dim() == 4), None)
        if images is not None:
            self.image_shape = tuple(images.shape[1:])
        if self._model is not None:
            if images is None:
                raise ValueError("model='small-cnn' needs B×3×H×W image batches (use packload.collate_uint8)")
            labels = next((t for t in tensors if t.dim() == 1 and len(t) == len(images)), None)
            self._cnn_step(images, labels)
        else:
            if images is not None:
                images.float().mean()  # the conversion training does after the copy
            self._matmuls(self._iterations)
        event = torch.cuda.Event()
        event.record()
        self._pending.append(event)
        while len(self._pending) > self.max_in_flight:
            self._pending.popleft().synchronize()
        if self.sync:
            event.synchronize()
            self._pending.clear()

    def _emulated_step(self) -> None:
        now = time.perf_counter()
        finish = max(now, self._gpu_free_at) + self._ms / 1000.0
        self._gpu_free_at = finish
        self._pending.append(finish)
        while len(self._pending) > self.max_in_flight:
            wait = self._pending.popleft() - time.perf_counter()
            if wait > 0:
                time.sleep(wait)

    def synchronize(self) -> None:
        """Wait until every queued step has finished (at the end of a measurement, as training would)."""
        if self.on_gpu:
            torch.cuda.synchronize(self.device)
        else:
            wait = self._gpu_free_at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        self._pending.clear()

    def step_rate(self, batch_size: int, image_shape: tuple[int, ...] | None = None) -> float:
        """Samples per second the step alone sustains with batches of ``batch_size``.

        Measured on the device (for the CNN with ``image_shape``, default the last batch's shape);
        for the emulation it is exact by construction (``batch_size / step_ms``).
        """
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size} must be at least 1")
        if not self.on_gpu:
            return batch_size * 1000.0 / self._ms
        if self._model is None:
            return batch_size * 1000.0 / self.calibration["measured_ms"]
        shape = tuple(image_shape or self.image_shape)
        if (batch_size, shape) not in self._rates:
            images = torch.randint(0, 256, (batch_size, *shape), dtype=torch.uint8, device=self.device)
            labels = torch.randint(0, self._model.num_classes, (batch_size,), device=self.device)
            ms = self._time_ms(lambda: self._cnn_step(images, labels), warmup=3, repeats=10)
            self.calibration.update({"measured_ms": ms, "batch_size": batch_size, "image_shape": list(shape)})
            self._rates[(batch_size, shape)] = batch_size * 1000.0 / ms
        return self._rates[(batch_size, shape)]

    # -- CUDA internals ----------------------------------------------------------------------
    def _build_model(self) -> None:
        self._model = SmallCNN().to(self.device).to(memory_format=torch.channels_last)
        self._optimizer = torch.optim.SGD(self._model.parameters(), lr=0.01, momentum=0.9)

    def _cnn_step(self, images: torch.Tensor, labels: torch.Tensor | None) -> None:
        assert self._model is not None
        images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self._model(images)
        target = (labels.long().clamp(min=0) % self._model.num_classes if labels is not None
                  else torch.zeros(len(images), dtype=torch.long, device=self.device))
        loss = nn.functional.cross_entropy(logits.float(), target)
        loss.backward()
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)

    def _matrices(self, n: int) -> None:
        self._a = torch.randn(n, n, device=self.device, dtype=torch.bfloat16)
        self._b = torch.randn(n, n, device=self.device, dtype=torch.bfloat16)
        self._c = torch.empty(n, n, device=self.device, dtype=torch.bfloat16)

    def _matmuls(self, count: int) -> None:
        for _ in range(count):
            torch.mm(self._a, self._b, out=self._c)

    def _time_ms(self, fn: Any, warmup: int = 2, repeats: int = 5) -> float:
        """Milliseconds per call of ``fn`` on the device, timed with CUDA events."""
        for _ in range(warmup):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(self.device)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / repeats

    def _calibrate(self) -> dict[str, Any]:
        """Pick a matrix size giving at least ~20 multiplies per step (fine-grained, few launches),
        then the count that fills ``step_ms``, measured and corrected until within 2%; the result
        records the last measurement and whether it is within 10%."""
        target = self._ms / 20.0
        size, per_op = 256, 0.0
        for n in (256, 512, 1024, 2048, 4096, 8192):
            self._matrices(n)
            ms = self._time_ms(lambda: self._matmuls(10), warmup=2, repeats=3) / 10
            if n > 256 and ms > target:
                break
            size, per_op = n, ms
        n = size
        self._matrices(n)
        self._iterations = max(1, round(self._ms / max(per_op, 1e-6)))
        for attempt in range(4):  # correct the count until the measured step is within 2% of the request
            measured = self._time_ms(lambda: self._matmuls(self._iterations), warmup=1, repeats=5)
            error = (measured - self._ms) / self._ms * 100
            if abs(error) <= 2.0 or attempt == 3:
                break
            self._iterations = max(1, round(self._iterations * self._ms / measured))
        return {"emulated": False, "requested_ms": self.step_ms, "measured_ms": round(measured, 3),
                "error_pct": round(error, 2), "ok": abs(error) <= 10.0, "matrix": n,
                "matmuls_per_step": self._iterations, "dtype": "bfloat16"}
