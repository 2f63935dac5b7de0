"""Stack uint8 samples into one batch tensor, without a float conversion or per-sample tensors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def collate_uint8(batch: Sequence[tuple[Any, Any]], pin_memory: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Collate ``(image, label)`` pairs of equal-sized images into ``(B×3×H×W uint8, B int64)``.

    Images may be HxWx3 numpy arrays, 3xHxW uint8 tensors or PIL RGB images (use a crop or resize
    transform first so that sizes agree). With ``pin_memory`` the batch is allocated in pinned
    memory when CUDA is available, so the copy to the GPU can be ``non_blocking``.
    """
    if not batch:
        raise ValueError("cannot collate an empty batch")
    first = as_chw(batch[0][0])
    pin = pin_memory and torch.cuda.is_available()
    images = torch.empty((len(batch), *first.shape), dtype=torch.uint8, pin_memory=pin)
    target = images.numpy()  # shares memory: filled in place, one copy per image
    for i, (image, _) in enumerate(batch):
        chw = first if i == 0 else as_chw(image)
        if chw.shape != first.shape:
            raise ValueError(f"sample {i} is {tuple(chw.shape)}, sample 0 is {tuple(first.shape)}; "
                             "resize or crop to one size before collating")
        target[i] = chw
    labels = torch.tensor([int(label) for _, label in batch], dtype=torch.int64)
    if pin:
        labels = labels.pin_memory()
    return images, labels


def as_chw(image: Any) -> np.ndarray:
    """A 3xHxW uint8 view of an HxWx3 array, a PIL RGB image or a 3xHxW uint8 tensor."""
    if isinstance(image, torch.Tensor):
        if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(f"expected a 3xHxW uint8 tensor, got {image.dtype} {tuple(image.shape)}")
        return image.numpy()
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"expected an HxWx3 uint8 image, got {array.dtype} {array.shape}")
    return array.transpose(2, 0, 1)


def collate_as_list(batch: Sequence[Any]) -> list[Any]:
    """Keep a batch as a plain list (undecoded bytes, images of mixed sizes)."""
    return list(batch)


def collate_encoded(batch: Sequence[tuple[bytes | memoryview, Any]],
                    pin_memory: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Collate ``(encoded bytes, label)`` pairs (``output="bytes"``) into one flat uint8 tensor,
    ``B+1`` int64 offsets and ``B`` int64 labels: record ``i`` is ``data[offsets[i]:offsets[i+1]]``.

    One tensor's memory crosses from a worker to the training process instead of B pickled byte
    strings: the three are views of one buffer (offsets, labels, then the bytes), since each
    separate tensor costs a shared-memory segment and a file descriptor passed between processes
    (three of them slow a DataLoader of small batches down badly). It suits decoding on the GPU
    (for example nvJPEG) from the encoded bytes.
    """
    if not batch:
        raise ValueError("cannot collate an empty batch")
    count = len(batch)
    sizes = np.fromiter((len(payload) for payload, _ in batch), dtype=np.int64, count=count)
    head = (2 * count + 1) * 8  # offsets and labels, 8-byte aligned at the buffer's start
    buffer = torch.empty(head + int(sizes.sum()), dtype=torch.uint8,
                         pin_memory=pin_memory and torch.cuda.is_available())
    offsets = buffer[: (count + 1) * 8].view(torch.int64)
    labels = buffer[(count + 1) * 8 : head].view(torch.int64)
    data = buffer[head:]
    offsets_np = offsets.numpy()
    offsets_np[0] = 0
    np.cumsum(sizes, out=offsets_np[1:])
    labels.numpy()[:] = [int(label) for _, label in batch]
    if len(data):
        data.numpy()[:] = np.frombuffer(b"".join(payload for payload, _ in batch), dtype=np.uint8)
    return data, offsets, labels
