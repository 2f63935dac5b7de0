"""``FolderImages``: a plain ImageFolder-style dataset over the original files, one ``open()`` per
sample. It is the baseline packload is measured against, and what ``tune``/``doctor`` read when
given a raw folder. It needs no torchvision and scans exactly as ``pack`` does."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import Dataset

from packer.scan import scan_folder


class FolderImages(Dataset):
    """``(image, class_index)`` for every image file under ``root``, as torchvision's ImageFolder.

    ``output="pil"`` gives an RGB image (``Image.open(path).convert("RGB")``), ``output="bytes"``
    the file's bytes undecoded.
    """

    def __init__(self, root: str | os.PathLike[str], transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None, output: str = "pil") -> None:
        if output not in ("pil", "bytes"):
            raise ValueError(f"unknown output {output!r}; choose pil or bytes")
        scan = scan_folder(root)
        self.root = Path(root)
        self.classes = scan.classes
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.samples = [(str(self.root / s.path), s.label) for s in scan.samples]
        self.targets = [s.label for s in scan.samples]
        self.transform = transform
        self.target_transform = target_transform
        self.output = output

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        path, target = self.samples[index]
        if self.output == "bytes":
            with open(path, "rb") as f:
                image: Any = f.read()
        else:
            with open(path, "rb") as f:
                image = Image.open(f).convert("RGB")
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target
