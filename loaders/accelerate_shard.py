"""Whether Hugging Face Accelerate is sharding the batches of the sampler being iterated.

``accelerator.prepare(loader)`` wraps a DataLoader's batch sampler in ``BatchSamplerShard`` (each
process keeps every ``num_processes``-th batch) or, with ``dispatch_batches``, in a
``DataLoaderDispatcher`` (process 0 reads every batch and hands each process a slice). Either way
it shards whatever sampler it is given, whatever its type: a sampler that already split the pack by
rank is split a second time. The sampler is never told, and Accelerate offers no hook to ask, so
this looks at who is iterating it: the call stack of the sampler's ``__iter__`` passes through one
of those classes' methods exactly when a prepared loader reads it (the sampler is always iterated
in the training process, also with DataLoader workers).

Nothing is imported: if ``accelerate.data_loader`` was never imported, nothing can be sharding.
"""

from __future__ import annotations

import inspect
import sys
from types import CodeType, FrameType

__all__ = ["sharded_by_accelerate"]

# Accelerate's classes that shard a sampler's batches across processes.
SHARDING_CLASSES = ("BatchSamplerShard", "DataLoaderDispatcher")
MAX_DEPTH = 48  # frames looked at; the sharding method sits a few to a dozen frames up


def sharding_code(module: object) -> frozenset[CodeType]:
    """The code objects of every method of the sharding classes in accelerate's ``module``."""
    codes = set()
    for name in SHARDING_CLASSES:
        cls = getattr(module, name, None)
        for member in vars(cls).values() if isinstance(cls, type) else ():
            function = member.fget if isinstance(member, property) else member
            if inspect.isfunction(function):
                codes.add(function.__code__)
    return frozenset(codes)


def sharded_by_accelerate(frame: FrameType | None = None) -> bool:
    """True when the calling code runs under Accelerate's batch sharding (see the module's doc).

    ``frame``: where to start looking (default: the caller's frame)."""
    module = sys.modules.get("accelerate.data_loader")
    if module is None:
        return False
    codes = sharding_code(module)
    frame = sys._getframe(1) if frame is None else frame
    for _ in range(MAX_DEPTH):
        if frame is None:
            return False
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False
