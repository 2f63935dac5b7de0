"""Announcing to the storage the records a sampler will hand out next (``PackSampler(prefetch=...)``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from packload.core.remote import is_url
from packload.loaders.read import PackReader


class PackHints:
    """Announce the records a sampler will hand out next, from the process that runs the sampler.

    Called with an array of upcoming record numbers: opens the pack read-only on first use (again
    after a fork) and passes them to :meth:`PackReader.advise`, which queues the reads and returns.
    Best effort: a failure is kept in ``error``, never raised (the reads themselves report a
    missing or damaged pack). Pickles as just the path. ``PackSampler(prefetch=path)`` builds one."""

    def __init__(self, path: str | os.PathLike[str], opener: Callable[[], PackReader] | None = None) -> None:
        """``opener``: returns this process's reader of the pack, to share it (``PackedImageFolder.sampler``
        passes the dataset's); without one, the hints open a reader of their own."""
        self.path: Path | str = path if is_url(path) else Path(path)  # type: ignore[assignment]
        self._opener = opener
        self._reader: PackReader | None = None
        self.error: Exception | None = None

    def __call__(self, indices: np.ndarray) -> int:
        try:
            if self._opener is not None:
                return self._opener().advise(indices)
            if self._reader is None or self._reader.closed or self._reader.pid != os.getpid():
                self._reader = PackReader(self.path)
            return self._reader.advise(indices)
        except Exception as exc:
            self.error = exc
            return 0

    def close(self) -> None:
        if self._reader is not None and self._reader.pid == os.getpid():
            self._reader.close()
        self._reader = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the files close with the process
            pass

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_opener": None, "_reader": None, "error": None}

    def __repr__(self) -> str:
        return f"PackHints({str(self.path)!r})"
