"""The C library's functions (``packload.core.libc``): each caller's prototype is its own."""

from __future__ import annotations

import ctypes
import os

from packload.core.libc import libc, libc_function


def test_functions_with_their_signature() -> None:
    assert libc() is not None
    getpid = libc_function("getpid", [], ctypes.c_int)
    assert getpid() == os.getpid()
    strlen = libc_function("strlen", [ctypes.c_char_p], ctypes.c_size_t)
    assert strlen(b"packload") == 8


def test_prototypes_do_not_leak_between_callers() -> None:
    """Two callers of the same function with other prototypes each keep theirs."""
    narrow = libc_function("labs", [ctypes.c_int], ctypes.c_int)
    wide = libc_function("labs", [ctypes.c_long], ctypes.c_long)
    assert narrow.restype is ctypes.c_int and wide.restype is ctypes.c_long
    assert wide(-(1 << 40)) == 1 << 40 and narrow(-5) == 5


def test_a_missing_function_is_none() -> None:
    assert libc_function("no_such_function_in_libc", []) is None
