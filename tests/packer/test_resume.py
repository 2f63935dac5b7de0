"""A ``pack`` killed with SIGKILL leaves nothing that looks complete, and ``--resume`` finishes it
with the same records as an uninterrupted pack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from packload import IncompletePackError, PackedImageFolder, PackReader, pack
from packload.cli import main, pack_summary
from packload.packer.destination import partial_path
from packload.packer.pipeline import nothing_to_resume
from tests.image_factory import make_image_folder, write_broken_files

REPO = Path(__file__).resolve().parents[2]

# Packs slowly (a pause per file), printing how many files it has encoded, so the test can kill it
# at a chosen point; checkpoints every 7 files.
SLOW_PACK = textwrap.dedent("""
    import sys, time
    import packload.packer.encode_stream as es
    import packload.packer.pipeline as p
    real = es.encode_chunk
    done = 0
    def slow(root, samples, options):
        global done
        out = []
        for s in samples:
            time.sleep(0.01)
            out.extend(real(root, [s], options))
            done += 1
            print(done, flush=True)
        return out
    es.encode_chunk = slow
    es.CHUNK_FILES = 3
    p.pack(sys.argv[1], sys.argv[2], workers=1, progress=False, checkpoint_every=7, shard_size=1 << 16,
           resume=len(sys.argv) > 3)
""")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    make_image_folder(root, classes=("a", "b", "c"), per_class=30, seed=5)
    write_broken_files(root / "b")
    return root


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory):
    out = {}
    for name in ("ref.lmdb", "ref.shards"):
        dst = tmp_path_factory.mktemp("ref") / name
        pack(source, dst, workers=1, progress=False, shard_size=1 << 16)
        out[name.split(".")[1]] = dst
    return out


def records_of(path: Path) -> list[tuple]:
    with PackReader(path) as reader:
        return [(reader.path_of(i), int(reader.entries["label"][i]), bytes(reader.payload(i, verify=True)))
                for i in range(reader.records)]


def kill_part_way(source: Path, dst: Path, after: int) -> None:
    """Run the slow pack and SIGKILL it once it has encoded ``after`` files."""
    proc = subprocess.Popen([sys.executable, "-c", SLOW_PACK, str(source), str(dst)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if int(line) >= after:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


@pytest.mark.parametrize("backend", ["lmdb", "shards"])
@pytest.mark.parametrize("after", [2, 40, 94])
def test_kill_then_resume_matches_uninterrupted(source, reference, tmp_path, capsys, backend, after):
    dst = tmp_path / f"out.{backend}"
    kill_part_way(source, dst, after)
    assert not dst.exists(), "a killed pack must not publish anything at the destination"
    partial = partial_path(dst)
    assert partial.exists()
    with pytest.raises(IncompletePackError, match="--resume"):
        PackedImageFolder(dst)
    # the reading commands refuse the partial output with a clear message
    assert main(["info", str(partial)]) != 0
    assert "did not finish" in capsys.readouterr().err
    if nothing_to_resume(partial):
        # killed before a record a resume would keep: the same command simply packs again
        assert main(["pack", str(source), str(dst), "--quiet", "--shard-size", str(1 << 16)]) == 0
        assert not partial.exists()
        assert records_of(dst) == records_of(reference[backend])
        return
    # without --resume, pack refuses to clobber it
    assert main(["pack", str(source), str(dst), "--quiet"]) == 2
    assert "--resume" in capsys.readouterr().err
    summary = pack(source, dst, workers=1, progress=False, resume=True, shard_size=1 << 16)
    assert not partial.exists()
    assert records_of(dst) == records_of(reference[backend])
    with PackReader(dst) as got, PackReader(reference[backend]) as want:
        assert got.index_bytes() == want.index_bytes()
        assert got.manifest["skipped"] == want.manifest["skipped"]
        assert got.manifest["class_counts"] == want.manifest["class_counts"]
    assert summary["records"] == len(records_of(dst))


def test_resume_really_continues(source, tmp_path):
    """Killed late, the resumed run starts after the records already on disk, not from zero."""
    dst = tmp_path / "late.shards"
    kill_part_way(source, dst, 60)
    summary = pack(source, dst, workers=1, progress=False, resume=True, shard_size=1 << 16)
    assert summary["resumed_at"] and summary["resumed_at"] >= 7
    # this run's files and rate, the whole pack's count apart
    assert summary["files_this_run"] == summary["files_total"] - summary["resumed_at"]
    assert summary["files_total"] == summary["records"] + summary["skipped"]
    # the rate counts this run's files, not the whole pack's (rounded figures: compared loosely)
    this_run, whole = (summary[k] / summary["seconds"] for k in ("files_this_run", "files_total"))
    assert abs(summary["files_per_s"] - this_run) < abs(summary["files_per_s"] - whole)
    line = pack_summary(summary)
    assert f"resumed at file {summary['resumed_at']}" in line
    assert f"packed {summary['files_this_run']} more files" in line and f"holds {summary['records']} images" in line


def test_resume_refuses_other_options(source, tmp_path):
    dst = tmp_path / "opts.lmdb"
    kill_part_way(source, dst, 20)
    from packload import EncodeOptions, UsageError

    with pytest.raises(UsageError, match="other options"):
        pack(source, dst, options=EncodeOptions(encoding="png"), workers=1, progress=False, resume=True)


def test_resume_refuses_a_changed_source(source, tmp_path_factory):
    src = tmp_path_factory.mktemp("changing")
    make_image_folder(src, classes=("a", "b"), per_class=30, seed=6)
    dst = tmp_path_factory.mktemp("out") / "c.shards"
    kill_part_way(src, dst, 30)
    progress = json.loads((partial_path(dst) / "progress.json").read_text())
    assert "options" in progress
    first = sorted((src / "a").iterdir())[0]
    os.rename(first, first.with_name("zzz_" + first.name))
    from packload import UsageError

    with pytest.raises(UsageError, match="changed"):
        pack(src, dst, workers=1, progress=False, resume=True, shard_size=1 << 16)


def test_overwrite_discards_an_unfinished_pack(source, reference, tmp_path):
    dst = tmp_path / "o.lmdb"
    kill_part_way(source, dst, 10)
    pack(source, dst, workers=1, progress=False, overwrite=True)
    assert not partial_path(dst).exists() and not Path(str(partial_path(dst)) + "-lock").exists()
    assert records_of(dst) == records_of(reference["lmdb"])
