"""Encoding a pack's files in scan order: on this thread while reading is fast, on worker threads
or processes once it is not, with a bounded number of runs of files in flight.

``pipeline.pack`` writes what ``encoded_chunks`` yields; the Ray engine's tasks and the stall
analysis use ``encoded_stream`` the same way. Which pool is used is ``use_threads``'s choice: threads
where the work releases the GIL (reading and checking; re-encoding JPEGs with libjpeg-turbo),
processes where it does not.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path

from packload.core.scan import Sample
from packload.core.threads import single_core_torch_pool
from packload.core.workers import process_pool
from packload.packer import encode
from packload.packer.encode import Encoded, EncodeOptions, Skipped, encode_chunk

__all__ = ["CHUNK_FILES", "INLINE_SECONDS_PER_FILE", "SLOW_RUNS", "encoded_chunks", "encoded_stream",
           "io_bound", "use_threads"]

CHUNK_FILES = 64  # files per task sent to a worker
# Reading and checking (``keep``, fast check) stays on the writing thread while a run of files takes
# less than this per file (files in the page cache); slower runs go to worker threads.
INLINE_SECONDS_PER_FILE = 100e-6
SLOW_RUNS = 3  # runs in a row


def _tasks(samples: list[Sample], start: int) -> Iterator[list[Sample]]:
    for i in range(start, len(samples), CHUNK_FILES):
        yield samples[i : i + CHUNK_FILES]


def io_bound(options: EncodeOptions) -> bool:
    """True when encoding is reading and checking only (``keep`` with the fast check): threads then
    beat processes, since the work releases the GIL and nothing has to be pickled back."""
    return options.encoding == "keep" and options.check == "fast"


JPEG_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif")


def use_threads(options: EncodeOptions, samples: Sequence[Sample] = ()) -> bool:
    """True when worker threads beat worker processes: reading and checking only, or re-encoding
    mostly JPEGs (judged by the names of ``samples``) with libjpeg-turbo (``simplejpeg``), whose
    decoder and encoder release the GIL like the resize does; threads also spare pickling every
    payload back to the writer. Other images are decoded by PIL, which holds the GIL for much of
    the work on small images: processes there."""
    if io_bound(options):
        return True
    if options.encoding == "keep" or encode.simplejpeg is None:
        return False
    step = max(1, len(samples) // 1000)  # a sample of the names is enough to judge
    names = [sample.path.lower() for sample in samples[::step]]
    return not names or 2 * sum(name.endswith(JPEG_SUFFIXES) for name in names) >= len(names)


def encoded_stream(root: Path, samples: list[Sample], start: int, options: EncodeOptions,
                    workers: int) -> Iterator[Encoded | Skipped]:
    """Encode ``samples[start:]`` in order, on ``workers`` threads (see ``use_threads``) or
    processes, with bounded memory."""
    for items in encoded_chunks(root, samples, start, options, workers):
        yield from items


def encoded_chunks(root: Path, samples: list[Sample], start: int, options: EncodeOptions,
                    workers: int) -> Iterator[list[Encoded | Skipped]]:
    """``encoded_stream`` a run of consecutive samples at a time (each ``CHUNK_FILES`` long).

    Reading and checking files that the page cache holds takes a few microseconds of Python per
    file, and handing each run over between threads costs more than that (every read gives up the
    GIL and has to wait to get it back), so that work starts on this thread. Once a run is slow
    (a disk or network filesystem that makes each read wait, or large files, whose reading and
    CRC release the GIL), packing goes on in the worker threads, which overlap the waits: after
    ``SLOW_RUNS`` slow runs in a row."""
    if workers > 1 and io_bound(options):
        slow_runs = 0  # in a row: one slow run can be this process waiting for a busy CPU
        while start < len(samples) and slow_runs < SLOW_RUNS:
            chunk = samples[start : start + CHUNK_FILES]
            began = time.perf_counter()
            items = encode_chunk(str(root), chunk, options)
            slow = time.perf_counter() - began > INLINE_SECONDS_PER_FILE * len(chunk)
            slow_runs = slow_runs + 1 if slow else 0
            yield items
            start += len(chunk)
        if start >= len(samples):
            return
    if workers <= 1:
        for chunk in _tasks(samples, start):
            yield encode_chunk(str(root), chunk, options)
        return
    if not use_threads(options, samples):
        pool: Executor = process_pool(workers)  # its workers end if this process is killed
    elif options.encoding == "keep":
        pool = ThreadPoolExecutor(max_workers=workers)
    else:  # re-encoding resizes with torch: one core per thread, or the threads oversubscribe the cores
        pool = single_core_torch_pool(workers)
    with pool:
        in_flight: deque[Future[list[Encoded | Skipped]]] = deque()
        tasks = _tasks(samples, start)
        for chunk in tasks:
            in_flight.append(pool.submit(encode_chunk, str(root), chunk, options))
            if len(in_flight) >= 4 * workers:
                break
        while in_flight:
            results = in_flight.popleft().result()
            chunk = next(tasks, None)
            if chunk is not None:
                in_flight.append(pool.submit(encode_chunk, str(root), chunk, options))
            yield results
