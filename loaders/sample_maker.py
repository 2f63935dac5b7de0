"""How the drop-in path makes samples: the ``(image, target)`` pairs ``PackedImageFolder``'s
``__getitem__`` and ``__getitems__`` give, as ImageFolder gave them.

A batch of indices is read in large requests (or, for plain bytes, copied straight from the map),
decoded on the dataset's decode threads where that pays, then transformed in the calling thread in
order (so random transforms draw as they would one at a time). A damaged record raises a clear
error, or under ``on_error="skip"`` gives its place to the next intact record with a warning.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Protocol

from PIL import Image

from packload.core.errors import ChecksumError, PackFormatError
from packload.loaders.decode import DECODE_ERRORS, decode_array, decode_failure, decode_pil, to_output
from packload.loaders.decode_threads import DecodeThreads
from packload.loaders.random_crop import Draws
from packload.loaders.read import PackReader


class SampleSource(Protocol):
    """What the maker reads from the Dataset (``PackedImageFolder`` is one): its options, its
    reader, its targets and the key of its transforms' draws."""

    output: str
    transform: Callable[..., Any] | None
    target_transform: Callable[[Any], Any] | None
    target: Any
    targets: list[int]
    verify: bool
    on_error: str
    decode_size: tuple[int, int] | None
    exif_transpose: bool
    fast_jpeg: bool
    shown: str
    decode_threads: DecodeThreads
    draws: Draws

    def __len__(self) -> int: ...

    def reader(self) -> PackReader: ...

    def target_of(self, reader: PackReader, index: int) -> Any: ...


class SampleMaker:
    """Makes the samples of one ``PackedImageFolder`` (its options read from it at each call, so a
    changed ``transform`` applies at once)."""

    def __init__(self, dataset: SampleSource) -> None:
        self.dataset = dataset

    def samples(self, indices: list[int]) -> list[tuple[Any, Any]]:
        """Records ``indices`` as samples, in order."""
        ds = self.dataset
        reader = ds.reader()
        positions = reader.positions(indices)
        plain_bytes = ds.output == "bytes" and ds.transform is None and ds.target_transform is None \
            and ds.target is None
        try:
            if plain_bytes:  # copied straight from the map, no view per record
                payloads = reader.payload_bytes(positions, verify=ds.verify)
                targets = ds.targets
                return [(payload, targets[i]) for i, payload in zip(positions.tolist(), payloads, strict=True)]
            views: list[Any] = reader.payloads(positions, verify=ds.verify)
        except ChecksumError:
            if ds.on_error == "raise":
                raise
            views = [None] * len(positions)  # fall back to one record at a time below
        pairs = list(zip(positions.tolist(), views, strict=True))
        decoded: list[Any] = [None] * len(pairs)
        threads = ds.decode_threads
        if ds.output != "bytes" and threads.wanted(len(pairs)):
            decoded = threads.map(lambda pair: self._decode_or_none(reader, *pair), pairs)
        return [self.sample(reader, i, view, image) for (i, view), image in zip(pairs, decoded, strict=True)]

    def sample(self, reader: PackReader, index: int, view: memoryview | None,
               decoded: Any = None) -> tuple[Any, Any]:
        """Record ``index`` (``view``: its payload, when read already; ``decoded``: its image, when
        decoded already), transformed; a damaged one raises, or is skipped for the next intact
        record under ``on_error="skip"``."""
        ds = self.dataset
        count = len(ds)
        for attempt in range(count):
            candidate = (index + attempt) % count
            try:
                if decoded is not None and not attempt:
                    image = decoded
                else:
                    if view is None or attempt:
                        view = reader.payload(candidate, verify=ds.verify)
                    image = self.decode(reader, candidate, view)
            except Image.DecompressionBombError as exc:
                raise decode_failure(exc, reader.where(candidate)) from None
            except (PackFormatError, *DECODE_ERRORS) as exc:
                if ds.on_error == "raise":
                    if isinstance(exc, PackFormatError):
                        raise
                    raise decode_failure(exc, reader.where(candidate)) from exc
                warnings.warn(f"skipping damaged {reader.where(candidate)}: {exc}", stacklevel=4)
                continue
            target = ds.target_of(reader, candidate)
            if getattr(ds.transform, "keyed", False):  # draws keyed by the sample (RandomResizedCrop)
                image = ds.transform(image, index=index, draws=ds.draws)
            elif ds.transform is not None:
                image = ds.transform(image)
            if ds.target_transform is not None:
                target = ds.target_transform(target)
            return image, target
        raise PackFormatError(f"{ds.shown}: no intact record left to return")

    def decode(self, reader: PackReader, index: int, view: memoryview) -> Any:
        """Record ``index``'s payload ``view`` as the dataset's ``output`` (undecoded for ``bytes``)."""
        ds = self.dataset
        if ds.output == "bytes":
            return bytes(view)
        entry = reader.entries[index]
        fmt = reader.format_of(index)
        width, height = int(entry["width"]), int(entry["height"])
        orientation = int(entry["orientation"]) if ds.exif_transpose else 0
        if ds.output == "pil":
            return decode_pil(view, fmt, width, height, ds.decode_size, orientation)
        mode = entry["mode"].decode("ascii", "replace")
        pixels = decode_array(view, fmt, mode, width, height, ds.decode_size, orientation, ds.fast_jpeg)
        return to_output(pixels, ds.output)

    def _decode_or_none(self, reader: PackReader, index: int, view: memoryview | None) -> Any:
        """The decoded record, or None when it cannot be (``sample`` then decides, in order)."""
        if view is None:
            return None
        try:
            return self.decode(reader, index, view)
        except Exception:  # noqa: BLE001 - raised or skipped by sample, with its rules
            return None
