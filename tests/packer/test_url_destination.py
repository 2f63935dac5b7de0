"""The destination rules at a URL (``packer.url_destination``): what ``pack`` and ``merge`` may
replace on an object store, checked before anything is removed, and nothing removed before the new
pack is ready. Against moto's S3 server on 127.0.0.1, through the command line as users type it."""

from __future__ import annotations

import json

import lmdb
import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload.cli import main  # noqa: E402
from packload.loaders.read import PackReader  # noqa: E402
from packload.packer import pipeline  # noqa: E402
from packload.packer.destination import partial_path  # noqa: E402
from packload.packer.pack_destination import PackDestination  # noqa: E402
from tests.image_factory import make_image_folder, write_broken_files  # noqa: E402
from tests.object_store import ObjectStore, point_cli_at  # noqa: E402

BUCKET = "bkt-dest"  # moto keeps one store per process: a bucket of this file's own


@pytest.fixture(scope="module")
def store():
    with ObjectStore() as s:
        s.make_bucket(BUCKET)
        yield s


@pytest.fixture
def env(store, monkeypatch, tmp_path):
    point_cli_at(store, monkeypatch, tmp_path / "cache")
    return store


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("dest")
    make_image_folder(root / "a", classes=("ant", "bee"), per_class=9)
    make_image_folder(root / "b", classes=("cat", "dog", "emu"), per_class=7, seed=3)
    broken = root / "broken" / "cls"
    broken.mkdir(parents=True)
    write_broken_files(broken)
    return root


def _run(capsys, argv, expect=0):
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == expect, (argv, out, err)
    return out, err


def _records(url):
    with PackReader(url) as reader:
        return reader.classes, [bytes(v) for v in reader.payloads(list(range(reader.records)))]


def _objects(store, prefix):
    """Every object under ``prefix`` (key -> bytes)."""
    fs = store.filesystem()
    fs.invalidate_cache()
    return {key: fs.cat_file(key) for key in fs.find(f"{BUCKET}/{prefix}")}


def _users_lmdb(path):
    """A user's own LMDB database (no key of packload's)."""
    env = lmdb.open(str(path), subdir=False, map_size=1 << 22)
    with env.begin(write=True) as txn:
        for k in range(50):
            txn.put(b"user-key-%03d" % k, b"value " * 40)
    env.close()
    return path.read_bytes()


def _strangers(store, base, tmp_path):
    """What a user keeps where a pack might be written: name -> (URL, what is there)."""
    fs = store.filesystem()
    fs.pipe_file(f"{BUCKET}/{base}/notes.txt", b"my notes")
    fs.pipe_file(f"{BUCKET}/{base}/report.pdf", b"%PDF-1.4 mine")
    fs.pipe_file(f"{BUCKET}/{base}/db.lmdb", _users_lmdb(tmp_path / "db.lmdb"))
    fs.pipe_file(f"{BUCKET}/{base}/foreign.shards/manifest.json", json.dumps({"format": "other", "version": 1}).encode())
    fs.pipe_file(f"{BUCKET}/{base}/foreign.shards/shard-00000.bin", b"someone's shard")
    fs.pipe_file(f"{BUCKET}/{base}/nested.shards/manifest.json", b"{}")
    fs.pipe_file(f"{BUCKET}/{base}/nested.shards/inner/data.bin", b"deep")
    fs.pipe_file(f"{BUCKET}/{base}/shards-only.shards/shard-00000.bin", b"not ours, named like ours")
    names = ["notes.txt", "report.pdf", "db.lmdb", "foreign.shards", "nested.shards", "shards-only.shards"]
    return {name: f"s3://{BUCKET}/{base}/{name}" for name in names}


def test_overwrite_at_a_url_never_replaces_what_is_not_a_pack(env, sources, tmp_path, capsys):
    """``--overwrite`` onto an object, a user's LMDB database, a prefix with a foreign manifest, a
    sub-prefix, or shard-named objects that are not ours: refused in one line, exit 2, nothing
    changed, for ``pack`` (both backends), ``merge`` and the Ray engine's check."""
    base = tmp_path.name
    targets = _strangers(env, base, tmp_path)
    before = _objects(env, base)
    pack_url = f"s3://{BUCKET}/{base}/input.shards"
    _run(capsys, ["pack", str(sources / "a"), pack_url, "--quiet"])
    before = _objects(env, base)
    for name, url in targets.items():
        for argv in (["pack", str(sources / "a"), url, "--overwrite", "--quiet"],
                     ["pack", str(sources / "a"), url, "--overwrite", "--quiet", "--format", "lmdb"],
                     ["merge", url, pack_url, "--overwrite", "--quiet"],
                     ["pack", str(sources / "a"), url, "--engine", "ray", "--overwrite"]):
            _, err = _run(capsys, argv, expect=2)
            assert "not a pack of packload's" in err and err.count("\n") == 1, (name, argv, err)
            assert "--overwrite replaces only packs" in err
        assert _objects(env, base) == before, name


def test_packs_of_ours_at_a_url_are_replaced_with_overwrite_only(env, sources, tmp_path, capsys):
    base = f"s3://{BUCKET}/{tmp_path.name}"
    for name in ("p.shards", "p.lmdb"):
        url = f"{base}/{name}"
        _run(capsys, ["pack", str(sources / "a"), url, "--quiet", "--shard-size", "64K"])
        _, err = _run(capsys, ["pack", str(sources / "b"), url, "--quiet"], expect=2)
        assert "a pack is there; add --overwrite" in err
        assert _records(url)[0] == ["ant", "bee"]
        _run(capsys, ["pack", str(sources / "b"), url, "--quiet", "--overwrite", "--shard-size", "64K"])
        assert _records(url)[0] == ["cat", "dog", "emu"]
    local_b = tmp_path / "b.shards"
    pipeline.pack(sources / "b", local_b, progress=False, shard_size=1 << 16)
    assert _records(f"{base}/p.shards")[1] == _records(str(local_b))[1]
    assert not _objects(env, f"{tmp_path.name}/p.shards.partial")  # the staging prefix is gone


def test_a_pack_replaced_by_one_of_the_other_kind(env, sources, tmp_path, capsys):
    """An LMDB pack over a shards pack at one URL (and back): the old one goes once the new one is up."""
    url = f"s3://{BUCKET}/{tmp_path.name}/p"
    _run(capsys, ["pack", str(sources / "a"), url, "--quiet", "--shard-size", "64K"])
    _run(capsys, ["pack", str(sources / "b"), url, "--quiet", "--overwrite", "--format", "lmdb"])
    with PackReader(url) as reader:
        assert reader.backend == "lmdb" and reader.classes == ["cat", "dog", "emu"]
    assert not [key for key in _objects(env, tmp_path.name) if key.startswith(f"{BUCKET}/{tmp_path.name}/p/")]
    _run(capsys, ["pack", str(sources / "a"), url, "--quiet", "--overwrite", "--format", "shards"])
    with PackReader(url) as reader:
        assert reader.backend == "shards" and reader.classes == ["ant", "bee"]
    assert f"{BUCKET}/{tmp_path.name}/p" not in _objects(env, tmp_path.name)


@pytest.mark.parametrize("name", ["keep.shards", "keep.lmdb"])
def test_a_failed_pack_with_overwrite_keeps_the_old_pack(env, sources, tmp_path, capsys, monkeypatch, name):
    """A typo'd source, a source with no image that can be packed, a pack stopped before its end:
    with ``--overwrite``, the pack at the URL is still there, whole, and nothing else is left."""
    url = f"s3://{BUCKET}/{tmp_path.name}/{name}"
    _run(capsys, ["pack", str(sources / "a"), url, "--quiet", "--shard-size", "64K"])
    expected = _records(url)
    before = _objects(env, tmp_path.name)
    _, err = _run(capsys, ["pack", str(tmp_path / "no_such_src"), url, "--overwrite", "--quiet"], expect=2)
    assert "source folder not found" in err
    _, err = _run(capsys, ["pack", str(sources / "broken"), url, "--overwrite", "--quiet"], expect=2)
    assert "could be packed" in err

    def stop(*args):
        raise KeyboardInterrupt  # stopped just before the new pack is complete
    monkeypatch.setattr(PackDestination, "publish", stop)
    with pytest.raises(KeyboardInterrupt):
        pipeline.pack(sources / "b", url, overwrite=True, progress=False, shard_size=1 << 16)
    assert _objects(env, tmp_path.name) == before
    assert _records(url) == expected


def test_a_failed_local_pack_leaves_nothing_and_the_same_command_starts_again(sources, tmp_path, capsys):
    """No image could be packed: no DEST.partial stays behind; once the data is fixed, the same
    command packs (before, it was refused: an unfinished pack was there)."""
    src = tmp_path / "src"
    (src / "cls").mkdir(parents=True)
    write_broken_files(src / "cls")
    for name in ("d.shards", "d.lmdb"):
        dest = tmp_path / name
        _, err = _run(capsys, ["pack", str(src), str(dest), "--quiet"], expect=2)
        assert "could be packed" in err
        assert not dest.exists() and not dest.with_name(name + ".partial").exists()
    make_image_folder(src, classes=("cls",), per_class=3)
    for name in ("d.shards", "d.lmdb"):
        _run(capsys, ["pack", str(src), str(tmp_path / name), "--quiet"])
        with PackReader(tmp_path / name) as reader:
            assert reader.records == 3


@pytest.mark.parametrize("backend", ["shards", "lmdb"])
def test_an_unfinished_local_pack_with_no_record_is_started_again(sources, tmp_path, capsys, backend):
    """What a pack killed before its first record leaves (its first checkpoint only): nothing a
    resume would keep, so the same command starts again; one with records is still refused."""
    dest = tmp_path / f"k.{backend}"
    tmp = partial_path(dest)
    if backend == "shards":
        tmp.mkdir()
        writer = pipeline.ShardsWriter(tmp, 1 << 16)
    else:
        writer = pipeline.LmdbWriter(tmp, 1 << 24)
    writer.checkpoint({"options": {}, "skipped": []})
    writer.close()
    assert pipeline.nothing_to_resume(tmp)
    _run(capsys, ["pack", str(sources / "a"), str(dest), "--quiet"])
    with PackReader(dest) as reader:
        assert reader.records == 18
    assert not tmp.exists()


def test_a_stranger_in_the_staging_prefix_is_refused(env, sources, tmp_path, capsys):
    url = f"s3://{BUCKET}/{tmp_path.name}/p.shards"
    _run(capsys, ["pack", str(sources / "a"), url, "--quiet"])
    env.filesystem().pipe_file(f"{BUCKET}/{tmp_path.name}/p.shards.partial/mine.txt", b"mine")
    _, err = _run(capsys, ["pack", str(sources / "b"), url, "--quiet", "--overwrite"], expect=2)
    assert "does not stage there" in err
    assert _objects(env, f"{tmp_path.name}/p.shards.partial") == {
        f"{BUCKET}/{tmp_path.name}/p.shards.partial/mine.txt": b"mine"}
    assert _records(url)[0] == ["ant", "bee"]
