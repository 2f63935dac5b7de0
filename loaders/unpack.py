"""Write a pack's images back out as an ImageFolder tree.

For a ``keep`` pack every file comes back byte for byte under its original relative path. For a
re-encoded pack the stored images come back (``raw`` ones as lossless PNG), with the file suffix
changed to match. Paths that would escape the output folder are refused, never written.
"""

from __future__ import annotations

import io
import os
from pathlib import Path, PurePosixPath
from typing import Any

from PIL import Image
from tqdm import tqdm

from packer.errors import PackFormatError, UsageError

from .read import PackReader

_SUFFIX = {"JPEG": ".jpg", "PNG": ".png", "raw": ".png"}


def safe_relative_path(path: str) -> PurePosixPath:
    """``path`` if it stays inside the output folder; ``PackFormatError`` for absolute paths, ``..``
    or empty parts (a hostile or damaged pack)."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or "\\" in path or "\0" in path or any(
            part in ("", ".", "..") for part in path.split("/")):
        raise PackFormatError(f"record path {path!r} would escape the output folder; refusing to unpack it")
    return pure


def unpack(path: str | os.PathLike[str], out: str | os.PathLike[str], overwrite: bool = False,
           progress: bool = True) -> dict[str, Any]:
    """Write every record of the pack at ``path`` into the folder ``out``."""
    out_dir = Path(out)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not overwrite:
        raise UsageError(f"{out_dir}: exists and is not empty; choose a new folder or add --overwrite")
    with PackReader(path) as reader:
        targets = [safe_relative_path(reader.path_of(i)) for i in range(reader.records)]
        out_dir.mkdir(parents=True, exist_ok=True)
        keep = reader.encoding == "keep"
        written = 0
        for i, rel in enumerate(tqdm(targets, unit="img", desc=f"unpack {reader.path.name}", disable=not progress)):
            payload = reader.payload(i, verify=True)
            fmt = reader.format_of(i)
            if not keep:
                rel = rel.with_suffix(_SUFFIX.get(fmt, rel.suffix))
            dest = out_dir.joinpath(*rel.parts)
            dest.parent.mkdir(parents=True, exist_ok=True)
            if fmt == "raw":
                entry = reader.entries[i]
                image = Image.frombytes("RGB", (int(entry["width"]), int(entry["height"])), bytes(payload))
                buffer = io.BytesIO()
                image.save(buffer, "PNG")
                payload = memoryview(buffer.getvalue())
            with open(dest, "wb") as f:
                f.write(payload)
            written += len(payload)
        return {"path": str(reader.path), "out": str(out_dir), "files": reader.records, "bytes": written,
                "skipped_at_pack_time": reader.manifest["skipped"]}
