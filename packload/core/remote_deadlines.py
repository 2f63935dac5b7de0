"""How long one request to an object store may take, and how many times it is tried.

Every request has a deadline. One attempt may take ``timeout`` seconds (``PACKLOAD_TIMEOUT``,
default 20) plus one second for each MiB it moves (``MIN_RATE``), connecting and answering
included: a store that never answers, or stalls halfway through an answer, is given up on then. All
the attempts of one request together stop ``timeout`` seconds after the first attempt's deadline,
so a request that cannot finish says so in one line in about twice the timeout (a little more
for large transfers), whatever the store's client would otherwise wait. ``packload.core.remote.retried``
makes at most ``RETRIES`` attempts, pausing ``RETRY_PAUSE`` seconds before the second (doubled after).
"""

from __future__ import annotations

import os

from packload.core.errors import UsageError

RETRIES = 5  # attempts of one request at most before its error is reported
RETRY_PAUSE = 0.2  # seconds before the second attempt; doubled before each next one
DEFAULT_TIMEOUT = 20.0  # seconds an attempt of a small request may take, connecting and answering
TIMEOUT_VARIABLE = "PACKLOAD_TIMEOUT"
MIN_RATE = 1 << 20  # bytes per second a large transfer must keep up: its attempt's deadline grows by its size


def request_timeout(timeout: float | None = None) -> float:
    """Seconds one attempt of a small request may take: ``timeout`` when given, else
    ``$PACKLOAD_TIMEOUT``, else ``DEFAULT_TIMEOUT``."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip() if timeout is None else str(timeout)
    if not text:
        return DEFAULT_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        where = f"{TIMEOUT_VARIABLE}={text!r}" if timeout is None else f"timeout {text}"
        raise UsageError(f"{where}: give the seconds a request to the object store may take, more than 0, "
                         f"for example {DEFAULT_TIMEOUT:g}")
    return value


def attempt_deadline(timeout: float, nbytes: int = 0) -> float:
    """Seconds one attempt of a request moving ``nbytes`` may take: ``timeout``, plus a second for
    each ``MIN_RATE`` bytes."""
    return timeout + nbytes / MIN_RATE
