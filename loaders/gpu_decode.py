"""JPEG batches decoded on a GPU: what ``PackLoader(..., device="cuda")`` runs.

Each batch is planned on the CPU (``gpu_batch.plan_batch``: which records are JPEGs a GPU decoder
takes, the box of each, the flips), its JPEG payloads are handed to a GPU decoder, and every box is
resized into its slot of a CUDA uint8 batch and mirrored there (``gpu_batch.crop_resize_flip``). The
other records of the batch (PNG, raw pixels, EXIF-rotated images, anything the GPU decoder refused)
are decoded by the CPU path with the same crop, boxes and flips, and copied up. The boxes are the
CPU path's (``RandomResizedCrop``'s draws are keyed by seed, epoch, rank and record), so a GPU batch
and a CPU batch of the same step crop the same boxes; pixels differ by the decoders' IDCTs and by
the CPU path's reduced-scale decodes (a few levels of 255).

The decoder is nvImageCodec (``pip install "packload[gpu]"``, or ``"packload[gpu-cu13]"`` for a
CUDA 13 build of torch), which decodes only each box where the installed version can (a region
decode), else torchvision's ``decode_jpeg`` on the GPU. Neither is imported before a loader asks for
a GPU. Each building thread has its own CUDA stream and decoder, and waits for its stream before it
hands a batch over, so a batch is complete when the training loop gets it.
"""

from __future__ import annotations

import io
import threading
import warnings
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from PIL import Image

from packload.core.errors import UsageError
from packload.core.jpeg_scans import too_many_scans
from packload.loaders.crop import CenterCrop
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.gpu_batch import BatchPlan, crop_resize_flip, plan_batch
from packload.loaders.random_crop import Draws, RandomResizedCrop

DECODERS = ("nvimgcodec", "torchvision")  # in the order they are tried
INSTALL_HINT = ('pip install "packload[gpu]" (nvImageCodec; "packload[gpu-cu13]" for a CUDA 13 build of torch), '
                "or install torchvision")

Decoded = tuple[torch.Tensor, tuple[int, int]]  # 3×h×w uint8 on the GPU, and where it starts in the stored image


class JpegDecoder(Protocol):
    """A GPU JPEG decoder: ``decode`` turns payloads (1-D uint8 CPU tensors) into 3×h×w uint8 CUDA
    tensors on ``stream`` (None where it could not decode one); with ``regions`` it may decode only
    each box (top, left, height, width) and says where the result starts."""

    name: str
    regions: bool

    def decode(self, payloads: Sequence[torch.Tensor], boxes: np.ndarray,
               stream: torch.cuda.Stream) -> list[Decoded | None]: ...


class NvImageCodecDecoder:
    """nvImageCodec (``nvidia.nvimgcodec``) on its GPU back-ends only (the hardware JPEG engine, CUDA,
    and nvJPEG's hybrid), one ``Decoder`` per thread. Boxes are decoded as regions when the installed
    version offers them (``DecodeSource(data, region)`` or ``CodeStream.get_sub_code_stream``); if a
    region decode gives nothing where a full decode works, regions are turned off for good."""

    name = "nvimgcodec"

    def __init__(self, device: torch.device) -> None:
        from nvidia import nvimgcodec  # the gpu extra; imported only when a loader asks for a GPU

        self._nv = nvimgcodec
        self.device = device
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        kinds = ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU")
        self._backends = [nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, kind)) for kind in kinds
                          if hasattr(nvimgcodec.BackendKind, kind)]  # older versions lack the hardware one
        self._params = nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=nvimgcodec.ColorSpec.SRGB,
                                               sample_format=nvimgcodec.SampleFormat.I_RGB)
        self.regions = hasattr(nvimgcodec, "Region") and (
            hasattr(nvimgcodec, "DecodeSource") or hasattr(nvimgcodec.CodeStream, "get_sub_code_stream"))
        self._local = threading.local()

    def _decoder(self) -> Any:
        decoder = getattr(self._local, "decoder", None)
        if decoder is None:
            decoder = self._local.decoder = self._nv.Decoder(device_id=self._index, backends=self._backends)
        return decoder

    def _source(self, payload: np.ndarray, box: Sequence[int] | None) -> Any:
        nv = self._nv
        if box is None:
            return nv.CodeStream(payload)
        top, left, height, width = box
        region = nv.Region(top, left, top + height, left + width)
        if hasattr(nv, "DecodeSource"):
            return nv.DecodeSource(nv.CodeStream(payload), region)
        return nv.CodeStream(payload).get_sub_code_stream(region=region)

    def _run(self, payloads: list[np.ndarray], boxes: list[list[int]] | None,
             stream: torch.cuda.Stream) -> list[Decoded | None]:
        sources = [self._source(p, boxes[k] if boxes is not None else None) for k, p in enumerate(payloads)]
        images = self._decoder().decode(sources, params=self._params, cuda_stream=stream.cuda_stream)
        results: list[Decoded | None] = []
        for k, image in enumerate(images):
            if image is None:
                results.append(None)
                continue
            tensor = torch.as_tensor(image, device=self.device)  # H×W×C through __cuda_array_interface__
            tensor = tensor.unsqueeze(-1) if tensor.dim() == 2 else tensor
            tensor = tensor.permute(2, 0, 1)
            if tensor.shape[0] == 1:
                tensor = tensor.expand(3, -1, -1)
            origin = (boxes[k][0], boxes[k][1]) if boxes is not None else (0, 0)
            results.append((tensor, origin))
        return results

    def decode(self, payloads: Sequence[torch.Tensor], boxes: np.ndarray,
               stream: torch.cuda.Stream) -> list[Decoded | None]:
        arrays = [p.numpy() for p in payloads]
        if not self.regions:
            return self._run(arrays, None, stream)
        results = self._run(arrays, boxes.tolist(), stream)
        missing = [k for k, r in enumerate(results) if r is None]
        if missing:  # a back-end without region decodes: try those in full
            again = self._run([arrays[k] for k in missing], None, stream)
            for k, result in zip(missing, again, strict=True):
                results[k] = result
            if len(missing) == len(arrays) and any(r is not None for r in again):
                self.regions = False  # region decodes gave nothing where full ones work: stop asking
        return results


class TorchvisionDecoder:
    """torchvision's ``decode_jpeg`` on the GPU (nvJPEG), a list of payloads at a time."""

    name = "torchvision"
    regions = False

    def __init__(self, device: torch.device) -> None:
        from torchvision.io import ImageReadMode, decode_jpeg  # imported only when a loader asks for a GPU

        self._decode, self._mode = decode_jpeg, ImageReadMode.RGB
        self.device = device

    def decode(self, payloads: Sequence[torch.Tensor], boxes: np.ndarray,
               stream: torch.cuda.Stream) -> list[Decoded | None]:
        try:
            images = self._decode(list(payloads), mode=self._mode, device=self.device)
            return [(image, (0, 0)) for image in images]
        except RuntimeError:  # one bad payload fails the whole list: decode one by one
            results: list[Decoded | None] = []
            for payload in payloads:
                try:
                    results.append((self._decode(payload, mode=self._mode, device=self.device), (0, 0)))
                except RuntimeError:
                    results.append(None)
            return results


def cuda_device(device: str | torch.device) -> torch.device:
    """``device`` as a CUDA device, or a UsageError naming the fix (not CUDA, or no CUDA here)."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise UsageError(f"device={device!r} is not a device: give 'cuda' (or 'cuda:N'), or None for the CPU") from exc
    if resolved.type != "cuda":
        raise UsageError(f"device={device!r}: PackLoader decodes on 'cuda' (or 'cuda:N') only; leave device=None "
                         "to build batches on the CPU")
    if not torch.cuda.is_available():
        raise UsageError(f"device={device!r} but CUDA is not available (torch {torch.__version__}): install a CUDA "
                         "build of torch on a machine with an NVIDIA GPU, or leave device=None to decode on the CPU")
    return resolved


def _probe_jpeg() -> tuple[torch.Tensor, np.ndarray]:
    """A small JPEG (its payload as a 1-D uint8 tensor) and its pixels as PIL decodes them."""
    y, x = np.mgrid[0:16, 0:24]
    pixels = np.stack([x * 10, y * 15, (x + y) * 6], axis=-1).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
    payload = np.frombuffer(buffer.getvalue(), dtype=np.uint8).copy()
    return torch.from_numpy(payload), np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))


def _check(decoder: JpegDecoder, device: torch.device) -> None:
    """Decode a small JPEG on ``device``; RuntimeError saying what went wrong if it does not come out."""
    payload, want = _probe_jpeg()
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        result = decoder.decode([payload], np.array([[0, 0, 16, 24]]), stream)[0]
    stream.synchronize()
    if result is None:
        raise RuntimeError("it decoded no JPEG on the GPU (its GPU back-end, nvJPEG, may be missing: "
                           "pip install nvidia-nvjpeg-cu12, or nvidia-nvjpeg for CUDA 13)")
    image, _ = result
    got = image.cpu().permute(1, 2, 0).numpy()
    if got.shape != want.shape or np.abs(got.astype(np.int16) - want).mean() > 8:
        raise RuntimeError(f"its test JPEG came out {got.shape} and unlike the original")


def gpu_decoder(device: str | torch.device, prefer: Sequence[str] = DECODERS) -> JpegDecoder:
    """A working GPU JPEG decoder for ``device``: the first of ``prefer`` that imports and decodes a
    test JPEG there. UsageError, on one line, naming the fix when CUDA or every decoder is missing."""
    resolved = cuda_device(device)
    makers = {"nvimgcodec": NvImageCodecDecoder, "torchvision": TorchvisionDecoder}
    unknown = [name for name in prefer if name not in makers]
    if unknown or not prefer:
        raise UsageError(f"unknown GPU decoder {unknown or prefer!r}; choose from {', '.join(DECODERS)}")
    reasons = []
    for name in prefer:
        try:
            decoder: JpegDecoder = makers[name](resolved)
            _check(decoder, resolved)
            return decoder
        except ImportError as exc:
            reasons.append(f"{name} is not installed ({exc.name or exc})")
        except (RuntimeError, OSError, ValueError, AttributeError) as exc:
            reasons.append(f"{name} failed: {' '.join(str(exc).split())}")
    raise UsageError(f"device={device!r} needs a GPU JPEG decoder: {INSTALL_HINT}; {'; '.join(reasons)}")


class GpuBatches:
    """Builds ``PackLoader``'s batches on a GPU: ``build(indices, draws)`` gives ``(B×3×H×W uint8, B
    int64)``, both on ``device``, complete when returned.

    The batches may be used on the CUDA stream that was current when this object was made (the
    default stream, normally): their memory is not reused before that stream's work on them is done."""

    def __init__(self, dataset: PackedImageFolder, crop: CenterCrop | RandomResizedCrop | None, flip: float,
                 channels_last: bool, device: str | torch.device, fast_idct: bool = False,
                 decoder: JpegDecoder | None = None) -> None:
        if crop is None and dataset.transform is not None:
            raise UsageError("PackLoader(device='cuda') crops on the GPU and cannot run the dataset's transform: "
                             "give crop= (CenterCrop or RandomResizedCrop), or a dataset without a transform")
        self.device = cuda_device(device)
        self.dataset, self.crop, self.flip = dataset, crop, flip
        self.channels_last, self.fast_idct = channels_last, fast_idct
        self.decoder: JpegDecoder = decoder if decoder is not None else gpu_decoder(self.device)
        self._consumer = torch.cuda.current_stream(self.device)
        self._local = threading.local()
        self._warned = False

    def _stream(self) -> torch.cuda.Stream:
        stream = getattr(self._local, "stream", None)
        if stream is None:
            stream = self._local.stream = torch.cuda.Stream(self.device)
        return stream

    def build(self, indices: np.ndarray, draws: Draws) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch of records ``indices`` (dataset indices, the sampler's order)."""
        reader = self.dataset.reader()
        plan = plan_batch(reader.entries, reader.positions(indices), self.crop, self.flip, draws,
                          self.dataset.exif_transpose)
        labels = plan.labels.copy()
        stream = self._stream()
        layout = torch.channels_last if self.channels_last else torch.contiguous_format
        held: list[Any] = []  # payloads and decoded images, kept until the stream is done with them
        with torch.cuda.stream(stream):
            images = torch.empty((len(plan.positions), 3, *plan.size), dtype=torch.uint8, device=self.device,
                                 memory_format=layout)
            host_rows = self._decode_on_device(plan, images, labels, stream, held)
            if len(host_rows):
                self._decode_on_host(plan, host_rows, images, labels, draws)
            labels_on_device = torch.from_numpy(labels).to(self.device, non_blocking=True)
        images.record_stream(self._consumer)
        labels_on_device.record_stream(self._consumer)
        stream.synchronize()  # the batch is complete when handed over (this thread waits, not the loop)
        held.clear()
        return images, labels_on_device

    def _decode_on_device(self, plan: BatchPlan, images: torch.Tensor, labels: np.ndarray,
                          stream: torch.cuda.Stream, held: list[Any]) -> np.ndarray:
        """Decode, crop and flip the plan's device rows into ``images``; the rows left for the CPU.
        What the stream's work reads is appended to ``held``."""
        rows = plan.device_rows
        if not len(rows):
            return plan.host_rows
        data, offsets, chosen_labels = self.dataset.get_encoded_batch(plan.positions[rows])
        bounds = offsets.tolist()
        payloads = [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
        labels[rows] = chosen_labels.numpy()
        # A JPEG of more scans than allowed never reaches the GPU decoder: the CPU path refuses it, with
        # the error (or the skip) every other route gives it.
        scanned = np.array([not too_many_scans(memoryview(p.numpy())) for p in payloads], dtype=bool)
        if not scanned.all():
            left_out, rows = rows[~scanned], rows[scanned]
            payloads = [p for p, ok in zip(payloads, scanned.tolist(), strict=True) if ok]
            if not len(rows):
                return np.union1d(plan.host_rows, left_out).astype(np.int64)
        else:
            left_out = np.zeros(0, dtype=np.int64)
        boxes = plan.boxes[rows]
        try:
            decoded = self.decoder.decode(payloads, boxes, stream)
        except (RuntimeError, ValueError) as exc:
            self._warn(f"{self.decoder.name} failed on a batch ({' '.join(str(exc).split())}): decoding it on the CPU")
            decoded = [None] * len(rows)
        held.extend((data, decoded))
        entries = self.dataset.reader().entries[plan.positions[rows]]
        decoded = [_placed(result, boxes[k], int(entries["height"][k]), int(entries["width"][k]))
                   for k, result in enumerate(decoded)]
        good = [k for k, result in enumerate(decoded) if result is not None]
        if good:
            ok_rows = rows[good]
            target = images if len(ok_rows) == len(images) else torch.empty(
                (len(ok_rows), *images.shape[1:]), dtype=torch.uint8, device=self.device).contiguous(
                memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)
            crop_resize_flip([decoded[k][0] for k in good], [decoded[k][1] for k in good],  # type: ignore[index]
                             boxes[good], plan.flips[ok_rows], target)
            if target is not images:
                images.index_copy_(0, torch.from_numpy(ok_rows).to(self.device), target)
        if not good:
            self._warn(f"{self.decoder.name} decoded none of a batch's {len(rows)} JPEGs: the CPU decodes them")
        left = np.setdiff1d(rows, rows[good] if good else np.zeros(0, dtype=np.int64))
        return np.union1d(np.union1d(plan.host_rows, left), left_out).astype(np.int64)

    def _decode_on_host(self, plan: BatchPlan, rows: np.ndarray, images: torch.Tensor, labels: np.ndarray,
                        draws: Draws) -> None:
        """The CPU path's batch of ``rows`` (same crop, boxes and flips: keyed by record), copied up."""
        batch, chosen = self.dataset.get_batch(plan.positions[rows], True, crop=self.crop, pin_memory=True,
                                               fast_idct=self.fast_idct, flip=self.flip, draws=draws)
        images.index_copy_(0, torch.from_numpy(rows).to(self.device), batch.to(self.device, non_blocking=True))
        labels[rows] = chosen.numpy()

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(message, stacklevel=3)


def _placed(result: Decoded | None, box: np.ndarray, height: int, width: int) -> Decoded | None:
    """``result`` with its true origin if it holds its box (the whole stored image, or just the box
    where a region was decoded); None if it is neither (the CPU path then decodes the record)."""
    if result is None or result[0].dim() != 3 or result[0].shape[0] != 3:
        return None
    image, origin = result
    got = (int(image.shape[1]), int(image.shape[2]))
    top, left, box_h, box_w = (int(v) for v in box)
    if got == (height, width):
        return image, (0, 0)
    if got == (box_h, box_w) and origin == (top, left):
        return result
    return None
