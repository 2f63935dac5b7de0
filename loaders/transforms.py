"""Small, dependency-free image transforms for benchmarks, the demo and uint8 pipelines.

Use torchvision's transforms in training scripts if you have them; these exist so packload's own
tools need no torchvision, and they mirror ``Resize(short) + CenterCrop(size)`` on PIL images.
"""

from __future__ import annotations

import numpy as np
from PIL import Image


class ResizeCenterCrop:
    """Resize the shorter side to ``resize`` (bilinear, as torchvision's ``Resize`` on PIL images),
    then take the centre ``size`` x ``size`` crop; returns an HxWx3 uint8 array.

    A class (not a closure) so that spawned DataLoader workers can pickle it.
    """

    def __init__(self, size: int = 224, resize: int | None = None) -> None:
        if size < 1:
            raise ValueError(f"crop size {size} must be positive")
        self.size = size
        self.resize = resize if resize is not None else round(size * 256 / 224)

    def __call__(self, image: Image.Image | np.ndarray) -> np.ndarray:
        if isinstance(image, np.ndarray):
            image = Image.fromarray(image)
        width, height = image.size
        scale = self.resize / min(width, height)
        new_size = (max(self.size, round(width * scale)), max(self.size, round(height * scale)))
        if new_size != image.size:
            image = image.resize(new_size, Image.Resampling.BILINEAR)
        left = (new_size[0] - self.size) // 2
        top = (new_size[1] - self.size) // 2
        return np.asarray(image.crop((left, top, left + self.size, top + self.size)))

    def __repr__(self) -> str:
        return f"ResizeCenterCrop(size={self.size}, resize={self.resize})"
