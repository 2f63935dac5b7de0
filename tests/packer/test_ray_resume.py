"""``pack --engine ray --resume``: a driver killed midway, then resumed, gives the pack an uninterrupted
run gives, without running the finished tasks again; a lost worker is retried; what a resume checks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from packload import EncodeOptions, pack, pack_ray
from packload.cli import main
from packload.core.format import RAY_RUN_NAME, TASK_DONE_NAME, TASK_PLACED_NAME
from packload.core.scan import scan_folder
from packload.loaders.verify import verify
from packload.packer.ray_engine import split_ranges
from packload.packer.ray_folder import staging_path
from packload.packer.ray_resume import kept_tasks, run_record, source_digest, write_run_record
from packload.packer.ray_tasks import done_result, pack_range, place_task, placed_result, task_name
from tests.image_factory import make_image_folder, write_broken_files
from tests.packer.test_ray_engine import manifest_of, records_of
from tests.ray_faults import logged_tasks
from tests.ray_local import HOOK, REPO, LocalRay, local_ray  # noqa: F401 - a fixture

TASK_FILES = 5
SHARD_SIZE = 1 << 16


@pytest.fixture(scope="module")
def ray_here(local_ray: LocalRay) -> LocalRay:  # noqa: F811 - the fixture imported above
    return local_ray


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three classes of JPEGs and PNGs and broken files to skip: 47 files, 10 ranges of 5."""
    root = tmp_path_factory.mktemp("resume-src") / "images"
    make_image_folder(root, classes=("ant", "bee", "cow"), per_class=14)
    write_broken_files(root / "bee")
    return root


def _unfinished(source: Path, dst: Path, done: list[int], backend: str = "shards",
                options: EncodeOptions | None = None) -> Path:
    """The unfinished pack a killed driver leaves: the run record, and the tasks ``done`` packed."""
    options = options or EncodeOptions()
    scan = scan_folder(source)
    ranges = split_ranges(len(scan.samples), TASK_FILES)
    staging = dst.with_name(dst.name + ".partial") if backend == "shards" else staging_path(dst)
    staging.mkdir()
    record = run_record({"backend": backend, **asdict(options)}, SHARD_SIZE, scan.samples)
    write_run_record(staging, {**record, "task_files": TASK_FILES, "ranges": ranges})
    for k in done:
        a, b = ranges[k]
        pack_range(k, str(source), scan.samples[a:b], a, scan.classes, options, str(staging / task_name(k)),
                   SHARD_SIZE, False, hashed=k == 0)
    return staging


# -- the markers, without Ray ------------------------------------------------------------------
def test_a_done_marker_is_trusted_only_with_its_files(source: Path, tmp_path: Path) -> None:
    staging = _unfinished(source, tmp_path / "o.shards", done=[1, 2, 3])
    ranges = split_ranges(len(scan_folder(source).samples), TASK_FILES)
    results, placed = kept_tasks(staging, ranges, staging)
    assert sorted(results) == [1, 2, 3] and placed == {}
    assert results[2]["range"] == [10, 15] and results[2]["records"] + len(results[2]["skipped"]) == 5
    (staging / task_name(1) / "index.bin").write_bytes(b"not the index")  # torn: another checksum
    shard = staging / task_name(2) / results[2]["parts"][0]["name"]
    with open(shard, "ab") as f:
        f.write(b"x")  # another size
    (staging / task_name(3) / TASK_DONE_NAME).unlink()  # killed before its marker
    assert kept_tasks(staging, ranges, staging) == ({}, {})
    assert done_result(staging / task_name(1), 2, ranges[1]) is None  # the marker of another task


def test_an_interrupted_placement_gives_the_same_shards(source: Path, tmp_path: Path) -> None:
    """A shard moved (and maybe renumbered) before the driver died is renumbered again: same bytes."""
    out_a, out_b = tmp_path / "a", tmp_path / "b"
    out_a.mkdir()
    out_b.mkdir()
    staging = _unfinished(source, tmp_path / "o.shards", done=[1])
    copy = tmp_path / "copy"
    shutil.copytree(staging / task_name(1), copy)
    clean = place_task(str(copy), str(out_a), 3, 7)
    folder = staging / task_name(1)
    first = clean["parts"][0]["name"]
    os.replace(folder / json.loads((folder / TASK_DONE_NAME).read_text())["parts"][0]["name"], out_b / first)
    assert done_result(folder, 1, (5, 10), out_b, 3) is not None  # the moved shard counts, by its new name
    assert placed_result(folder, out_b, 3, 7) is None
    again = place_task(str(folder), str(out_b), 3, 7)
    assert again["parts"] == clean["parts"]
    assert (out_b / first).read_bytes() == (out_a / first).read_bytes()
    assert placed_result(folder, out_b, 3, 7) == again and (folder / TASK_PLACED_NAME).exists()
    assert placed_result(folder, out_b, 3, 8) is None  # placed at other record numbers


def test_the_source_digest_follows_names_and_labels(source: Path) -> None:
    samples = scan_folder(source).samples
    assert source_digest(samples) == source_digest(list(samples))
    assert source_digest(samples) != source_digest(samples[:-1])
    assert source_digest(samples) != source_digest([samples[0]._replace(label=2), *samples[1:]])


# -- what a resume refuses, in one line --------------------------------------------------------
@pytest.mark.parametrize(("flags", "named"), [
    (["--encoding", "raw", "--size", "8x8"], "--encoding was keep, now raw"),
    (["--shard-size", "131072"], "--shard-size was 65536, now 131072"),
    (["--task-files", "7"], "--task-files was 5, now 7"),
])
def test_resume_refuses_other_options(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      flags: list[str], named: str) -> None:
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e \".[ray]\")")
    staging = _unfinished(source, tmp_path / "o.shards", done=[0])
    args = ["pack", str(source), str(tmp_path / "o.shards"), "--engine", "ray", "--resume", *flags]
    if "--shard-size" not in flags:
        args += ["--shard-size", str(SHARD_SIZE)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and named in err and "--overwrite" in err
    assert (staging / task_name(0) / TASK_DONE_NAME).exists()  # refused: nothing removed


def test_resume_refuses_a_changed_source(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e \".[ray]\")")
    src = tmp_path / "images"
    make_image_folder(src, classes=("a", "b"), per_class=6)
    _unfinished(src, tmp_path / "o.lmdb", done=[0], backend="lmdb")
    make_image_folder(src / "c", classes=("x",), per_class=1)  # one more image, in a new class
    assert main(["pack", str(src), str(tmp_path / "o.lmdb"), "--engine", "ray", "--resume",
                 "--shard-size", str(SHARD_SIZE)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the source folder changed since the pack was interrupted" in err
    assert "12 image files then, 13 now" in err


def test_an_unfinished_ray_pack_needs_resume_or_overwrite(source: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e \".[ray]\")")
    staging = _unfinished(source, tmp_path / "o.shards", done=[0])
    assert main(["pack", str(source), str(tmp_path / "o.shards"), "--engine", "ray"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "add --resume to finish it, or --overwrite" in err
    assert (staging / RAY_RUN_NAME).exists()


def test_a_local_unfinished_pack_is_not_resumed_on_ray(source: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray", reason="Ray is not installed (pip install -e \".[ray]\")")
    partial = tmp_path / "o.shards.partial"
    partial.mkdir()
    (partial / "progress.json").write_text(json.dumps({"options": {}, "skipped": []}))
    assert main(["pack", str(source), str(tmp_path / "o.shards"), "--engine", "ray", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "started without --engine ray" in err and partial.exists()


def test_a_ray_unfinished_pack_is_not_resumed_locally(source: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    staging = _unfinished(source, tmp_path / "o.shards", done=[0, 1])
    assert main(["pack", str(source), str(tmp_path / "o.shards"), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "started with --engine ray; resume it with --engine ray --resume" in err
    assert _done_tasks(staging) == {0, 1}  # the finished tasks are kept


# -- on Ray --------------------------------------------------------------------------------
DRIVER = """
import sys
import ray
from packload import pack_ray
ray.init(address=sys.argv[1], runtime_env={hook!r}, log_to_driver=False)
pack_ray(sys.argv[2], sys.argv[3], task_files={task_files}, shard_size={shard_size}, progress=False)
"""


def _done_tasks(staging: Path) -> set[int]:
    return {int(p.parent.name.split("-")[1]) for p in staging.glob(f"task-*/{TASK_DONE_NAME}")}


@pytest.mark.parametrize("dest", ["out.shards", "out.lmdb"])
def test_resume_after_the_driver_is_killed(ray_here: LocalRay, source: Path, tmp_path: Path, dest: str) -> None:
    local, remote = tmp_path / "local" / dest, tmp_path / "ray" / dest
    local.parent.mkdir()
    remote.parent.mkdir()
    pack(source, local, workers=1, progress=False, shard_size=SHARD_SIZE)
    staging = remote.with_name(dest + ".partial") if dest.endswith(".shards") else staging_path(remote)
    ray_here.marker.write_text("slow 0.4")  # every task waits: the driver is killed midway
    ray_here.log.write_text("")
    driver = subprocess.Popen([sys.executable, "-c", DRIVER.format(hook=HOOK, task_files=TASK_FILES,
                                                                   shard_size=SHARD_SIZE),
                               ray_here.address, str(source), str(remote)],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while len(_done_tasks(staging)) < 3 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert driver.poll() is None, driver.stderr.read().decode()[-2000:]
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        driver.stderr.close()
        ray_here.marker.unlink()
    time.sleep(2)  # Ray ends the dead driver's tasks
    finished = _done_tasks(staging)
    assert 3 <= len(finished) < 10 and not remote.exists()
    ran_before = len(logged_tasks(ray_here.log))
    result = pack_ray(source, remote, task_files=TASK_FILES, shard_size=SHARD_SIZE, resume=True, progress=False)
    ran_now = logged_tasks(ray_here.log)[ran_before:]
    assert not finished & set(ran_now)  # no finished task ran again
    assert result["ray"]["tasks_kept"] >= len(finished) and result["ray"]["tasks_kept"] + len(ran_now) == 10
    assert sum(result["ray"]["tasks_per_node"].values()) == len(ran_now)
    assert result["files_this_run"] == sum(min(47, 5 * k + 5) - 5 * k for k in set(ran_now))
    assert result["resumed_at"] == 5 * min(ran_now)
    assert records_of(remote) == records_of(local)
    assert manifest_of(remote) == manifest_of(local)
    assert verify(remote, progress=False)["ok"]
    assert sorted(os.listdir(remote.parent)) == [dest]  # no run record, task folder or staging left


def test_resume_of_a_run_that_had_finished_every_task(ray_here: LocalRay, source: Path, tmp_path: Path) -> None:
    """Killed after the last task, before the join: nothing is packed again."""
    dst = tmp_path / "o.shards"
    _unfinished(source, dst, done=list(range(10)))
    ray_here.log.write_text("")
    result = pack_ray(source, dst, task_files=TASK_FILES, shard_size=SHARD_SIZE, resume=True, progress=False)
    assert logged_tasks(ray_here.log) == [] and result["ray"]["tasks_kept"] == 10
    assert result["files_this_run"] == 0 and result["resumed_at"] == 47
    pack(source, tmp_path / "local.shards", workers=1, progress=False)
    assert records_of(dst) == records_of(tmp_path / "local.shards")
    assert verify(dst, progress=False)["ok"]


def test_a_lost_worker_is_retried(ray_here: LocalRay, source: Path, tmp_path: Path) -> None:
    ray_here.marker.write_text("2 once kill")  # task 2's worker process dies after 3 records
    ray_here.log.write_text("")
    pack_ray(source, tmp_path / "ray.lmdb", task_files=TASK_FILES, progress=False)
    assert not ray_here.marker.exists()  # the worker was killed
    assert logged_tasks(ray_here.log).count(2) == 2  # and its task ran again
    pack(source, tmp_path / "local.lmdb", workers=1, progress=False)
    assert records_of(tmp_path / "ray.lmdb") == records_of(tmp_path / "local.lmdb")
    assert manifest_of(tmp_path / "ray.lmdb") == manifest_of(tmp_path / "local.lmdb")
