"""A table's cell types: the narrowest type every cell of a column fits, text cells read as a CSV
writes them and JSON values as they are, and each cell converted or refused with the reason."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from packload.packer.table_types import (
    BadCell,
    Inference,
    inferred,
    missing,
    to_bool,
    to_float,
    to_int,
    to_list,
    to_string,
)


def _type_of(cells: list[Any]) -> str:
    seen = Inference()
    for number, cell in enumerate(cells, 1):
        seen.see(number, cell)
    return inferred(seen.kinds)


@pytest.mark.parametrize(("cells", "kind"), [
    (["3", "-4", "+12", None, ""], "int"),  # empty and missing cells are not counted
    (["3", "0.5", "1e-3", "inf", "-.25"], "float"),
    (["true", "FALSE", "True"], "bool"),
    (["[1, 2]", "[]", "[0]"], "list[int]"),
    (["[1, 2.5]", "[3]"], "list[float]"),
    (["007", "017"], "string"),  # a leading zero: an id, kept as text
    (["1", "true"], "string"),
    (["[1, \"a\"]"], "string"),  # a list of text is no numeric list
    (["[1, 2"], "string"),  # not JSON
    ([str(1 << 63)], "string"),  # past a 64-bit integer
    ([" "], "string"),  # blank but not empty: text
    ([3, 4.5], "float"),  # JSON values as they are
    ([True, False], "bool"),
    ([[1, 2], [3.0]], "list[float]"),
    ([[True]], "string"),  # a list of booleans is no list of numbers
    ([None, None], "string"),  # nothing seen: text
])
def test_a_column_takes_the_narrowest_type_its_cells_fit(cells: list[Any], kind: str) -> None:
    assert _type_of(cells) == kind


def test_inference_counts_numbers_and_keeps_the_first_other_cell() -> None:
    seen = Inference()
    for number, cell in enumerate(["1", "2.5", "", "n/a", "3", "none"], 1):
        seen.see(number, cell)
    assert (seen.numbers, seen.others, seen.example) == (3, 2, (4, "n/a"))
    assert seen.kinds == {"int", "float", "text"}


def test_cells_convert_to_their_types() -> None:
    assert to_int(" -42 ") == -42 and to_int(7) == 7 and to_int("9007199254740993") == 9007199254740993
    assert to_float("1e-3") == 0.001 and to_float(2) == 2.0 and math.isinf(to_float("-inf"))
    assert [to_bool(c) for c in ("TRUE", "false", "1", "0", True, 0)] == [True, False, True, False, True, False]
    assert to_string("  as written ") == "  as written " and to_string(1.5) == "1.5" and to_string(3) == "3"
    assert to_list("[1, 2]", "list[int]") == [1, 2] and to_list([1, 2.5], "list[float]") == [1.0, 2.5]
    assert to_list("[]", "list[float]") == []


@pytest.mark.parametrize(("convert", "cell", "reason"), [
    (to_int, "3.5", "'3.5' is not an integer"),
    (to_int, True, "'true' is not an integer"),  # a JSON boolean is no integer
    (to_int, str(1 << 63), "does not fit a 64-bit integer"),
    (to_float, "abc", "'abc' is not a number"),
    (to_float, False, "'false' is not a number"),
    (to_bool, "yes", "'yes' is not true, false, 1 or 0"),
    (to_bool, 2, "'2' is not true, false, 1 or 0"),
    (to_string, True, "'true' is not text"),
    (to_string, [1], "'[1]' is not text"),
    (lambda c: to_list(c, "list[int]"), "[1,x]", "'[1,x]' is not a JSON list"),
    (lambda c: to_list(c, "list[int]"), "{}", "'{}' is not a list"),
    (lambda c: to_list(c, "list[int]"), "[1, 2.5]", "'[1, 2.5]' is not a list of integers"),
    (lambda c: to_list(c, "list[float]"), '["1"]', "is not a list of numbers"),  # a number as text
    (to_string, {"k": "x" * 100}, "'{\"k\": \"" + "x" * 53 + "...' is not text"),  # a long cell cut short
])
def test_a_cell_that_does_not_fit_is_refused_with_the_reason(convert: Any, cell: Any, reason: str) -> None:
    with pytest.raises(BadCell, match=re.escape(reason)):
        convert(cell)


def test_an_empty_cell_is_missing_except_as_text() -> None:
    assert missing(None, "string") and missing("", "int") and missing("", "list[float]")
    assert not missing("", "string") and not missing(" ", "int") and not missing(0, "int")
