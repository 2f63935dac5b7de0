"""A progressive JPEG of too many scans is refused before it is decoded, on every route: packing at
each check level and encoding, reading through each decoder and dataset path, ``verify --decode``
and the folder reader; one of exactly ``MAX_JPEG_SCANS`` scans goes through everywhere."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
from PIL import Image, ImageFile

import packload.packer.encode as encode
from packload import PackedImageFolder, PackLoader, pack
from packload.core.errors import PackFormatError, SkippedFileError
from packload.core.jpeg_scans import MAX_JPEG_SCANS, TooManyScansError
from packload.core.probe import open_image
from packload.core.scan import Sample
from packload.loaders.crop import CenterCrop
from packload.loaders.decode import decode_array, decode_pil
from packload.loaders.folder import FolderImages
from packload.loaders.random_crop import RandomResizedCrop
from packload.loaders.verify import verify
from packload.packer.encode import Encoded, EncodeOptions, Skipped, encode_data
from tests.image_factory import make_image_folder
from tests.jpeg_scan_factory import many_scan_jpeg
from tests.reliability.crafted import craft_pack
from tests.reliability.packs import cli

HOSTILE = many_scan_jpeg(MAX_JPEG_SCANS + 1)
MANY = many_scan_jpeg(5000)
LIMIT = many_scan_jpeg(MAX_JPEG_SCANS)
REASON = f"more than {MAX_JPEG_SCANS} scans"


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every decode of image data (libjpeg-turbo's and PIL's), by the size of what is decoded."""
    seen: list[int] = []
    real_sj, real_load = simplejpeg.decode_jpeg, ImageFile.ImageFile.load

    def sj(data: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(len(data))
        return real_sj(data, *args, **kwargs)

    def load(self: ImageFile.ImageFile) -> Any:
        seen.append(-1)
        return real_load(self)

    for module in (simplejpeg, encode.simplejpeg):
        monkeypatch.setattr(module, "decode_jpeg", sj)
    import packload.loaders.decode as decode

    monkeypatch.setattr(decode.simplejpeg, "decode_jpeg", sj)
    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return seen


OPTIONS = [EncodeOptions(), EncodeOptions(check="full"), EncodeOptions(encoding="jpeg"),
           EncodeOptions(encoding="png", check="full"), EncodeOptions(encoding="raw", size=(16, 16)),
           EncodeOptions(encoding="jpeg", max_side=32, max_pixels=10**9)]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: f"{o.encoding}-{o.check}")
@pytest.mark.parametrize("data", [HOSTILE, MANY], ids=["501", "5000"])
def test_pack_refuses_before_decoding(options: EncodeOptions, data: bytes, decodes: list[int]) -> None:
    got = encode_data(Sample("a/x.jpg", 0), data, options)
    assert isinstance(got, Skipped) and REASON in got.reason and "\n" not in got.reason
    assert decodes == []  # nothing decoded it


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: f"{o.encoding}-{o.check}")
def test_pack_takes_the_boundary(options: EncodeOptions) -> None:
    got = encode_data(Sample("a/x.jpg", 0), LIMIT, options)
    assert isinstance(got, Encoded), got


def _source(root: Path) -> Path:
    make_image_folder(root, classes=("a", "b"), per_class=2)
    (root / "a" / "scans.jpg").write_bytes(HOSTILE)
    (root / "b" / "many.jpeg").write_bytes(MANY)
    (root / "b" / "limit.jpg").write_bytes(LIMIT)
    return root


@pytest.mark.parametrize("check", ["fast", "full"])
@pytest.mark.parametrize("dst", ["p.shards", "p.lmdb"])
def test_pack_lists_it_as_skipped(tmp_path: Path, check: str, dst: str) -> None:
    source = _source(tmp_path / "src")
    summary = pack(source, tmp_path / dst, options=EncodeOptions(check=check), workers=1, progress=False)
    manifest = PackedImageFolder(tmp_path / dst).reader().manifest
    skipped = {item["path"]: item["reason"] for item in manifest["skipped"]}
    assert set(skipped) == {"a/scans.jpg", "b/many.jpeg"} and all(REASON in r for r in skipped.values())
    assert summary["records"] == 5  # the boundary file among them
    ds = PackedImageFolder(tmp_path / dst, output="numpy")
    names = [path for path, _ in ds.relative_samples]
    assert "b/limit.jpg" in names
    assert ds[names.index("b/limit.jpg")][0].shape == (64, 64, 3)


def test_pack_strict_and_cli(tmp_path: Path) -> None:
    source = _source(tmp_path / "src")
    with pytest.raises(SkippedFileError, match="scans"):
        pack(source, tmp_path / "strict.shards", strict=True, workers=1, progress=False)
    code, err = cli(["pack", str(source), str(tmp_path / "s.shards"), "--strict", "--quiet"])
    assert code != 0 and "scans" in err and "Traceback" not in err
    code, err = cli(["pack", str(source), str(tmp_path / "c.shards"), "--check", "full", "--quiet"])
    assert code == 0
    manifest = json.loads((tmp_path / "c.shards" / "manifest.json").read_text())
    assert {s["path"] for s in manifest["skipped"]} == {"a/scans.jpg", "b/many.jpeg"}


@pytest.mark.parametrize("fast_jpeg", [True, False])
def test_decoders_refuse_before_decoding(fast_jpeg: bool, decodes: list[int]) -> None:
    for data in (HOSTILE, MANY, memoryview(MANY)):
        with pytest.raises(TooManyScansError, match=REASON):
            decode_array(data, "JPEG", "RGB", 64, 64, fast_jpeg=fast_jpeg)
        with pytest.raises(TooManyScansError, match=REASON):
            decode_array(data, "PNG", "RGB", 64, 64, (32, 32), fast_jpeg=fast_jpeg)  # the stored format lies
        with pytest.raises(TooManyScansError, match=REASON):
            decode_pil(data, "JPEG", 64, 64)
        with pytest.raises(TooManyScansError, match=REASON):
            open_image(data)
    assert decodes == []
    assert decode_array(LIMIT, "JPEG", "RGB", 64, 64, fast_jpeg=fast_jpeg).shape == (64, 64, 3)


@pytest.fixture(params=["p.shards", "p.lmdb"])
def crafted(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A pack holding the hostile JPEG as a record (as a pack from elsewhere could)."""
    from tests.reliability.crafted import jpeg_bytes

    items = [("a/ok.jpg", 0, jpeg_bytes((64, 64))), ("a/scans.jpg", 0, MANY), ("a/limit.jpg", 0, LIMIT),
             ("a/ok2.jpg", 0, jpeg_bytes((64, 64), seed=3))]
    return craft_pack(tmp_path / request.param, items)


@pytest.mark.parametrize("output", ["pil", "numpy", "tensor"])
def test_dataset_names_the_record(crafted: Path, output: str, decodes: list[int]) -> None:
    ds = PackedImageFolder(crafted, output=output, decode_size=(32, 32) if output == "numpy" else None)
    with pytest.raises(PackFormatError, match=r"record 1 \(a/scans\.jpg\).*more than 500 scans") as info:
        ds[1]
    assert "\n" not in str(info.value)
    assert len(decodes) == 0
    ds[2]  # the boundary record decodes
    skipping = PackedImageFolder(crafted, output=output, on_error="skip")
    with pytest.warns(UserWarning, match="scans"):
        image, _ = skipping[1]
    assert np.asarray(image).size > 0


@pytest.mark.parametrize("crop", [CenterCrop(32), RandomResizedCrop(32)])
def test_batches_name_the_record(crafted: Path, crop: Any) -> None:
    ds = PackedImageFolder(crafted)
    with pytest.raises(PackFormatError, match=r"a/scans\.jpg.*more than 500 scans"):
        ds.get_batch([0, 1, 2], crop=crop)
    with pytest.raises(PackFormatError, match=r"a/scans\.jpg.*more than 500 scans"):
        list(PackLoader(ds, 4, crop=crop, threads=0))
    assert ds.get_batch([0, 2, 3], crop=crop)[0].shape == (3, 3, 32, 32)


def test_verify_decode_names_it(crafted: Path) -> None:
    report = verify(crafted, decode=True, progress=False)
    assert not report["ok"]
    assert [(bad["path"], REASON in bad["problem"]) for bad in report["bad_records"]] == [("a/scans.jpg", True)]
    code, err = cli(["verify", "--decode", "--quiet", str(crafted)])
    assert code != 0 and "Traceback" not in err


def test_folder_reader_names_the_file(tmp_path: Path) -> None:
    source = _source(tmp_path / "src")
    folder = FolderImages(source)
    paths = [Path(p).name for p, _ in folder.samples]
    with pytest.raises(TooManyScansError, match=r"scans\.jpg: progressive JPEG with more than 500 scans"):
        folder[paths.index("scans.jpg")]
    image, _ = folder[paths.index("limit.jpg")]
    assert image.size == (64, 64)


def test_ordinary_jpegs_are_untouched() -> None:
    """Baseline, progressive, greyscale, CMYK and restart-marker JPEGs decode as before."""
    from tests.image_factory import textured_rgb

    rgb = Image.fromarray(textured_rgb((40, 30), 2))
    for image, save in ((rgb, {}), (rgb, {"progressive": True}), (rgb.convert("L"), {"progressive": True}),
                        (rgb.convert("CMYK"), {}), (rgb, {"restart_marker_blocks": 1})):
        out = io.BytesIO()
        image.save(out, "JPEG", **save)
        data = out.getvalue()
        assert isinstance(encode_data(Sample("a/x.jpg", 0), data, EncodeOptions(check="full")), Encoded)
        want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert np.abs(decode_array(data, "JPEG", image.mode, 40, 30, fast_jpeg=False).astype(int) - want).max() == 0
