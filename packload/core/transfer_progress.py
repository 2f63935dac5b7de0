"""The progress of transfers to and from object stores: a bar of the bytes moved, and the fsspec
callback that tells it of an upload's bytes as they are sent."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from packload.core.progress import progress_bar


class TransferBar:
    """A bar (``progress_bar``) of ``size`` bytes moved, counted in MB, for an upload or a download:
    call it with each increment of bytes. Threads may call it at once (transfers run on pools)."""

    def __init__(self, desc: str, size: int, progress: bool) -> None:
        self.bar = progress_bar(total=size / 1e6, desc=desc, unit="MB", disable=not progress)
        self.lock = threading.Lock()

    def __call__(self, nbytes: int) -> None:
        with self.lock:
            self.bar.update(nbytes / 1e6)

    def __enter__(self) -> TransferBar:
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.bar.close()



def sent_callback(sent: Callable[[int], None] | None) -> Any:
    """An fsspec ``Callback`` that tells ``sent`` each increment of bytes written (None without
    ``sent``). A retried upload counts from zero again: what the failed attempt reported is taken
    back. ``finish(size)`` tops the count up to ``size`` where a filesystem reports nothing."""
    if sent is None:
        return None
    from fsspec.callbacks import Callback  # noqa: PLC0415 - fsspec is the object-store extra

    class Sent(Callback):  # type: ignore[misc] - fsspec is untyped
        reported = 0

        def set_size(self, size: int) -> None:  # each attempt begins by sizing its transfer
            if self.reported:
                sent(-self.reported)
                self.reported = 0
            self.value = 0
            super().set_size(size)

        def call(self, hook_name: str | None = None, **kwargs: Any) -> None:
            if self.value > self.reported:
                sent(self.value - self.reported)
                self.reported = self.value

        def finish(self, size: int) -> None:
            if size > self.reported:
                sent(size - self.reported)
                self.reported = size

    return Sent()
