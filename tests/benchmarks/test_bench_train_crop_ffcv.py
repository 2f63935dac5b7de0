"""Smoke tests of benchmarks/bench_train_crop_ffcv.py on a few tiny images (no timings asserted);
the FFCV contender only where FFCV is installed (the peers venv)."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_train_crop_ffcv as bench
from benchmarks import ffcv_peer
from tests.image_factory import write_image

needs_ffcv = pytest.mark.skipif(ffcv_peer.unavailable() is not None, reason="FFCV not installed")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-crop-src")
    for k in range(12):
        write_image(root / f"c{k % 3}" / f"img_{k:02d}.jpg", size=(60 + 7 * k, 48 + 5 * (k % 4)), seed=k,
                    quality=90)
    return root


def _run(source, tmp_path, *extra):
    out = tmp_path / "out"
    assert bench.main(["--data", str(source), "--out", str(out), "--rounds", "2", "--epochs", "1",
                       "--batch-size", "4", "--threads", "1", *extra]) == 0
    results = json.loads((out / "train-crop.json").read_text())
    assert "images/s, median [min–max]" in (out / "train-crop.md").read_text()
    return results


def test_runs_without_ffcv_and_reports_ratios(source, tmp_path):
    results = _run(source, tmp_path, "--loaders", "packloader,dropin-pil", "--limit", "9")
    assert [case["case"] for case in results["cases"]] == ["jpeg", "raw"]
    assert results["limit"] == 9 and results["rounds"] == 2
    for case in results["cases"]:
        assert case["images"] == 9
        assert set(case["loaders"]) == {"packloader", "dropin-pil"}
        assert set(case["writes"]) == {"packload"}
        for name, entry in case["loaders"].items():
            assert entry["images_per_s"]["n"] == 2
            assert all(run["batch_shape"][1:] == [3, 224, 224] for run in entry["runs"]), name
            assert "ratio_to_ffcv" not in entry
        assert case["loaders"]["dropin-pil"]["ratio_to_dropin-pil"]["median"] == pytest.approx(1.0)


def test_a_keep_pack_against_whole_image_decoding(source, tmp_path):
    results = _run(source, tmp_path, "--cases", "keep", "--loaders", "packloader,packloader-whole,ffcv",
                   "--limit", "9")
    (case,) = results["cases"]
    assert case["case"] == "keep" and case["images"] == 9 and case["pack"].endswith("imagenet-keep.shards")
    assert set(case["loaders"]) == {"packloader", "packloader-whole"}, "FFCV has no keep pack"
    assert set(case["writes"]) == {"packload"}
    ratio = case["loaders"]["packloader"]["ratio_to_packloader-whole"]
    assert ratio["n"] == 2 and ratio["median"] > 0
    assert "whole-image decoding" in bench.markdown(results)


def test_rejects_unknown_names(source, tmp_path):
    assert bench.main(["--data", str(source), "--out", str(tmp_path), "--loaders", "dali"]) == 2


@needs_ffcv
def test_ffcv_contender(source, tmp_path):
    results = _run(source, tmp_path, "--cases", "jpeg", "--loaders", "packloader,ffcv")
    (case,) = results["cases"]
    assert set(case["writes"]) == {"packload", "ffcv"}
    assert case["loaders"]["ffcv"]["runs"][0]["batch_shape"] == [4, 3, 224, 224]
    assert case["loaders"]["ffcv"]["ratio_to_ffcv"]["median"] == pytest.approx(1.0)
    assert case["images"] == 12


def test_center_crop_reuses_the_packs(source, tmp_path):
    work = tmp_path / "work"
    _run(source, tmp_path, "--cases", "jpeg", "--loaders", "packloader,dropin-pil", "--work", str(work))
    results = _run(source, tmp_path, "--cases", "jpeg", "--loaders", "packloader,dropin-pil", "--work", str(work),
                   "--crop", "center", "--reuse")
    (case,) = results["cases"]
    assert results["crop"] == "center" and case["writes"] == {}
    for entry in case["loaders"].values():
        assert all(run["batch_shape"][1:] == [3, 224, 224] for run in entry["runs"])
    assert "packload PackLoader CenterCrop" in (tmp_path / "out" / "train-crop.md").read_text()


def test_rejects_unknown_crop(source, tmp_path):
    with pytest.raises(SystemExit):
        bench.main(["--data", str(source), "--out", str(tmp_path), "--crop", "corner"])


@needs_ffcv
def test_ffcv_center_crop(source, tmp_path):
    results = _run(source, tmp_path, "--cases", "jpeg", "--loaders", "packloader,ffcv", "--crop", "center")
    (case,) = results["cases"]
    assert case["loaders"]["ffcv"]["runs"][0]["batch_shape"] == [4, 3, 224, 224]
    assert case["loaders"]["packloader"]["ratio_to_ffcv"]["n"] == 2
