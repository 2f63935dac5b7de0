"""The stand-in training step (``packload.diagnose.gpu_step``): its arguments, the emulated GPU
timeline (checked on a clock that only moves when the step sleeps), its rate, the tensors it
finds in a batch, and the small CNN."""

from __future__ import annotations

import pytest
import torch

from packload.diagnose import gpu_step
from packload.diagnose.gpu_step import DummyStep, SmallCNN, iter_tensors


class VirtualTime:
    """``time`` for gpu_step alone: the clock stands still unless ``sleep`` moves it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 9))
        self.now += seconds


def test_arguments_are_checked() -> None:
    for kwargs, match in (({}, "give step_ms"), ({"step_ms": 5, "model": "small-cnn"}, "not both"),
                          ({"step_ms": 0}, "positive"), ({"model": "resnet"}, "unknown model"),
                          ({"step_ms": 5, "max_in_flight": 0}, "at least 1"),
                          ({"step_ms": 5, "device": "mps"}, "choose cuda, cuda:N or cpu")):
        with pytest.raises(ValueError, match=match):
            DummyStep(**kwargs)
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        DummyStep(model="small-cnn", device="cpu")


def test_the_emulated_step_queues_at_most_max_in_flight_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = VirtualTime()
    monkeypatch.setattr(gpu_step, "time", clock)
    step = DummyStep(step_ms=100, device="cpu", max_in_flight=2)
    assert step.calibration["emulated"] and "100 ms wait per batch" in step.description
    step(None)
    step(None)
    assert clock.sleeps == []  # two steps queued on the virtual GPU: the CPU goes on
    step(None)  # a third: wait for the first to finish (at 100.1 s)
    assert clock.sleeps == [0.1] and clock.now == pytest.approx(100.1)
    clock.now += 1.0  # the loader took a second: the queued steps finished meanwhile
    step(None)
    step(None)
    assert clock.sleeps == [0.1]  # nothing to wait for
    step.synchronize()  # the two new steps run from now on (not from when the GPU went idle): 0.2 s
    assert clock.sleeps == [0.1, 0.2] and clock.now == pytest.approx(101.3)


def test_the_emulated_rate_is_exact() -> None:
    step = DummyStep(step_ms=40, device="cpu")
    assert step.step_rate(32) == 800.0
    with pytest.raises(ValueError, match="at least 1"):
        step.step_rate(0)


def test_iter_tensors_finds_every_tensor_of_a_batch() -> None:
    a, b, c = torch.zeros(2, 3), torch.ones(4), torch.arange(5)
    assert list(iter_tensors(a)) == [a]
    found = list(iter_tensors({"image": a, "meta": [b, (c, "name", 7)]}))
    assert len(found) == 3 and all(x is y for x, y in zip(found, (a, b, c), strict=True))
    assert list(iter_tensors(["text", 3])) == []


def test_small_cnn_scales_uint8_as_training_does() -> None:
    torch.manual_seed(0)
    model = SmallCNN(num_classes=7, width=4).eval()
    images = torch.randint(0, 256, (2, 3, 64, 48), dtype=torch.uint8)
    with torch.no_grad():
        logits = model(images)
        normalised = model((images.float() / 255.0 - 0.45) / 0.225)
        as_given = model(images.float())  # a float batch is taken as it is
    assert logits.shape == (2, 7)
    assert torch.allclose(logits, normalised, atol=1e-5)
    assert not torch.allclose(logits, as_given, atol=1e-3)
