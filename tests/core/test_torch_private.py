"""The private PyTorch entry points packload relies on (``packload.core.torch_private``).

These fail loudly when a new torch removes or changes one: packload would still give the same
results through the public fallbacks, only slower, and nobody would notice without these tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packload.core import torch_private


def test_this_torch_has_the_antialiased_resize_that_writes_into_its_output() -> None:
    """The ``out=`` resize exists here and gives ``interpolate``'s pixels, into a channels-last slot."""
    generator = torch.Generator().manual_seed(3)
    source = torch.randint(0, 256, (1, 3, 171, 203), dtype=torch.uint8, generator=generator)
    source = source.contiguous(memory_format=torch.channels_last)
    for mode in ("bilinear", "bicubic"):
        out = torch.empty(1, 3, 224, 224, dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
        assert torch_private.resize_into(source, out, mode), f"torch {torch.__version__} lost _upsample_{mode}2d_aa.out"
        want = torch.nn.functional.interpolate(source, size=(224, 224), mode=mode, antialias=True)
        assert torch.equal(out, want)


def test_resize_into_an_hwc_array_seen_as_nchw() -> None:
    """The packer's use: an H×W×3 NumPy array written through an NCHW view of it."""
    pixels = np.random.default_rng(0).integers(0, 256, (90, 130, 3), dtype=np.uint8)
    out = np.empty((64, 48, 3), np.uint8)
    source = torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)
    assert torch_private.resize_into(source, torch.from_numpy(out).permute(2, 0, 1).unsqueeze(0))
    want = torch.nn.functional.interpolate(source, size=(64, 48), mode="bilinear", antialias=True)[0]
    assert np.array_equal(out, want.permute(1, 2, 0).numpy())


def test_a_torch_without_the_operator_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the operator is missing, ``resize_into`` declines and leaves ``out`` untouched."""
    monkeypatch.setattr(torch_private, "_upsample_out", {"bilinear": None})
    out = torch.zeros(1, 3, 8, 8, dtype=torch.uint8)
    assert not torch_private.resize_into(torch.ones(1, 3, 16, 16, dtype=torch.uint8), out)
    assert not out.any()


def test_this_torch_counts_the_users_of_a_storage() -> None:
    """``_storage_Use_Count`` exists here and counts tensors and views sharing a storage (what lets
    ``PackLoader`` reuse a batch's memory only once nothing refers to it)."""
    assert torch_private.storage_use_count_available(), f"torch {torch.__version__} lost _storage_Use_Count"
    batch = torch.empty(4, 3, 8, 8, dtype=torch.uint8)
    storage = batch.untyped_storage()
    alone = torch_private.storage_use_count(storage)
    view = batch[1:3]
    assert torch_private.storage_use_count(storage) == alone + 1
    del view
    assert torch_private.storage_use_count(storage) == alone
