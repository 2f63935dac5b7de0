"""The training step and loop ``tune`` and ``doctor`` assume when not told
(``packload.diagnose.training_loop``): the default step, the sentence both verdicts carry, and the
loop model itself, played on a virtual clock that only loading and the emulated step move."""

from __future__ import annotations

import pytest

from packload.diagnose import gpu_step
from packload.diagnose.gpu_step import DummyStep
from packload.diagnose.training_loop import (
    DEFAULT_STEP_MS,
    DEFAULT_SYNC,
    HOW_TO_MEASURE,
    assumed,
    loop_words,
    resolve_step,
)

WAITS = "a training loop that waits for each step (as loss.item() every step does)"
NEVER_WAITS = "a training loop that never waits for the step (the next batch is loaded while it runs)"


def test_the_default_step_is_used_only_when_neither_a_step_nor_a_model_is_given() -> None:
    assert resolve_step(None, None) == (DEFAULT_STEP_MS, False)
    assert resolve_step(12.5, None) == (12.5, True)
    assert resolve_step(DEFAULT_STEP_MS, None) == (DEFAULT_STEP_MS, True)  # given, even if the same value
    assert resolve_step(None, "small-cnn") == (None, True)  # the model is the step: no time to assume


def test_the_two_loops_as_both_verdicts_say_them() -> None:
    assert loop_words(True) == WAITS
    assert loop_words(False) == NEVER_WAITS
    assert DEFAULT_SYNC is True and loop_words(DEFAULT_SYNC) == WAITS


def test_the_sentence_says_the_step_how_it_was_chosen_and_the_loop() -> None:
    assert assumed(DEFAULT_STEP_MS, False, None, 256, True) == (
        f"assumed a GPU step of 100 ms per batch of 256 (the default: {HOW_TO_MEASURE}), in {WAITS}")
    assert HOW_TO_MEASURE == "measure yours with packload.watch(loader) and give it as step_ms"
    assert assumed(12.5, True, None, 32, False) == (
        f"assumed a GPU step of 12.5 ms per batch of 32 (as given), in {NEVER_WAITS}")
    assert assumed(40.0, True, None, 8, True, "; emulated by a wait: no CUDA") == (
        f"assumed a GPU step of 40 ms per batch of 8 (as given; emulated by a wait: no CUDA), in {WAITS}")


def test_a_model_is_named_instead_of_a_step_time() -> None:
    """With a model the step is measured, not assumed: no step time, no default, no emulation note."""
    text = assumed(None, True, "small-cnn", 64, True, "; emulated by a wait")
    assert text == f"measured against small-cnn on the GPU, batches of 64, in {WAITS}"


class VirtualClock:
    """``time`` for the emulated step: only ``load`` (the loop's own work) and the step's waits move it."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def load(self, seconds: float) -> None:
        self.now += seconds


def run_loop(clock: VirtualClock, sync: bool, main_process_load_s: float, batches: int) -> float:
    """Seconds a loop of ``batches`` steps of the default step takes when each batch costs the main
    process ``main_process_load_s`` before its step (0: workers loaded it meanwhile)."""
    step = DummyStep(step_ms=resolve_step(None, None)[0], device="cpu", sync=sync)
    start = clock.now
    for _ in range(batches):
        clock.load(main_process_load_s)
        step(None)
    step.synchronize()
    return clock.now - start


@pytest.mark.parametrize("load_ms", [0.0, 30.0, 100.0])
def test_the_default_loop_adds_main_process_loading_to_every_step(monkeypatch: pytest.MonkeyPatch,
                                                                 load_ms: float) -> None:
    """The docstring's reason for the default: loading in the main process adds to every step of a
    waiting loop (10 steps of 100 ms with 30 ms of loading each: 1.3 s), while a loop that never waits
    hides it behind the queued steps (1.03 s: only the first batch's loading shows); loading done by
    workers (nothing left to the main process) costs either loop nothing beyond the steps."""
    clock = VirtualClock()
    monkeypatch.setattr(gpu_step, "time", clock)
    load = load_ms / 1000
    step = DEFAULT_STEP_MS / 1000
    waiting = run_loop(clock, DEFAULT_SYNC, load, 10)
    overlapping = run_loop(clock, not DEFAULT_SYNC, load, 10)
    assert waiting == pytest.approx(10 * (step + load))
    assert overlapping == pytest.approx(load + 10 * step)  # loading never longer than the step here
    # a setting found for the waiting loop holds for the other: it is never slower there
    assert overlapping <= waiting + 1e-9
    assert run_loop(clock, DEFAULT_SYNC, 0.0, 10) == pytest.approx(run_loop(clock, not DEFAULT_SYNC, 0.0, 10))
