"""Thread pools for work that calls torch: each pool thread runs torch ops on one core.

A pool of N threads is the parallelism; if each thread's torch op also fanned out over torch's
intra-op threads (by default one per core), N × cores threads would fight over the cores and a
resize would run several times slower. torch keeps that count per thread (under OpenMP) but takes
its starting value from a process-wide default, which ``torch.set_num_threads`` also changes: the
pool sets one thread per pool thread, then puts the default back so that nothing else changes.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor


def single_core_torch_pool(threads: int, name: str = "packload") -> ThreadPoolExecutor:
    """A ``ThreadPoolExecutor`` of ``threads`` threads whose torch ops each run on one core."""
    import torch  # here, not at import: packing without re-encoding never needs torch

    pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
    default = torch.get_num_threads()
    barrier = threading.Barrier(threads)

    def one_core() -> None:
        torch.get_num_threads()  # torch sets up a thread's count on first use: do that first,
        torch.set_num_threads(1)  # then make it one for this thread
        barrier.wait(timeout=60)  # every pool thread runs this exactly once

    try:
        for future in [pool.submit(one_core) for _ in range(threads)]:
            future.result()
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        torch.set_num_threads(default)  # the process-wide default, for threads started later
    return pool
