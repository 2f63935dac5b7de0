"""Helper (not a test): fail a test instead of hanging it, for code under test that must not block
on what it opens (a FIFO planted where a file of its own belongs).

    with within(5):
        cache.problem()  # a blocked open() is interrupted: the test fails with Hung
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Hung(Exception):  # noqa: N818 - not an OSError, which the code under test would take for a bad file
    """The code under test was still blocked after the time given."""


@contextmanager
def within(seconds: float) -> Iterator[None]:
    """Raise ``Hung`` in the main thread if the block is still running after ``seconds`` (a blocked
    system call is interrupted by the alarm, and the handler's exception ends it)."""
    def expire(signum: int, frame: Any) -> None:
        raise Hung(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
