"""``PackLoader(..., device="cuda")`` (``loaders/gpu_decode.py``): one-line errors without CUDA or a
GPU decoder, nothing GPU-related imported until asked for, and, with CUDA, GPU batches that match the
CPU path's batches of the same seed (same labels and boxes, pixels within the decoders' difference)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from packload import (
    CenterCrop,
    EncodeOptions,
    PackedImageFolder,
    PackLoader,
    RandomResizedCrop,
    UsageError,
    pack,
)
from packload.loaders.gpu_decode import DECODERS, GpuBatches, gpu_decoder
from tests.image_factory import make_image_folder, write_image

NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="decoding on a GPU needs CUDA")
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
# GPU IDCTs differ from libjpeg-turbo's, and the CPU path decodes large boxes at reduced DCT scales
MEAN_LEVELS = 3.0


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    make_image_folder(root, classes=("a", "b", "c"), per_class=10, seed=9)  # JPEG and PNG alternate
    for k in range(8):
        write_image(root / "b" / f"big_{k}.jpg", size=(200 + 24 * k, 150 + 10 * k), seed=60 + k, quality=92)
    same = tmp_path_factory.mktemp("same")
    for k in range(12):
        write_image(same / f"c{k % 3}" / f"{k}.jpg", size=(48, 40), seed=k, quality=90)
    out = tmp_path_factory.mktemp("packs")
    made = {"keep": out / "keep.shards", "lmdb": out / "keep.lmdb", "same": out / "same.shards",
            "raw": out / "raw.shards"}
    pack(root, made["keep"], workers=1, progress=False)
    pack(root, made["lmdb"], workers=1, progress=False)
    pack(same, made["same"], workers=1, progress=False)
    pack(root, made["raw"], options=EncodeOptions(encoding="raw"), workers=1, progress=False)
    return made


@NO_CUDA
@pytest.mark.parametrize("crop", [RandomResizedCrop(24), CenterCrop(24), None], ids=["random", "centre", "none"])
def test_without_cuda_device_cuda_fails_in_one_line_naming_the_fix(packs, crop):
    ds = PackedImageFolder(packs["same"] if crop is None else packs["keep"])
    with pytest.raises(UsageError) as error:
        PackLoader(ds, 8, crop=crop, flip=True, device="cuda")
    message = str(error.value)
    assert "\n" not in message and "CUDA is not available" in message and "device=None" in message


@NO_CUDA
def test_without_cuda_no_decoder_is_looked_for(packs):
    with pytest.raises(UsageError, match="CUDA is not available"):
        gpu_decoder("cuda:0")


@pytest.mark.parametrize("device", ["cpu", "bogus", "meta"])
def test_a_device_that_is_not_cuda_is_refused(packs, device):
    ds = PackedImageFolder(packs["keep"])
    with pytest.raises(UsageError, match="device=") as error:
        PackLoader(ds, 8, crop=CenterCrop(24), device=device)
    assert "\n" not in str(error.value) and ("'cuda'" in str(error.value))


def test_options_that_cannot_go_with_a_gpu_are_refused_before_any_gpu_is_needed(packs):
    ds = PackedImageFolder(packs["keep"])
    with pytest.raises(UsageError, match="encoded=True.*device='cuda'"):
        PackLoader(ds, 8, encoded=True, device="cuda")
    with_transform = PackedImageFolder(packs["same"], transform=CenterCrop(24))
    with pytest.raises(UsageError, match="cannot run the dataset's transform: give crop="):
        PackLoader(with_transform, 8, device="cuda")


def test_the_gpu_decoders_are_imported_only_when_a_loader_asks_for_a_gpu():
    code = ("import sys; from packload import PackLoader, PackedImageFolder; import packload.loaders.gpu_decode; "
            "print(sorted(m for m in ('nvidia.nvimgcodec', 'torchvision') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    code = "import sys; import packload.loaders.pack_loader; print('packload.loaders.gpu_decode' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", "the CPU loader does not import the GPU module"


# -- with CUDA -------------------------------------------------------------------------------------


def _decoders() -> list[str]:
    return list(DECODERS)


def _loader_pair(ds: PackedImageFolder, crop, flip: bool, batch: int, decoder: str):
    try:
        gpu_decoder("cuda", prefer=(decoder,))
    except UsageError as exc:
        pytest.skip(f"{decoder} cannot decode here: {exc}")
    gpu = PackLoader(ds, batch, sampler=ds.sampler(seed=3), crop=crop, flip=flip, device="cuda")
    gpu.gpu.decoder = gpu_decoder("cuda", prefer=(decoder,))  # this decoder, not the first that works
    cpu = PackLoader(ds, batch, sampler=ds.sampler(seed=3), crop=crop, flip=flip)
    return gpu, cpu


@NEEDS_CUDA
@pytest.mark.parametrize("decoder", _decoders())
@pytest.mark.parametrize("crop", [RandomResizedCrop(24), CenterCrop(24)], ids=["random", "centre"])
def test_gpu_batches_match_the_cpu_batches_of_the_same_seed(packs, crop, decoder):
    ds = PackedImageFolder(packs["keep"])
    gpu, cpu = _loader_pair(ds, crop, True, 16, decoder)
    for epoch in range(2):
        gpu.set_epoch(epoch)
        cpu.set_epoch(epoch)
        got, want = list(gpu), list(cpu)
        assert len(got) == len(want) == len(gpu)
        for (images, labels), (cpu_images, cpu_labels) in zip(got, want, strict=True):
            assert images.device.type == "cuda" and labels.device.type == "cuda"
            assert images.dtype == torch.uint8 and images.shape == cpu_images.shape
            assert images.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(labels.cpu(), cpu_labels)
            diff = (images.cpu().int() - cpu_images.int()).abs().float()
            assert diff.mean().item() < MEAN_LEVELS, f"{decoder}: {diff.mean().item():.2f} levels from the CPU path"


@NEEDS_CUDA
@pytest.mark.parametrize("decoder", _decoders())
def test_records_the_gpu_does_not_decode_are_the_cpu_paths_pixels(packs, decoder):
    ds = PackedImageFolder(packs["lmdb"])
    gpu, cpu = _loader_pair(ds, RandomResizedCrop(24), True, 20, decoder)
    (images, labels), (cpu_images, cpu_labels) = next(iter(gpu)), next(iter(cpu))
    order = ds.sampler(seed=3).epoch_order(0)[:20]
    pngs = torch.from_numpy(np.array([ds.reader().format_of(int(i)) == "PNG" for i in order]))
    assert pngs.any() and not pngs.all()
    assert torch.equal(images.cpu()[pngs], cpu_images[pngs]), "PNGs are decoded by the CPU path and copied up"
    assert torch.equal(labels.cpu(), cpu_labels)


@NEEDS_CUDA
@pytest.mark.parametrize("decoder", _decoders())
def test_without_a_crop_images_of_one_size_and_raw_packs(packs, decoder):
    ds = PackedImageFolder(packs["same"])
    gpu, cpu = _loader_pair(ds, None, False, 5, decoder)
    for (images, labels), (cpu_images, cpu_labels) in zip(gpu, cpu, strict=True):
        assert images.shape[1:] == (3, 40, 48) and torch.equal(labels.cpu(), cpu_labels)
        assert (images.cpu().int() - cpu_images.int()).abs().float().mean().item() < MEAN_LEVELS
    raw = PackedImageFolder(packs["raw"])
    gpu = PackLoader(raw, 8, sampler=raw.sampler(seed=1), crop=CenterCrop(24), device="cuda", channels_last=False)
    cpu = PackLoader(raw, 8, sampler=raw.sampler(seed=1), crop=CenterCrop(24), channels_last=False)
    (images, labels), (cpu_images, cpu_labels) = next(iter(gpu)), next(iter(cpu))
    assert images.is_contiguous() and torch.equal(images.cpu(), cpu_images), "raw records take the CPU path"


@NEEDS_CUDA
def test_a_resumed_epoch_continues_with_the_same_gpu_batches(packs):
    ds = PackedImageFolder(packs["keep"])
    loader = PackLoader(ds, 8, sampler=ds.sampler(seed=2), crop=RandomResizedCrop(24), flip=True, device="cuda")
    whole = [(images.cpu(), labels.cpu()) for images, labels in loader]
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    it.close()
    again = PackLoader(ds, 8, sampler=ds.sampler(seed=2), crop=RandomResizedCrop(24), flip=True, device="cuda")
    again.load_state_dict(state)
    rest = [(images.cpu(), labels.cpu()) for images, labels in again]
    assert len(rest) == len(whole) - 1
    for (a, la), (b, lb) in zip(rest, whole[1:], strict=True):
        assert torch.equal(la, lb) and torch.equal(a, b)


@NEEDS_CUDA
def test_gpu_batches_builds_from_several_threads(packs):
    ds = PackedImageFolder(packs["keep"])
    one = GpuBatches(ds, CenterCrop(24), 0.0, True, "cuda")
    loader = PackLoader(ds, 8, sampler=ds.sampler(seed=5), crop=CenterCrop(24), device="cuda", threads=3)
    serial = PackLoader(ds, 8, sampler=ds.sampler(seed=5), crop=CenterCrop(24), device="cuda", threads=0)
    for (a, la), (b, lb) in zip(loader, serial, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    assert one.decoder.name in DECODERS


# -- the assembly of a batch, with a stand-in decoder on the CPU ---------------------------------


class _StandInDecoder:
    """Decodes with PIL on the CPU as a GPU decoder would on its device: whole images, or each box
    where ``regions``; refuses the records named in ``refuse`` (None, as a GPU decoder does)."""

    name = "stand-in"

    def __init__(self, regions: bool, refuse: int = 0) -> None:
        self.regions = regions
        self.refuse = refuse
        self.calls = 0

    def decode(self, payloads, boxes, stream):
        import io

        from PIL import Image

        self.calls += 1
        results = []
        for k, payload in enumerate(payloads):
            if k < self.refuse:
                results.append(None)
                continue
            pixels = np.asarray(Image.open(io.BytesIO(payload.numpy().tobytes())).convert("RGB"))
            image = torch.from_numpy(pixels.copy()).permute(2, 0, 1)
            if self.regions:
                top, left, height, width = (int(v) for v in boxes[k])
                results.append((image[:, top : top + height, left : left + width], (top, left)))
            else:
                results.append((image, (0, 0)))
        return results


class _Stream:
    cuda_stream = 0

    def synchronize(self) -> None:
        pass


@pytest.fixture
def on_the_cpu(monkeypatch):
    """``GpuBatches`` run on the CPU: the device is the CPU and the CUDA streams do nothing."""
    import contextlib

    from packload.loaders import gpu_decode

    monkeypatch.setattr(gpu_decode, "cuda_device", lambda device: torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)


@pytest.mark.parametrize("regions", [False, True], ids=["whole", "regions"])
@pytest.mark.parametrize("crop", [RandomResizedCrop(24, dct_scale=False), CenterCrop(32)], ids=["random", "centre"])
def test_a_batch_is_assembled_from_decoded_jpegs_and_cpu_rows(packs, on_the_cpu, crop, regions):
    ds = PackedImageFolder(packs["lmdb"])
    decoder = _StandInDecoder(regions, refuse=2)
    batches = GpuBatches(ds, crop, 0.5, True, "cuda", decoder=decoder)
    sampler = ds.sampler(seed=6)
    cpu = PackLoader(ds, 24, sampler=ds.sampler(seed=6), crop=crop, flip=True, threads=0)
    from packload.loaders.random_crop import Draws

    draws = Draws(sampler.seed, sampler.epoch, sampler.rank)
    order = sampler.epoch_order(0)
    for start, (want, want_labels) in zip(range(0, len(order), 24), cpu, strict=True):
        images, labels = batches.build(order[start : start + 24], draws)
        assert images.shape == want.shape and images.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(labels, want_labels)
        diff = (images.int() - want.int()).abs()
        entries = ds.reader().entries[order[start : start + 24]]
        full = torch.tensor([not isinstance(crop, CenterCrop) or crop.decode_scale(int(h), int(w)) >= 1
                             for h, w in zip(entries["height"], entries["width"], strict=True)])
        # the same boxes and flips as the CPU path: a level or two where it decoded in full (the float
        # resize against its uint8 kernel), a few where it decoded at a reduced DCT scale
        assert full.any() and diff[full].max().item() <= 2
        assert diff.float().mean().item() < MEAN_LEVELS
    assert decoder.calls == -(-len(order) // 24)


def test_a_decoder_that_decodes_nothing_leaves_the_batch_to_the_cpu_with_one_warning(packs, on_the_cpu):
    ds = PackedImageFolder(packs["keep"])
    batches = GpuBatches(ds, CenterCrop(24), 0.0, False, "cuda", decoder=_StandInDecoder(False, refuse=10**6))
    cpu = PackLoader(ds, 16, sampler=ds.sampler(seed=1), crop=CenterCrop(24), threads=0, channels_last=False)
    from packload.loaders.random_crop import Draws

    order = ds.sampler(seed=1).epoch_order(0)
    with pytest.warns(UserWarning, match="stand-in decoded none of a batch's .* JPEGs") as caught:
        got = [batches.build(order[s : s + 16], Draws(1)) for s in range(0, len(order), 16)]
    assert len(caught) == 1, "one warning, not one per batch"
    for (images, labels), (want, want_labels) in zip(got, cpu, strict=True):
        assert images.is_contiguous() and torch.equal(images, want) and torch.equal(labels, want_labels)


def test_a_jpeg_of_too_many_scans_never_reaches_the_gpu_decoder(tmp_path, on_the_cpu):
    """It goes to the CPU path, which refuses it as every route does (here: the error naming it)."""
    import io

    from PIL import Image

    from packload.core.errors import PackFormatError
    from packload.core.jpeg_scans import too_many_scans
    from packload.loaders.random_crop import Draws
    from tests.image_factory import textured_rgb
    from tests.jpeg_scan_factory import many_scan_jpeg
    from tests.reliability.crafted import craft_pack

    items = []
    for k in range(5):
        buffer = io.BytesIO()
        Image.fromarray(textured_rgb((64, 48), k)).save(buffer, "JPEG", quality=90)
        items.append((f"a/{k}.jpg", 0, buffer.getvalue()))
    items.append(("a/many.jpg", 0, many_scan_jpeg(700)))  # packing refuses it: a pack from elsewhere
    craft_pack(tmp_path / "p.shards", items)
    ds = PackedImageFolder(tmp_path / "p.shards")
    bad = next(k for k in range(len(ds)) if ds.path(k).endswith("many.jpg"))
    seen = []

    class Watching(_StandInDecoder):
        def decode(self, payloads, boxes, stream):
            seen.extend(bytes(p.numpy()) for p in payloads)
            return super().decode(payloads, boxes, stream)

    batches = GpuBatches(ds, CenterCrop(24), 0.0, True, "cuda", decoder=Watching(False))
    with pytest.raises(PackFormatError, match=rf"{ds.path(bad)}.*more than 500 scans"):
        batches.build(np.arange(len(ds)), Draws(0))
    assert len(seen) == len(ds) - 1 and not any(too_many_scans(p) for p in seen)
