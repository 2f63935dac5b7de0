"""``loaders.sampler_args``: a sampler's whole numbers and choices, taken as given (NumPy integers as
Python ints) or refused in one line that names the argument, what was given and what is expected."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from packload.loaders.sampler_args import check_choice, check_int


@pytest.mark.parametrize("value", [0, 5, 2**70, np.int64(5), np.uint8(200), np.int32(0)], ids=repr)
def test_whole_numbers_at_or_above_the_minimum_are_python_ints(value: Any) -> None:
    got = check_int("block_size", value, 0)
    assert got == int(value) and type(got) is int


@pytest.mark.parametrize(("value", "kind"), [
    (True, "bool"), (False, "bool"), (np.bool_(True), "bool"), (3.0, "float"), (np.float64(3), "float64"),
    ("3", "str"), (None, "NoneType"), ([3], "list"),
], ids=repr)
def test_what_is_not_an_int_is_a_type_error(value: Any, kind: str) -> None:
    """bool is refused although Python counts it an int: ``shuffle=True`` given as a seed is a mistake."""
    with pytest.raises(TypeError) as caught:
        check_int("seed", value, 0)
    assert str(caught.value) == f"seed must be an int, got {kind} ({value!r})"


@pytest.mark.parametrize(("value", "minimum"), [(0, 1), (-1, 0), (np.int64(-5), -4), (-(2**70), 0)], ids=repr)
def test_below_the_minimum_is_a_value_error(value: Any, minimum: int) -> None:
    with pytest.raises(ValueError) as caught:
        check_int("window_blocks", value, minimum)
    assert str(caught.value) == f"window_blocks must be >= {minimum}, got {value}"
    assert check_int("window_blocks", minimum, minimum) == minimum  # the minimum itself is fine


def test_choices() -> None:
    assert check_choice("order", "block", ("block", "random")) == "block"
    for wrong in ("Block", "block ", "", None, 1):
        with pytest.raises(ValueError) as caught:
            check_choice("order", wrong, ("block", "random", "sequential"))
        assert str(caught.value) == f"unknown order {wrong!r}; expected one of 'block', 'random', 'sequential'"
        assert "\n" not in str(caught.value)
