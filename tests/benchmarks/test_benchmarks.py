"""The benchmark suite's own code, at a tiny scale and without the peers (benchmarks/).

Statistics and interleaving on synthetic timings, honest eviction reports, peers that are missing or
fail being reported with their reason, and the whole ``benchmarks/run.py`` end to end on a few
hundred generated images.
"""

from __future__ import annotations

import json
import mmap
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import bench_pack, bench_read, cache, harness, run  # noqa: E402
from packload.packer.synthetic import make_cifar_like, make_imagenet_like  # noqa: E402

# ---------------------------------------------------------------- harness statistics


def test_summarize_matches_numpy() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 100.0, 3.0]
    s = harness.summarize(values)
    assert s["n"] == 6
    assert s["median"] == pytest.approx(np.median(values))
    assert (s["min"], s["max"]) == (1.0, 100.0)
    assert s["q1"] == pytest.approx(np.percentile(values, 25))
    assert s["q3"] == pytest.approx(np.percentile(values, 75))
    assert s["iqr"] == pytest.approx(s["q3"] - s["q1"])
    assert s["rel_spread"] == pytest.approx(99.0 / 3.5)
    assert harness.summarize([7.0]) == {"n": 1, "median": 7.0, "min": 7.0, "max": 7.0, "q1": 7.0, "q3": 7.0,
                                        "iqr": 0.0, "rel_spread": 0.0}
    with pytest.raises(ValueError):
        harness.summarize([])


def test_ratio_directions() -> None:
    assert harness.ratio(300.0, 100.0) == pytest.approx(3.0)
    assert harness.ratio(2.0, 4.0, higher_is_better=False) == pytest.approx(2.0)  # half the time: 2x better
    assert harness.ratio(None, 1.0) is None
    assert harness.ratio(1.0, 0.0) is None


def test_run_grid_interleaves_warms_up_and_reports_failures() -> None:
    calls: list[str] = []
    timings = {"A": iter([999.0, 10.0, 30.0, 20.0]), "B": iter([1.0, 5.0, 6.0, 4.0])}

    def case(name: str) -> harness.Case:
        def go() -> dict[str, Any]:
            calls.append(name)
            return {"rate": next(timings[name])}

        return harness.Case(name, go, "rate", setup=lambda: {"prepared": name})

    def broken() -> dict[str, Any]:
        calls.append("C")
        raise RuntimeError("boom")

    cases = [case("A"), case("B"), harness.Case("C", broken, "rate"),
             harness.Case("D", dict, "rate", skip_reason="not installed")]
    results = harness.run_grid(cases, repeats=3, warmup=1)
    assert calls == ["A", "B", "C", "A", "B", "A", "B", "A", "B"]  # warm-up round, then A B A B A B
    by = {r["name"]: r for r in results}
    assert by["A"]["stats"]["median"] == 20.0  # the 999 warm-up is not counted
    assert (by["A"]["stats"]["min"], by["A"]["stats"]["max"]) == (10.0, 30.0)
    assert by["B"]["stats"]["median"] == 5.0
    assert len(by["A"]["runs"]) == 3 and len(by["A"]["warmup_runs"]) == 1
    assert by["A"]["runs"][0]["setup"] == {"prepared": "A"}
    assert "peak_rss_mb" in by["A"]["runs"][0] and "rss_method" in by["A"]["runs"][0]
    assert by["C"]["stats"] is None and "RuntimeError: boom" in by["C"]["error"]
    assert by["D"]["stats"] is None and by["D"]["skipped"] == "not installed"
    harness.add_ratios(results, "B", key="vs_b")
    assert by["A"]["vs_b"] == pytest.approx(4.0) and by["B"]["vs_b"] == pytest.approx(1.0)
    assert by["C"]["vs_b"] is None
    assert harness.best_of(results)["name"] == "A"
    assert harness.best_of(results, ["B", "C"])["name"] == "B"


# ---------------------------------------------------------------- eviction


def _touch(path: Path, size: int = 1 << 20) -> None:
    path.write_bytes(np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes())
    path.read_bytes()


def test_eviction_is_checked_and_reported_honestly(tmp_path: Path) -> None:
    if cache.supported() is not None:
        report = cache.evict_checked([tmp_path])
        assert report["evicted"] is False and "cannot evict" in report["note"]
        return
    _touch(tmp_path / "a.bin")
    (tmp_path / "sub").mkdir()
    _touch(tmp_path / "sub" / "b.bin")
    assert cache.residency([tmp_path])["files"] == 2
    report = cache.evict_checked([tmp_path])
    assert report["files"] == 2
    assert report["resident_before"] > 0.5  # just written and read
    assert report["evicted"] == (report["resident_after"] < cache.EVICTED_BELOW)
    if not report["evicted"]:  # e.g. a tmpfs: said, not hidden
        assert "NOT cold" in report["note"]
    warmed = cache.warm([tmp_path])
    assert warmed["resident_fraction"] > 0.5


def test_eviction_failure_is_reported_when_pages_are_mapped(tmp_path: Path) -> None:
    if cache.supported() is not None:
        pytest.skip(cache.supported())
    path = tmp_path / "mapped.bin"
    _touch(path)
    data = path.read_bytes()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        first_bytes = bytes(m[i] for i in range(0, len(m), mmap.PAGESIZE))  # faults every page in
        assert first_bytes == data[:: mmap.PAGESIZE]
        report = cache.evict_checked([path])
    assert report["evicted"] is False
    assert "NOT cold" in report["note"]


# ---------------------------------------------------------------- peers reported, never dropped


class _MissingPeer:
    name = "missing"

    def unavailable(self) -> str | None:
        return "not installed (fake)"

    def write(self, samples: Any, out: Path) -> None:  # pragma: no cover - never called
        raise AssertionError("an unavailable peer must not be run")

    def dataset(self, out: Path, decode: Any) -> Any:  # pragma: no cover - never called
        raise AssertionError("an unavailable peer must not be run")


class _BrokenPeer(_MissingPeer):
    name = "broken"

    def unavailable(self) -> str | None:
        return None

    def write(self, samples: Any, out: Path) -> None:
        raise RuntimeError("fake writer crashed")


FAKE_PEERS = {"webdataset": _MissingPeer, "litdata": _BrokenPeer}  # streaming: no adapter at all


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    root = tmp_path_factory.mktemp("bench-data")
    make_imagenet_like(root / "imagenet-80", count=80, classes=4, seed=0, workers=1, progress=False)
    make_cifar_like(root / "cifar-200", count=200, classes=4, seed=0, workers=1, progress=False)
    return {"imagenet": (root / "imagenet-80", "jpeg"), "cifar": (root / "cifar-200", "png")}


def test_pack_reports_missing_and_failing_peers(data: dict[str, tuple[Path, str]], tmp_path: Path) -> None:
    result = bench_pack.run({"cifar": data["cifar"]}, tmp_path, repeats=1, warmup=0, workers=1,
                            peer_factories=FAKE_PEERS, log=None)
    by = {r["name"]: r for r in result["datasets"]["cifar"]["results"]}
    assert set(by) == {"packload lmdb keep", "packload shards keep", "packload lmdb raw", "tar -cf",
                       "webdataset", "litdata", "streaming"}
    assert by["webdataset"]["skipped"] == "not installed (fake)"
    assert "fake writer crashed" in by["litdata"]["error"]
    assert by["streaming"]["skipped"] == "no adapter"
    keep = by["packload lmdb keep"]
    assert keep["stats"]["median"] > 0 and keep["medians"]["out_bytes"] > 0
    if by["tar -cf"].get("stats"):
        assert keep["vs_tar"] > 0 and "meets_tar_target" in keep
    text = bench_pack.markdown(result)
    assert "not run: not installed (fake)" in text and "FAILED: RuntimeError: fake writer crashed" in text


def test_read_reports_missing_and_failing_peers(data: dict[str, tuple[Path, str]], tmp_path: Path) -> None:
    result = bench_read.run({"imagenet": data["imagenet"]}, tmp_path, repeats=1, warmup=0, workers=(0,),
                            batch_size=16, budgets={"decoded+crop224": 32}, cold=False,
                            peer_factories=FAKE_PEERS, log=None)
    warm = result["datasets"]["imagenet"]["modes"]["decoded+crop224"]["warm"]["results"]
    by = {r["name"]: r for r in warm}
    assert by["webdataset"]["skipped"] == "not installed (fake)"
    assert "fake writer crashed" in by["litdata"]["skipped"]
    assert by["streaming"]["skipped"] == "no adapter"
    for name in ("packload lmdb", "packload shards", "packload lmdb, decode_size 224", bench_read.BASELINE,
                 "files + packload codec"):
        assert by[name]["stats"]["median"] > 0, name
        assert by[name]["medians"]["samples"] == 32
    assert by[bench_read.BASELINE]["vs_baseline"] == pytest.approx(1.0)
    assert by["packload lmdb"]["vs_best_peer"] is None  # no peer ran


def test_decoders_agree_with_pil(data: dict[str, tuple[Path, str]]) -> None:
    from PIL import Image

    jpeg = next(data["imagenet"][0].rglob("*.jpg"))
    pixels = bench_read.decode_rgb(jpeg.read_bytes())
    reference = np.asarray(Image.open(jpeg).convert("RGB"))
    assert pixels.shape == reference.shape and pixels.dtype == np.uint8
    assert np.abs(pixels.astype(int) - reference).mean() < 3  # libjpeg-turbo vs PIL: near identical
    assert bench_read.decode_crop(jpeg.read_bytes()).shape == (224, 224, 3)
    png = next(data["cifar"][0].rglob("*.png"))
    assert np.array_equal(bench_read.decode_rgb(png.read_bytes()), np.asarray(Image.open(png).convert("RGB")))


# ---------------------------------------------------------------- the whole command


@pytest.mark.long
def test_run_end_to_end_without_peers(data: dict[str, tuple[Path, str]], tmp_path: Path) -> None:
    root = data["imagenet"][0].parent
    out = tmp_path / "results"
    code = run.main(["--data", str(root), "--out", str(out), "--jpegs", "80", "--pngs", "200", "--no-peers",
                     "--repeats", "1", "--warmup", "0", "--workers", "0", "--batch-size", "16",
                     "--crop-samples", "32", "--decoded-samples", "64", "--bytes-samples", "64",
                     "--decode-seconds", "0.05", "--read-mb", "8"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results) >= {"machine", "pack", "read"}
    for part in ("machine", "pack", "read"):
        assert "--no-peers" in results[part]["meta"]["command"]
    describe = results["machine"]["describe"]
    assert describe["usable_cores"] >= 1 and describe["versions"]["torch"]
    limits = results["machine"]["limits"]
    assert limits["per_core"]["jpeg_decode_pil"] > 0 and limits["per_core"]["png_decode_pil"] > 0
    assert limits["cold_read"]["mb_per_s"] > 0 and "eviction" in limits["cold_read"]
    pack_names = {r["name"] for r in results["pack"]["data"]["datasets"]["imagenet"]["results"]}
    assert "packload lmdb jpeg max-side 256" in pack_names and "webdataset" in pack_names
    modes = results["read"]["data"]["datasets"]["cifar"]["modes"]
    assert set(modes) == {"bytes", "decoded"}
    cold = {r["name"]: r for r in modes["decoded"]["cold"]["results"]}
    raw = cold["packload lmdb raw"]
    assert raw["stats"]["median"] > 0
    evictions = [run_["setup"] for run_ in raw["runs"]]
    assert all("evicted" in e for e in evictions)
    assert raw["cold_verified"] == all(e["evicted"] for e in evictions)
    assert cold["webdataset"]["skipped"] == "peers not run (--no-peers)"

    text = (out / "results.md").read_text()
    for heading in ("## Machine", "## Machine limits", "## Pack", "## Read — warm cache", "## Read — cold cache",
                    "## num_workers sweep", "FFCV"):
        assert heading in text, heading
    assert "× baseline" in text and "× tar" in text and "not run: peers not run (--no-peers)" in text
    from benchmarks import plots

    if plots.available():
        assert (out / "pack.png").stat().st_size > 0 and (out / "read.png").stat().st_size > 0
        assert "![read](read.png)" in text

    # A part run alone is merged into the results already there.
    assert run.main(["--data", str(root), "--out", str(out), "--jpegs", "80", "--pngs", "200", "--only",
                     "machine", "--decode-seconds", "0.05", "--read-mb", "8"]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert set(merged) >= {"machine", "pack", "read"}
    assert "--only machine" in merged["machine"]["meta"]["command"]


def test_peak_rss_without_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness, "psutil", None)
    with harness.PeakRSS() as peak:
        _ = bytearray(1 << 20)
    figures = peak.figures()
    assert figures["peak_rss_mb"] > 0 and figures["rss_method"].startswith("getrusage")


def test_crown_writes_only_times_both_writers_and_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``bench_crown.py --writes-only``: each case written per round, outputs removed after timing;
    FFCV reported as not installed where it is missing (as in CI), with no ratio invented."""
    from benchmarks import bench_crown, ffcv_peer

    make_imagenet_like(tmp_path / "data" / "imagenet", count=12, classes=2, seed=1, workers=1, progress=False)
    make_cifar_like(tmp_path / "data" / "cifar", count=30, classes=3, seed=1, workers=1, progress=False)
    monkeypatch.setattr(ffcv_peer, "unavailable", lambda: "not installed (test)")
    out = tmp_path / "out"
    assert bench_crown.main(["--data", str(tmp_path / "data"), "--out", str(out), "--repeats", "2",
                             "--writes-only", "--cases", "cifar,raw"]) == 0
    results = json.loads((out / "crown-writes.json").read_text())
    assert results["ffcv"] == "not installed (test)"
    assert [w["name"] for w in results["writes"]] == ["cifar raw", "imagenet raw 256 → crop 224"]
    for written in results["writes"]:
        assert len(written["packload_s"]) == 2 and all(t > 0 for t in written["packload_s"])
        assert written["ffcv_s"] == [] and written["ratios"] == []
    assert not any((out / "work" / "writes").iterdir())  # every output removed once timed
    assert "| cifar raw |" in (out / "crown-writes.md").read_text()


# ---------------------------------------------------------------- the Ray listing benchmark


def test_ray_scan_benchmark_tree_and_comparison(tmp_path: Path) -> None:
    from benchmarks import bench_ray_scan
    from packload.core.scan import scan_folder

    bench_ray_scan.make_tree(tmp_path / "t", classes=3, per_class=11)
    scan = scan_folder(tmp_path / "t")
    assert scan.classes == ["c0000", "c0001", "c0002"] and len(scan.samples) == 33
    assert scan.samples[0].path == "c0000/00001.jpg" and scan.samples[9].path == "c0000/sub/00000.jpg"
    report = bench_ray_scan.compare(lambda: scan_folder(tmp_path / "t"), lambda: scan_folder(tmp_path / "t"), 2)
    assert report["files"] == 33 and report["serial_over_tasks"] > 0
    (tmp_path / "t" / "c0001" / "extra.jpg").write_bytes(b"x")
    with pytest.raises(AssertionError, match="differs from the serial scan"):  # a listing that differs is caught
        bench_ray_scan.compare(lambda: scan, lambda: scan_folder(tmp_path / "t"), 1)


def test_object_store_summary_compares_each_reader_at_its_best():
    """bench_object_store: each reader's best over rounds and worker counts, then the ratios."""
    from benchmarks import bench_object_store

    def row(rate, workers, first=0.5):
        return {"images_per_s": rate, "workers": workers, "first_batch_s": first, "requests": 40}

    rows = {"packload bytes cold": [row(300, 0), row(200, 2)],
            "litdata bytes cold": [row(100, 0), row(150, 2)],
            "streaming bytes cold": [row(60, 2)],
            "packload bytes second epoch": [row(800, 0)],
            "packload local bytes second epoch": [row(1000, 0), row(900, 2)]}
    text = bench_object_store.summary(rows, ["packload", "litdata", "streaming"])
    assert "packload / litdata, bytes, cold: 2.00x" in text  # 300 (0 workers) against 150 (2 workers)
    assert "packload / streaming, bytes, cold: 5.00x" in text
    assert "packload second epoch / the local pack's: 0.80" in text
    assert "(workers 2," in text.split("litdata bytes cold")[1].splitlines()[0]
