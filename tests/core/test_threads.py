"""Thread pools whose torch ops run on one core each (``packload.core.threads``): every pool thread
has one intra-op thread, and nothing outside the pool changes."""

from __future__ import annotations

import threading

import pytest
import torch

from packload.core.threads import single_core_torch_pool


@pytest.fixture(autouse=True)
def two_intra_op_threads():
    """A process default of 2 (the test process keeps 1, tests/conftest.py), so that one is told apart."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _on_thread(barrier: threading.Barrier) -> tuple[str, int]:
    barrier.wait(timeout=30)  # held until every task has a thread of its own
    return threading.current_thread().name, torch.get_num_threads()


def test_every_pool_thread_runs_torch_on_one_core_and_the_default_is_kept() -> None:
    default = torch.get_num_threads()
    pool = single_core_torch_pool(3, name="resize")
    try:
        barrier = threading.Barrier(3)
        seen = [f.result(timeout=60) for f in [pool.submit(_on_thread, barrier) for _ in range(3)]]
    finally:
        pool.shutdown()
    assert len({name for name, _ in seen}) == 3 and all(name.startswith("resize") for name, _ in seen)
    assert [count for _, count in seen] == [1, 1, 1]
    assert torch.get_num_threads() == default
    later: list[int] = []
    thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert later == [default], "a thread started after the pool gets the process default"


def test_a_pool_thread_computes_what_the_caller_would() -> None:
    image = torch.arange(2 * 3 * 16 * 16, dtype=torch.float32).reshape(2, 3, 16, 16)
    want = torch.nn.functional.interpolate(image, size=(8, 8), mode="bilinear", antialias=True)
    pool = single_core_torch_pool(2)
    try:
        got = pool.submit(torch.nn.functional.interpolate, image, size=(8, 8), mode="bilinear",
                          antialias=True).result(timeout=60)
    finally:
        pool.shutdown()
    assert torch.equal(got, want)
