"""A table's columns in bounded memory: values converted into compact arrays, moved to the spill
file as they grow, read back whole, with blank rows and taken-back values kept aligned with the rows
on either side of a move to the file."""

from __future__ import annotations

import numpy as np
import pytest

from packload.packer.table_columns import ColumnBuilder, Spill
from packload.packer.table_types import BadCell


def _rows(builder: ColumnBuilder, cells: list[object]) -> None:
    for cell in cells:
        if cell is None:
            builder.blank()
        else:
            builder.add(cell)
        builder.row_done()


def test_an_int_column_moved_to_the_file_reads_back_whole() -> None:
    spill = Spill()
    builder = ColumnBuilder("n", "int", spill)
    count = 300_000  # more than a flush's worth of 8-byte values
    _rows(builder, [None if k % 7 == 3 else str(k - 5) for k in range(count)])
    column = builder.column()
    assert len(builder.value_segments) > 1  # moved to the file more than once
    expected = np.arange(count, dtype=np.int64) - 5
    expected[np.arange(count) % 7 == 3] = 0  # a blank row holds 0
    assert len(column) == count and column.offsets is None
    assert column.values.dtype == np.int64 and np.array_equal(column.values, expected)
    spill.close()


def test_a_string_column_keeps_each_row_across_moves_to_the_file() -> None:
    spill = Spill()
    builder = ColumnBuilder("caption", "string", spill)
    texts = [f"row {k} " + "ñ" * (k % 50) for k in range(40_000)]
    _rows(builder, texts)
    column = builder.column()
    assert len(builder.value_segments) > 1 and len(builder.end_segments) >= 1
    values, offsets = column.values.tobytes(), column.offsets
    assert offsets is not None and len(offsets) == len(texts) + 1 and offsets[0] == 0
    assert [values[offsets[k]:offsets[k + 1]].decode() for k in range(len(texts))] == texts
    spill.close()


def test_a_value_taken_back_right_after_a_move_leaves_an_empty_row() -> None:
    """``undo`` of the first row after the values moved to the file takes back that row's values
    only: the rows in the file stay whole, and the rows after it line up."""
    spill = Spill()
    builder = ColumnBuilder("v", "list[float]", spill)
    rows = 0
    while not builder.value_segments:  # until the values have moved once
        builder.add([1.5, 2.5, 3.5])
        builder.row_done()
        rows += 1
    builder.add("[7, 8]")
    builder.undo()  # another cell of this row failed
    builder.row_done()
    builder.add([9])
    builder.row_done()
    column = builder.column()
    offsets = column.offsets
    assert offsets is not None and len(column) == rows + 2
    values = column.values
    lists = [values[offsets[k]:offsets[k + 1]].tolist() for k in range(rows + 2)]
    assert lists[:rows] == [[1.5, 2.5, 3.5]] * rows and lists[rows:] == [[], [9.0]]
    spill.close()


def test_scalar_undo_and_bool_values() -> None:
    spill = Spill()
    builder = ColumnBuilder("ok", "bool", spill)
    _rows(builder, ["true", "0", None])
    builder.add("TRUE")
    builder.undo()
    builder.row_done()
    column = builder.column()
    assert column.values.tolist() == [1, 0, 0, 0] and len(column) == 4
    spill.close()


@pytest.mark.parametrize(("kind", "cell", "reason"), [
    ("int", None, "is missing"),
    ("int", "", "is empty"),
    ("list[int]", "", "is empty"),
    ("float", "x", "'x' is not a number"),
])
def test_a_cell_that_cannot_be_stored_is_refused(kind: str, cell: object, reason: str) -> None:
    spill = Spill()
    with pytest.raises(BadCell, match=reason):
        ColumnBuilder("c", kind, spill).add(cell)
    spill.close()


def test_an_empty_string_cell_is_a_value() -> None:
    spill = Spill()
    builder = ColumnBuilder("s", "string", spill)
    _rows(builder, ["", "a"])
    column = builder.column()
    assert column.offsets is not None and column.offsets.tolist() == [0, 0, 1]
    spill.close()


def test_the_spill_file_reads_segments_back_in_order() -> None:
    spill = Spill()
    first = spill.write(np.arange(3, dtype=np.int64))
    second = spill.write(np.arange(10, 12, dtype=np.int64))
    assert first == (0, 24) and second == (24, 16)
    assert spill.read([second, first], np.int64).tolist() == [10, 11, 0, 1, 2]
    spill.close()
    assert spill.file.closed
