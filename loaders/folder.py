"""``FolderImages``: a plain ImageFolder-style dataset over the original files, one ``open()`` per
sample. It is the baseline packload is measured against, and what ``tune``/``doctor`` read when
given a raw folder. It needs no torchvision and scans exactly as ``pack`` does.

It reads as ``pack`` reads: regular files only, never past the size they had when opened (a file
swapped for a FIFO or a device after the scan is refused, not waited on), and PIL opens only the
formats packload decodes (``packer.format.DECODABLE``: no plugin that runs an external program)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from packload.core.jpeg_scans import TooManyScansError
from packload.core.probe import NotDecodableError, open_image
from packload.core.safe_files import read_regular
from packload.core.scan import scan_folder


class FolderImages(Dataset):
    """``(image, class_index)`` for every image file under ``root``, as torchvision's ImageFolder.

    ``output="pil"`` gives an RGB image (``Image.open(path).convert("RGB")``), ``output="bytes"``
    the file's bytes undecoded. A file that is not a regular file any more raises ``OSError``
    (``packer.safe_files.NotRegularFileError``), one in a format packload does not decode
    ``NotDecodableError`` (an ``OSError`` too, as PIL's ``UnidentifiedImageError``); both name the file.
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
        data = read_regular(path)
        image: Any = data
        if self.output == "pil":
            try:
                image = open_image(data).convert("RGB")
            except (NotDecodableError, TooManyScansError) as exc:
                raise type(exc)(f"{path}: {exc}; convert it or remove it from the folder") from None
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target
