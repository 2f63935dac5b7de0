"""Tests for packload.packer.synthetic, benchmarks/make_images.py and the tests/image_factory helpers."""

from __future__ import annotations

import importlib.util
import itertools
import os
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image, ImageOps, UnidentifiedImageError

from packload.packer.synthetic import make_cifar_like, make_imagenet_like
from tests.image_factory import (
    make_image_folder,
    write_broken_files,
    write_hidden_and_stray,
    write_image,
    write_odd_images,
)

REPO = Path(__file__).resolve().parents[2]
CLI_PATH = REPO / "benchmarks" / "make_images.py"

IMAGENET_COUNT, IMAGENET_CLASSES, IMAGENET_SEED = 60, 7, 3


def _tree(root: Path) -> dict[str, bytes]:
    """Relative path -> bytes of every file under ``root``."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _neighbour_correlation(arr: np.ndarray) -> float:
    """Correlation of horizontally adjacent grey pixels: ~0 for white noise, near 1 for photos."""
    grey = arr.astype(np.float64).mean(axis=2)
    a, b = grey[:, :-1].ravel(), grey[:, 1:].ravel()
    return float(np.corrcoef(a, b)[0, 1])


@pytest.fixture(scope="module")
def imagenet_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("imagenet") / "data"
    files = make_imagenet_like(
        out, count=IMAGENET_COUNT, classes=IMAGENET_CLASSES, seed=IMAGENET_SEED, workers=1, progress=False
    )
    return out, files


# --------------------------------------------------------------------------- make_imagenet_like


def test_imagenet_like_is_a_balanced_image_folder(imagenet_tree: tuple[Path, list[Path]]) -> None:
    out, files = imagenet_tree
    on_disk = sorted(p for p in out.rglob("*") if p.is_file())
    assert files == on_disk
    assert len(files) == IMAGENET_COUNT
    class_dirs = sorted(p.name for p in out.iterdir())
    assert class_dirs == [f"n{c:02d}" for c in range(IMAGENET_CLASSES)]
    per_class = [len(list((out / c).iterdir())) for c in class_dirs]
    assert max(per_class) - min(per_class) <= 1 and min(per_class) >= 1
    assert all(p.suffix == ".jpg" and p.parent.parent == out for p in files)


def test_imagenet_like_images_decode_and_meet_the_spec(imagenet_tree: tuple[Path, list[Path]]) -> None:
    _, files = imagenet_tree
    sizes, qtables, correlations, stds = set(), set(), [], []
    for path in files:
        with Image.open(path) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            im.load()  # full decode: raises on a truncated or corrupt file
            w, h = im.size
            assert 200 <= w <= 500 and 200 <= h <= 500
            sizes.add((w, h))
            qtables.add(tuple(im.quantization[0]))
            arr = np.asarray(im)
        correlations.append(_neighbour_correlation(arr))
        stds.append(float(arr.std()))
    assert len(sizes) > IMAGENET_COUNT // 2, "image sizes should vary"
    assert sum(w != h for w, h in sizes) > len(sizes) // 2, "aspect ratios should vary"
    assert len(qtables) >= 5, "JPEG quality should vary per image"
    # Textured (not flat) yet spatially smooth (not white noise).
    assert min(stds) > 10
    assert np.median(correlations) > 0.8


def test_imagenet_like_file_sizes_are_photo_like(imagenet_tree: tuple[Path, list[Path]]) -> None:
    _, files = imagenet_tree
    mean_kb = np.mean([p.stat().st_size for p in files]) / 1024
    assert 15 < mean_kb < 70, f"mean JPEG size {mean_kb:.1f} KB"


def test_imagenet_like_classes_look_different(imagenet_tree: tuple[Path, list[Path]]) -> None:
    out, files = imagenet_tree
    means: dict[str, list[np.ndarray]] = {}
    for path in files:
        with Image.open(path) as im:
            means.setdefault(path.parent.name, []).append(
                np.asarray(im.reduce(8), dtype=np.float64).mean((0, 1))
            )
    class_means = [np.mean(v, axis=0) for v in means.values()]
    spread = max(np.linalg.norm(a - b) for a, b in itertools.combinations(class_means, 2))
    assert spread > 30, "class palettes should differ"


def test_imagenet_like_is_deterministic_and_independent_of_workers(
    imagenet_tree: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    out, _ = imagenet_tree
    again = make_imagenet_like(
        tmp_path / "w2",
        count=IMAGENET_COUNT,
        classes=IMAGENET_CLASSES,
        seed=IMAGENET_SEED,
        workers=2,
        progress=False,
    )
    assert len(again) == IMAGENET_COUNT
    assert _tree(tmp_path / "w2") == _tree(out)

    other_seed = make_imagenet_like(
        tmp_path / "s4", count=5, classes=IMAGENET_CLASSES, seed=4, progress=False
    )
    first_five = {p.relative_to(out).as_posix() for p in sorted(out.rglob("*.jpg"))}
    for p in other_seed:
        rel = p.relative_to(tmp_path / "s4").as_posix()
        assert rel in first_five  # same names for the same index...
        assert p.read_bytes() != (out / rel).read_bytes()  # ...but different content


# --------------------------------------------------------------------------- make_cifar_like


def test_cifar_like_tree_decodes_and_is_textured(tmp_path: Path) -> None:
    files = make_cifar_like(tmp_path / "c", count=50, classes=10, seed=1, workers=1, progress=False)
    assert files == sorted((tmp_path / "c").rglob("*.png")) and len(files) == 50
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [f"n{c:02d}" for c in range(10)]
    assert all(len(list((tmp_path / "c" / f"n{c:02d}").iterdir())) == 5 for c in range(10))
    digests = set()
    for path in files:
        with Image.open(path) as im:
            assert (im.format, im.mode, im.size) == ("PNG", "RGB", (32, 32))
            arr = np.asarray(im)
        assert arr.std() > 5 and len(np.unique(arr.reshape(-1, 3), axis=0)) > 100
        digests.add(arr.tobytes())
    assert len(digests) == 50


def test_cifar_like_is_deterministic_and_independent_of_workers(tmp_path: Path) -> None:
    make_cifar_like(tmp_path / "a", count=40, classes=3, seed=9, workers=1, progress=False)
    make_cifar_like(tmp_path / "b", count=40, classes=3, seed=9, workers=2, progress=False)
    make_cifar_like(tmp_path / "c", count=40, classes=3, seed=10, workers=1, progress=False)
    a, b, c = _tree(tmp_path / "a"), _tree(tmp_path / "b"), _tree(tmp_path / "c")
    assert a == b
    assert a.keys() == c.keys() and all(a[k] != c[k] for k in a)


def test_fewer_images_than_classes_leaves_no_empty_class(tmp_path: Path) -> None:
    files = make_cifar_like(tmp_path / "c", count=3, classes=5, workers=1, progress=False)
    assert [p.parent.name for p in files] == ["n00", "n01", "n02"]
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["n00", "n01", "n02"]


def test_class_names_sort_in_class_order_beyond_100_classes(tmp_path: Path) -> None:
    files = make_cifar_like(tmp_path / "c", count=120, classes=120, workers=1, progress=False)
    names = [p.parent.name for p in files]
    assert names == sorted(names) == [f"n{c:03d}" for c in range(120)]


@pytest.mark.parametrize("make", [make_imagenet_like, make_cifar_like])
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"count": 0}, "count"),
        ({"count": -5}, "count"),
        ({"classes": 0}, "classes"),
        ({"workers": 0}, "workers"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_arguments_are_refused(make, kwargs: dict[str, int], message: str, tmp_path: Path) -> None:
    args = {"count": 2, "classes": 1, "progress": False, **kwargs}
    with pytest.raises(ValueError, match=message):
        make(tmp_path / "x", **args)
    assert not (tmp_path / "x").exists(), "nothing should be written for bad arguments"


def test_progress_bar_only_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_cifar_like(tmp_path / "q", count=2, classes=1, workers=1, progress=False)
    assert capsys.readouterr().err == ""
    make_cifar_like(tmp_path / "p", count=2, classes=1, workers=1, progress=True)
    assert "2/2" in capsys.readouterr().err


# --------------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def cli() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_images_cli", CLI_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_writes_summarises_and_refuses_non_empty_out(
    cli: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["cifar", str(out), "--count", "12", "--classes", "3", "--seed", "2", "--workers", "1", "--quiet"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    summary = captured.out.strip().splitlines()
    assert len(summary) == 1 and "12 files" in summary[0] and "MB" in summary[0] and "KB" in summary[0]
    first = _tree(out)
    assert len(first) == 12 and {k.split("/")[0] for k in first} == {"n00", "n01", "n02"}

    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and "not empty" in captured.err

    assert cli.main([*argv, "--overwrite"]) == 0
    assert _tree(out) == first


def test_cli_imagenet_and_errors(cli: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["imagenet", str(tmp_path / "in"), "--count", "3", "--classes", "2", "--quiet"]) == 0
    assert "3 files in 2 classes" in capsys.readouterr().out
    assert len(list((tmp_path / "in").rglob("*.jpg"))) == 3

    assert cli.main(["cifar", str(tmp_path / "bad"), "--count", "0", "--quiet"]) == 2
    assert "count must be >= 1" in capsys.readouterr().err

    (tmp_path / "file").write_text("x")
    assert cli.main(["cifar", str(tmp_path / "file"), "--count", "1", "--quiet"]) == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["svhn", str(tmp_path / "x")])
    assert exc.value.code == 2


def test_cli_runs_as_a_script_from_anywhere(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [
            sys.executable,
            str(CLI_PATH),
            "cifar",
            str(tmp_path / "o"),
            "--count",
            "4",
            "--classes",
            "2",
            "--quiet",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "4 files" in proc.stdout
    assert len(list((tmp_path / "o").rglob("*.png"))) == 4


# --------------------------------------------------------------------------- image_factory


def test_write_image_infers_format_and_is_deterministic(tmp_path: Path) -> None:
    for name, fmt in [("a.jpg", "JPEG"), ("b.png", "PNG"), ("c.webp", "WEBP"), ("d.JPEG", "JPEG")]:
        path = write_image(tmp_path / "deep" / "dir" / name, size=(30, 20))
        with Image.open(path) as im:
            assert (im.format, im.size, im.mode) == (fmt, (30, 20), "RGB")
            assert np.asarray(im).std() > 5
    p1 = write_image(tmp_path / "s1.png", seed=1)
    p1b = write_image(tmp_path / "s1b.png", seed=1)
    p2 = write_image(tmp_path / "s2.png", seed=2)
    assert p1.read_bytes() == p1b.read_bytes() != p2.read_bytes()

    path = write_image(tmp_path / "e.bin", fmt="PNG", mode="L")
    with Image.open(path) as im:
        assert (im.format, im.mode) == ("PNG", "L")
    with pytest.raises(ValueError, match="suffix"):
        write_image(tmp_path / "f.unknownext")


def test_make_image_folder_mixes_formats(tmp_path: Path) -> None:
    files = make_image_folder(tmp_path / "ds", classes=("a", "b", "c"), per_class=3, seed=5)
    assert files == sorted(files) == sorted((tmp_path / "ds").rglob("*.*"))
    assert len(files) == 9
    for cls in ("a", "b", "c"):
        assert {p.suffix for p in files if p.parent.name == cls} == {".jpg", ".png"}
    for p in files:
        with Image.open(p) as im:
            im.load()
    assert len({p.read_bytes() for p in files}) == 9


def test_odd_images_all_open_and_convert(tmp_path: Path) -> None:
    files = write_odd_images(tmp_path / "odd")
    assert files == sorted(files) and all(p.parent == tmp_path / "odd" for p in files)
    by_name = {p.name: p for p in files}
    for name in ("UPPER.JPG", "café ünï.png", "with space.jpg", "-dash.png"):
        assert name in by_name
    expected = {
        "palette.png": ("PNG", "P"),
        "palette_transparent.png": ("PNG", "P"),
        "rgba.png": ("PNG", "RGBA"),
        "la.png": ("PNG", "LA"),
        "gray16.png": ("PNG", "I;16"),
        "gray.jpg": ("JPEG", "L"),
        "cmyk.jpg": ("JPEG", "CMYK"),
        "image.bmp": ("BMP", "RGB"),
        "image.tiff": ("TIFF", "RGB"),
        "image.webp": ("WEBP", "RGB"),
        "image.ppm": ("PPM", "RGB"),
        "image.pgm": ("PPM", "L"),
        "animated.png": ("PNG", "RGB"),
        "UPPER.JPG": ("JPEG", "RGB"),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. PIL's palette-transparency warning would fail here
        for path in files:
            with Image.open(path) as im:
                if path.name in expected:
                    assert (im.format, im.mode) == expected[path.name], path.name
                rgb = im.convert("RGB")
                assert rgb.size == im.size and np.asarray(rgb).std() > 3, path.name
    with Image.open(by_name["palette_transparent.png"]) as im:
        assert "transparency" in im.info
    with Image.open(by_name["rgba.png"]) as im:
        assert im.getextrema()[3] == (0, 255)
    with Image.open(by_name["gray16.png"]) as im:
        assert im.getextrema()[1] > 255, "16-bit PNG should use values above 255"
    with Image.open(by_name["animated.png"]) as im:
        assert im.n_frames == 3 and im.is_animated
    with Image.open(by_name["exif_rotated.jpg"]) as im:
        assert im.size == (48, 32) and im.getexif()[0x0112] == 6
        assert ImageOps.exif_transpose(im).size == (32, 48)


def test_broken_files_fail_the_expected_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "cls"
    kinds = write_broken_files(d)
    assert sorted(kinds.values()) == sorted(
        ["truncated_jpeg", "truncated_png", "empty", "not_an_image", "decompression_bomb"]
    )
    assert {p.name for p in d.iterdir()} == set(kinds)
    by_kind = {kind: d / name for name, kind in kinds.items()}

    for kind, fmt, end in [("truncated_jpeg", "JPEG", b"\xff\xd9"), ("truncated_png", "PNG", b"IEND")]:
        data = by_kind[kind].read_bytes()
        assert len(data) > 500 and end not in data
        with Image.open(by_kind[kind]) as im:  # the header is valid...
            assert im.format == fmt
            with pytest.raises(OSError, match="truncated"):  # ...but the pixels are not all there
                im.load()

    assert by_kind["empty"].stat().st_size == 0 and by_kind["empty"].suffix == ".jpg"
    for kind in ("empty", "not_an_image"):
        with pytest.raises(UnidentifiedImageError):
            Image.open(by_kind[kind])

    bomb = by_kind["decompression_bomb"]
    assert bomb.stat().st_size < 200
    with pytest.raises(Image.DecompressionBombError):
        Image.open(bomb)
    # With the limit lifted the header parses: the error above is the bomb check, not a bad file.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    with Image.open(bomb) as im:
        assert (im.format, im.size) == ("PNG", (30000, 30000))


def test_hidden_and_stray_files(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_image_folder(root, classes=("b_cls", "a_cls"))
    files = write_hidden_and_stray(root)
    rel = sorted(p.relative_to(root).as_posix() for p in files)
    assert rel == [".cache/x.jpg", "a_cls/.cache/x.jpg", "a_cls/.hidden.jpg", "a_cls/notes.txt", "stray.jpg"]
    for p in files:
        if p.suffix == ".jpg":
            with Image.open(p) as im:
                im.load()  # real images: a packer must skip them for their place or name

    fresh = write_hidden_and_stray(tmp_path / "empty_root")
    assert (tmp_path / "empty_root" / "cat" / ".hidden.jpg") in fresh
