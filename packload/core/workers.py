"""Worker processes that end when the process that started them dies.

A pool's workers wait on a pipe from their parent; when the parent is killed outright
(``kill -9``, the out-of-memory killer) nothing closes that wait, and they would run on as
orphans. Every process pool packload starts runs ``die_with_parent`` in each worker first: on
Linux the kernel sends the worker SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``);
elsewhere a thread in the worker watches for the parent to go away.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing.context import BaseContext

from packload.core.libc import libc_function

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
WATCH_SECONDS = 0.5  # how often the fallback thread looks at the parent


def _set_death_signal() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    prctl = libc_function("prctl", [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong])
    return prctl is not None and prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_SECONDS)
    os._exit(1)


def die_with_parent(parent: int | None) -> None:
    """Pool initializer: end this worker when its parent (pid ``parent``; None when the worker is
    started by a fork server, whose pid is not known here) dies, even by SIGKILL."""
    if _set_death_signal():
        if parent is not None and os.getppid() != parent:
            os._exit(1)  # the parent died before the death signal was set
        return
    watched = os.getppid() if parent is None else parent
    if os.getppid() != watched:
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(watched,), name="packload-parent-watch", daemon=True).start()


def worker_parent(context: BaseContext | None = None) -> int | None:
    """The pid a worker started through ``context`` has as its parent: this process, except under
    a fork server (the server's, unknown here; it exits when this process does)."""
    context = context or multiprocessing.get_context()
    return None if context.get_start_method() == "forkserver" else os.getpid()


def process_pool(workers: int) -> ProcessPoolExecutor:
    """A ``ProcessPoolExecutor`` of ``workers`` processes that end when this process dies."""
    context = multiprocessing.get_context()
    return ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=die_with_parent,
                               initargs=(worker_parent(context),))
