"""The two private PyTorch entry points packload uses, each looked up when first needed and guarded.

Where a torch lacks one (or changed its signature), callers take the public way: the same result,
only slower. ``tests/core/test_torch_private.py`` fails loudly when this torch changes either, so that
the slower way never goes unnoticed.
"""

from __future__ import annotations

from typing import Any

import torch

_upsample_out: dict[str, Any] = {}


def _upsample_aa_out(mode: str) -> Any:
    """aten's antialiased upsample for ``mode`` (``bilinear``, ``bicubic``) in its ``out=`` form, or None."""
    if mode not in _upsample_out:
        try:
            _upsample_out[mode] = getattr(torch.ops.aten, f"_upsample_{mode}2d_aa").out
        except (AttributeError, RuntimeError):
            _upsample_out[mode] = None
    return _upsample_out[mode]


def resize_into(source: torch.Tensor, out: torch.Tensor, mode: str = "bilinear") -> bool:
    """Antialiased resize of the N×C×h×w ``source`` into the N×C×H×W ``out``, in place. Both should
    have their channels interleaved in memory (channels-last strides, as any view of H×W×3 pixels has).

    ``interpolate(..., antialias=True)`` returns a new planar tensor; writing straight into ``out``
    (a slot of a channels-last batch, or an H×W×3 array seen as NCHW) saves laying the result out
    again, a large share of the resize. The same pixels as ``interpolate``. Returns False, having
    done nothing, where this torch has no such operator or refuses these tensors: the caller then
    uses ``interpolate``."""
    upsample = _upsample_aa_out(mode)
    if upsample is None:
        return False
    try:
        upsample(source, [out.shape[2], out.shape[3]], False, None, None, out=out)
    except TypeError:  # a torch whose operator takes other arguments: never again in this process
        _upsample_out[mode] = None
        return False
    except RuntimeError:  # tensors this kernel does not take (planar memory, say): this call only
        return False
    return True


def storage_use_count(storage: torch.UntypedStorage) -> int | None:
    """How many tensors and views share ``storage``, as torch counts them; None where torch does not say.
    ``PackLoader`` reuses a batch's memory only when nothing refers to it any more."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return None if count is None else int(count(storage._cdata))


def storage_use_count_available() -> bool:
    """Whether this torch tells ``storage_use_count``."""
    return hasattr(torch._C, "_storage_Use_Count")
