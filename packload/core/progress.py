"""Progress for every long command: a tqdm bar on a terminal, plain lines in a log.

tqdm redraws its bar with carriage returns; written to a file or a CI log that becomes one wall of
redraws. When stderr is not a terminal, ``progress_bar`` returns ``LineProgress`` instead, which
prints one plain line each tenth of the way (and at least every ``LINE_SECONDS``) and one at the
end. Every command shows progress through ``progress_bar``, so the choice is made in one place.
A bar counting seconds (``unit="s"``: the tuner's budget) shows no rate, which would read "1 s/s";
``progress_line`` prints a line of its own (one per measurement) above a bar or among the lines.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

from tqdm import tqdm

from packload.core.display import terminal_safe

LINE_SECONDS = 30.0  # the longest gap between two plain lines
LINE_STEPS = 10  # plain lines over the whole run, one per tenth


class LineProgress:
    """The part of tqdm's interface packload uses (``update``, ``n``, ``total``, ``set_postfix_str``,
    ``close``, iteration, ``with``), written as occasional plain lines."""

    def __init__(self, iterable: Iterable[Any] | None = None, *, total: float | None = None, desc: str = "",
                 unit: str = "it", initial: float = 0, file: IO[str] | None = None, **_ignored: Any) -> None:
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.desc, self.unit, self.n = total, terminal_safe(desc), unit, initial
        self.file = file
        self.postfix = ""
        self._start = time.monotonic()
        self._initial = initial
        self._last_time = self._start
        self._last_step = self._step()
        self._closed = False

    def _step(self) -> int:
        return int(self.n * LINE_STEPS // self.total) if self.total else 0

    def _line(self, final: bool = False) -> None:
        elapsed = time.monotonic() - self._start
        done = f"{_amount(self.n)}/{_amount(self.total)}" if self.total else _amount(self.n)
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rate = (self.n - self._initial) / elapsed if elapsed > 0 else 0.0
        # counting seconds, the count is the time: no rate ("1 s/s") and no second clock
        timing = "" if self.unit == "s" else f", {_amount(rate if rate < 10 else round(rate))} {self.unit}/s, {elapsed:.0f} s"
        extra = f", {self.postfix}" if self.postfix else ""
        word = "done" if final else "at"
        out = self.file or sys.stderr
        print(f"{self.desc + ': ' if self.desc else ''}{word} {done} {self.unit}{share}{timing}{extra}", file=out,
              flush=True)
        self._last_time, self._last_step = time.monotonic(), self._step()

    def _maybe_line(self) -> None:
        if self.total and self.n >= self.total:
            return  # the last line comes from close()
        if self._step() > self._last_step or time.monotonic() - self._last_time >= LINE_SECONDS:
            self._line()

    def update(self, n: float = 1) -> None:
        """Count ``n`` more done; print a line when a tenth more is done or time has passed."""
        self.n += n
        self._maybe_line()

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        """Text shown after the counts (a rate, a status) on the next line."""
        self.postfix = terminal_safe(text)
        if refresh:
            self._maybe_line()

    def write(self, text: str) -> None:
        """Print ``text`` as a line of its own (a result worth one line each, not a tenth's count)."""
        print(terminal_safe(text), file=self.file or sys.stderr, flush=True)

    def close(self) -> None:
        """Print the last line (once)."""
        if not self._closed:
            self._closed = True
            self._line(final=True)

    def __iter__(self) -> Iterator[Any]:
        assert self.iterable is not None
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _amount(value: float) -> str:
    """A count as a line shows it: whole numbers as ``1,024``, fractions (megabytes) as ``0.4``."""
    return f"{value:,.0f}" if float(value).is_integer() or value >= 100 else f"{value:,.1f}"


class _Silent(LineProgress):
    """Progress turned off: counts, prints nothing."""

    def _line(self, final: bool = False) -> None:
        pass

    def write(self, text: str) -> None:
        pass


def progress_bar(iterable: Iterable[Any] | None = None, *, disable: bool = False, file: IO[str] | None = None,
                 **options: Any) -> Any:
    """A tqdm bar when ``file`` (stderr by default) is a terminal, else a ``LineProgress``; one that
    prints nothing under ``disable``. ``options`` are tqdm's (``total``, ``desc``, ``unit``...)."""
    out = file or sys.stderr
    if disable:
        return _Silent(iterable, file=out, **options)
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        return tqdm(iterable, file=out, **options)
    return LineProgress(iterable, file=out, **options)


def progress_line(bar: Any, text: str) -> None:
    """``text`` as one line of ``bar``'s progress: above a tqdm bar (on the bar's own file, never
    stdout), as a plain line in a log, nowhere when progress is off."""
    if isinstance(bar, tqdm):
        bar.write(terminal_safe(text), file=bar.fp)
    else:
        bar.write(text)
