"""The compiled resize kernel gives exactly torch's pixels, reads no byte outside the image, and
packload falls back to torch where it is missing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from packload.core import resize_kernel
from packload.loaders.crop import CenterCrop

needs_kernel = pytest.mark.skipif(not resize_kernel.available(),
                                  reason=f"compiled resize kernel not in use: {resize_kernel.unavailable_reason}")


def torch_resize(region: np.ndarray, height: int, width: int) -> np.ndarray:
    """What torch's uint8 antialiased bilinear kernel makes of an HxWx3 region."""
    source = torch.from_numpy(np.ascontiguousarray(region)).permute(2, 0, 1).unsqueeze(0)
    out = torch.nn.functional.interpolate(source, size=(height, width), mode="bilinear", antialias=True,
                                          align_corners=False)
    return out[0].permute(1, 2, 0).numpy()


def kernel_resize(region: np.ndarray, height: int, width: int) -> np.ndarray:
    out = np.full((height, width + 3, 3), 7, dtype=np.uint8)  # rows wider than the image: a strided target
    done = resize_kernel.resize_region(region.ctypes.data, region.strides[0], region.shape[0], region.shape[1],
                                       out.ctypes.data, out.strides[0], height, width)
    # it declines shrinks by more than 2x (torch is faster there) and nothing else here
    assert done == (region.shape[0] <= 2 * height and region.shape[1] <= 2 * width)
    if not done:
        return torch_resize(region, height, width)
    assert (out[:, width:] == 7).all()  # nothing written past a row's last pixel
    return out[:, :width]


def natural(height: int, width: int, seed: int) -> np.ndarray:
    """Smooth gradients with edges and noise: what photographs look like to a resampler."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(1, width - 1), y * 255 // max(1, height - 1), (x + y) % 64 * 4], axis=-1)
    edges = ((x // 7 + y // 5) % 2 * 90)[..., None]
    return np.clip(base + edges + rng.integers(-20, 21, base.shape), 0, 255).astype(np.uint8)


@needs_kernel
@pytest.mark.parametrize("side", [6, 17, 120, 168, 192, 223, 224, 225, 240, 300, 517])
def test_squares_to_224_equal_torch(side: int) -> None:
    for seed, image in enumerate((natural(side + 9, side + 30, side),
                                  np.random.default_rng(side).integers(0, 256, (side + 9, side + 30, 3), np.uint8))):
        region = image[4 : 4 + side, 13 : 13 + side]  # a square inside a larger image: strided rows
        assert np.array_equal(kernel_resize(region, 224, 224), torch_resize(region, 224, 224)), (side, seed)


@needs_kernel
def test_any_shape_equals_torch() -> None:
    rng = np.random.default_rng(0)
    for _ in range(40):
        height, width = int(rng.integers(2, 400)), int(rng.integers(6, 400))
        out_height, out_width = (int(v) for v in rng.integers(1, 300, 2))
        image = rng.integers(0, 256, (height, width + 5, 3), np.uint8)[:, 2 : 2 + width]
        assert np.array_equal(kernel_resize(image, out_height, out_width), torch_resize(image, out_height, out_width)), \
            (height, width, out_height, out_width)


@needs_kernel
def test_rows_too_short_for_the_kernel_go_to_torch() -> None:
    """Under 16 bytes a row (5 pixels), or one row: the kernel declines and ``resize`` uses torch."""
    from packload.loaders.crop import resize

    for height, width in ((40, 5), (1, 60)):
        image = natural(height, width, 1)
        assert not resize_kernel.resize_region(image.ctypes.data, width * 3, height, width, 0, 0, 9, 9)
        out = torch.empty((1, 9, 9, 3), dtype=torch.uint8).permute(0, 3, 1, 2)
        resize(torch.from_numpy(image).permute(2, 0, 1).unsqueeze(0), out)
        assert np.array_equal(out[0].permute(1, 2, 0).numpy(), torch_resize(image, 9, 9))


@needs_kernel
def test_reads_nothing_past_the_image() -> None:
    """An image that ends exactly where readable memory ends (a guard page after it): resizing any
    square of it, from any corner, must not touch the guard page (a stray read kills the process)."""
    script = textwrap.dedent("""
        import ctypes, mmap
        import numpy as np
        from packload.core import resize_kernel
        libc = ctypes.CDLL(None, use_errno=True)
        page = mmap.PAGESIZE
        buffer = mmap.mmap(-1, 64 * page)
        base = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        assert libc.mprotect(ctypes.c_void_p(base + 63 * page), page, 0) == 0  # PROT_NONE
        out = np.empty((224, 224, 3), np.uint8)
        for height, width in ((100, 120), (37, 7), (200, 257), (6, 6)):
            size = height * width * 3
            start = 63 * page - size  # the image's last byte is the last readable one
            image = np.frombuffer(buffer, np.uint8, size, start).reshape(height, width, 3)
            image[...] = 99
            side = min(height, width)
            for top, left in ((0, 0), (height - side, width - side)):
                square = image[top : top + side, left : left + side]
                done = resize_kernel.resize_region(square.ctypes.data, width * 3, side, side, out.ctypes.data, 672, 224, 224)
                assert (out == 99).all() or not done
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def test_center_crop_is_the_same_with_the_kernel_or_torch() -> None:
    """``CenterCrop`` gives the same pixels when packload resizes with torch only."""
    image = natural(171, 256, 3)
    with_kernel = CenterCrop(224)(image)
    resize_kernel.set_enabled(False)
    try:
        assert not resize_kernel.available() and resize_kernel.unavailable_reason
        with_torch = CenterCrop(224)(image)
    finally:
        resize_kernel.set_enabled(True)
    assert np.array_equal(with_kernel, with_torch)
    top, left, side = CenterCrop(224).window(171, 256)
    assert np.array_equal(with_torch, torch_resize(image[top : top + side, left : left + side], 224, 224))


@needs_kernel
@pytest.mark.parametrize("backend", ["lmdb", "shards"])
def test_a_raw_batch_resized_in_one_call_equals_torch(tmp_path, backend: str) -> None:
    """Raw images of many sizes, cropped in one kernel call per batch straight from the map: each
    slot equals torch's resize of the image's centred square (and the records the kernel cannot take,
    a square 4 pixels wide and shrinks by more than 2x, still come out right through the per-image route)."""
    from PIL import Image

    from packload import EncodeOptions, PackedImageFolder, pack
    from packload.core import jpeg_kernel

    sizes = [(40, 30), (57, 64), (100, 75), (33, 120), (5, 40), (200, 160), (64, 64), (19, 23)]
    for k, (width, height) in enumerate(sizes):
        (tmp_path / "src" / "a").mkdir(parents=True, exist_ok=True)
        Image.fromarray(natural(height, width, k)).save(tmp_path / "src" / "a" / f"{k}.png")
    dest = tmp_path / ("p.lmdb" if backend == "lmdb" else "p.shards")
    pack(tmp_path / "src", dest, options=EncodeOptions(encoding="raw"), workers=1, progress=False, backend=backend)
    ds = PackedImageFolder(dest)
    crop = CenterCrop(32)
    taken: list[int] = []
    original = jpeg_kernel.decode_boxes

    def counting(*args, **kwargs) -> np.ndarray:
        done = original(*args, **kwargs)
        taken.append(int(done.sum()))
        return done

    jpeg_kernel.decode_boxes = counting
    try:
        images, _ = ds.get_batch(list(range(len(ds))), channels_last=True, crop=crop)
    finally:
        jpeg_kernel.decode_boxes = original
    sides = [crop.window(height, width)[2] for width, height in sizes]
    assert taken == [sum(6 <= side <= 64 for side in sides)] and taken[0] >= 4  # not 4 px wide, nor shrunk > 2x
    for k in range(len(ds)):
        pixels = np.asarray(Image.open(tmp_path / "src" / "a" / f"{ds.path(k).split('/')[-1]}").convert("RGB"))
        top, left, side = crop.window(*pixels.shape[:2])
        want = torch_resize(pixels[top : top + side, left : left + side], 32, 32)
        assert np.array_equal(images[k].permute(1, 2, 0).numpy(), want), ds.path(k)


@needs_kernel
def test_more_sizes_than_the_weights_cache_keeps(monkeypatch) -> None:
    """Past the cache's capacity a single resize builds and frees its own weights (same pixels), and
    there are no weights for a batch call (the batch decoder then declines, and its caller resizes one
    by one)."""
    monkeypatch.setattr(resize_kernel, "_weights", {})
    monkeypatch.setattr(resize_kernel, "_WEIGHTS_KEPT", 0)
    image = natural(150, 170, 9)
    for _ in range(3):
        assert np.array_equal(kernel_resize(image, 64, 80), torch_resize(image, 64, 80))
    assert resize_kernel._weights == {}
    assert resize_kernel.weights_for_sizes(np.array([40, 50]), 32) is None


@needs_kernel
def test_regions_applicable_says_what_resize_region_takes() -> None:
    image = natural(80, 80, 3)
    out = np.zeros((16, 16, 3), dtype=np.uint8)
    heights, widths = np.array([1, 2, 30, 32, 33, 5, 6, 40]), np.array([9, 9, 30, 32, 20, 5, 6, 33])
    applicable = resize_kernel.regions_applicable(heights, widths, 16, 16)
    for k, (height, width) in enumerate(zip(heights.tolist(), widths.tolist(), strict=True)):
        done = resize_kernel.resize_region(image.ctypes.data, image.strides[0], height, width, out.ctypes.data,
                                           out.strides[0], 16, 16)
        assert done == applicable[k], (height, width)


@needs_kernel
def test_weights_for_sizes_and_the_entry_point_for_native_callers() -> None:
    handles = resize_kernel.weights_for_sizes(np.array([30, 16, 30, 40]), 16)
    assert handles is not None and handles.dtype == np.uint64
    assert handles[1] == 0 and handles[0] == handles[2] != 0 and handles[3] not in (0, handles[0])
    assert resize_kernel.resize_entry() != 0
    assert resize_kernel.scratch_bytes(40, 16) >= 40 * 16 * 3
    resize_kernel.set_enabled(False)
    try:
        assert resize_kernel.weights_for_sizes(np.array([30]), 16) is None
        assert resize_kernel.resize_entry() == 0 and resize_kernel.scratch_bytes(40, 16) == 0
    finally:
        resize_kernel.set_enabled(True)
