"""The C library, loaded once, for the few Linux calls Python does not wrap: ``prctl`` (workers end
with their parent), ``mallopt`` (the packer's worker heaps), ``mmap``/``mincore`` (what the page cache
holds), ``statfs`` and ``posix_fadvise`` (shard files written past the page cache).

Each caller gets a function object of its own with its signature set (``CDLL[name]`` makes a new
one each time), so no caller's prototype changes another's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The C library with ``errno`` kept for ``ctypes.get_errno``; None where there is none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def libc_function(name: str, argtypes: list[Any], restype: Any = ctypes.c_int) -> Any:
    """The C library's function ``name`` with its signature set, or None where there is none (not
    Linux/glibc): the callers then do without it."""
    library = libc()
    if library is None:
        return None
    try:
        function = library[name]
    except AttributeError:
        return None
    function.argtypes = argtypes
    function.restype = restype
    return function
