"""A pack's string and list fields as Python sequences over the pack's own bytes: a
``StringColumn`` (``str`` values over the UTF-8 bytes and their offsets, no Python object per
record until one is asked for) and a ``ListColumn`` (NumPy arrays over the values and their
offsets). ``FieldColumn`` is what reading one field of every record gives: either, or a NumPy
array for numbers and booleans."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from packload.core.fields import Column


class StringColumn(Sequence[str]):
    """A string field of every record: ``column[i]`` is record ``i``'s text. ``data`` holds the
    UTF-8 bytes (uint8), ``offsets`` where each record's text starts and ends in them (uint64,
    ``len + 1`` entries)."""

    def __init__(self, column: Column) -> None:
        self._column = column
        self.name = column.name
        self.data: np.ndarray = column.values
        self.offsets: np.ndarray = column.offsets  # type: ignore[assignment]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self._column.value(k) for k in range(*i.indices(len(self)))]
        return self._column.value(_index(i, len(self)))

    def __iter__(self) -> Iterator[str]:
        return (self._column.value(k) for k in range(len(self)))

    def tolist(self) -> list[str]:
        """Every record's text."""
        return list(self)

    def __repr__(self) -> str:
        return f"StringColumn({self.name!r}, {len(self)} records)"


class ListColumn(Sequence[np.ndarray]):
    """A list field of every record: ``column[i]`` is record ``i``'s list as a NumPy array (int64 or
    float64). ``values`` holds every record's elements back to back, ``offsets`` where each
    record's start and end (uint64, ``len + 1`` entries)."""

    def __init__(self, column: Column) -> None:
        self.name, self.type = column.name, column.type
        self.values: np.ndarray = column.values
        self.offsets: np.ndarray = column.offsets  # type: ignore[assignment]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _at(self, k: int) -> np.ndarray:
        return self.values[int(self.offsets[k]) : int(self.offsets[k + 1])]

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, i: slice) -> list[np.ndarray]: ...

    def __getitem__(self, i: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(i, slice):
            return [self._at(k) for k in range(*i.indices(len(self)))]
        return self._at(_index(i, len(self)))

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self._at(k) for k in range(len(self)))

    def tolist(self) -> list[list[Any]]:
        """Every record's list, as Python lists."""
        return [self._at(k).tolist() for k in range(len(self))]

    def __repr__(self) -> str:
        return f"ListColumn({self.name!r}, {self.type}, {len(self)} records)"


def _index(i: int, n: int) -> int:
    if not -n <= i < n:
        raise IndexError(f"record {i} out of range: the pack has {n} records")
    return i % n


FieldColumn = np.ndarray | StringColumn | ListColumn
