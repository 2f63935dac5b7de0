"""A table source on Ray and on object stores, as a folder is: ``pack --engine ray --labels`` into a
folder, an LMDB file and a URL, from a folder or a URL (the table itself at a URL too), and packs with
fields written to and read from a URL; each the same pack as a local ``pack --labels``, field for
field (moto's S3 server on 127.0.0.1, the shared local Ray instance)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload import PackedImageFolder, PackFormatError, pack, pack_ray, unpack, verify  # noqa: E402
from packload.cli import main  # noqa: E402
from packload.core.format import FIELDS_NAME  # noqa: E402
from packload.core.pack_download import download_pack  # noqa: E402
from packload.core.remote import RemoteStore  # noqa: E402
from packload.packer.table_options import TableOptions  # noqa: E402
from tests.fields_source import make_source, read_table  # noqa: E402
from tests.object_store import ObjectStore  # noqa: E402
from tests.ray_local import LocalRay, local_ray  # noqa: E402, F401 - a fixture

BUCKET = "fields"
GIVEN = {"age": "int", "attrs": "list[int]"}


@pytest.fixture(scope="module")
def store() -> ObjectStore:
    with ObjectStore() as s:  # started before Ray, so that Ray's workers inherit its (fake) credentials
        s.make_bucket(BUCKET)
        yield s


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory, store: ObjectStore):
    """The folder and its table, also uploaded: s3://fields/images/ and s3://fields/labels.csv."""
    made = make_source(tmp_path_factory.mktemp("fields-remote"))
    fs = store.filesystem()
    for path in sorted(made.root.iterdir()):
        fs.pipe_file(f"{BUCKET}/images/{path.name}", path.read_bytes())
    fs.pipe_file(f"{BUCKET}/labels.csv", made.table.read_bytes())
    return made


@pytest.fixture(scope="module")
def local(source, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fields-local") / "local.shards"
    pack(source.root, out, labels=TableOptions(source.table, types=GIVEN), workers=1, progress=False)
    return out


def _same(got: Path | str, local: Path, storage_options: dict | None = None) -> None:
    """Two packs with the same records, classes, fields (values and the part's bytes) and lists."""
    a = PackedImageFolder(got, output="bytes", storage_options=storage_options)
    b = PackedImageFolder(local, output="bytes")
    assert a.classes == b.classes and a.targets == b.targets and a.fields == b.fields
    assert [a[i][0] for i in range(len(a))] == [b[i][0] for i in range(len(b))]
    for name in b.fields:
        assert repr(a.field(name)[:]) == repr(b.field(name)[:]), name
    ma, mb = a.manifest, b.manifest
    assert ma["fields"]["sha256"] == mb["fields"]["sha256"]
    for key in ("skipped", "ignored", "classes", "class_counts"):
        assert ma[key] == mb[key], key
    assert ma["fields"]["rows_left_out"] == mb["fields"]["rows_left_out"]


@pytest.mark.parametrize("backend", ["shards", "lmdb"])
def test_to_a_url_and_back(store: ObjectStore, source, local: Path, tmp_path: Path, backend: str) -> None:
    url = f"s3://{BUCKET}/out/p.{backend}"
    pack(source.root, url, labels=TableOptions(source.table, types=GIVEN), workers=1, progress=False,
         storage_options=store.options)
    if backend == "shards":
        assert FIELDS_NAME in RemoteStore(url, store.options).listing()
    _same(url, local, store.options)
    copy = Path(download_pack(url, tmp_path, store.options))
    assert verify(copy, progress=False)["ok"]
    unpack(copy, tmp_path / "out", progress=False)
    assert set(read_table(tmp_path / "out" / "labels.csv")) == set(source.paths)


def test_a_table_at_a_url(store: ObjectStore, source, local: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.shards"
    pack(source.root, out, labels=TableOptions(f"s3://{BUCKET}/labels.csv", types=GIVEN), workers=1, progress=False,
         storage_options=store.options)
    _same(out, local)
    assert PackedImageFolder(out).manifest["fields"]["table"]["name"] == "labels.csv"


@pytest.fixture(scope="module")
def ray_here(store: ObjectStore, local_ray: LocalRay) -> LocalRay:  # noqa: F811 - the fixture imported above
    return local_ray


@pytest.mark.parametrize("dest", ["p.shards", "p.lmdb"])
def test_ray_into_a_folder(ray_here: LocalRay, source, local: Path, tmp_path: Path, dest: str) -> None:
    result = pack_ray(source.root, tmp_path / dest, labels=TableOptions(source.table, types=GIVEN), task_files=3,
                      shard_size=1 << 16, progress=False)
    assert result["ray"]["tasks"] >= 2 and result["fields"]["attrs"] == "list[int]"
    _same(tmp_path / dest, local)
    assert verify(tmp_path / dest, progress=False)["ok"]


@pytest.mark.parametrize("dest", ["ray.shards", "ray.lmdb"])
def test_ray_from_a_url_to_a_url(ray_here: LocalRay, store: ObjectStore, source, local: Path, tmp_path: Path,
                                 dest: str) -> None:
    url = f"s3://{BUCKET}/out/{dest}"
    pack_ray(f"s3://{BUCKET}/images", url, labels=TableOptions(f"s3://{BUCKET}/labels.csv", types=GIVEN),
             task_files=3, shard_size=1 << 16, progress=False, storage_options=store.options)
    _same(url, local, store.options)


def test_ray_from_the_command_line(ray_here: LocalRay, source, local: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.shards"
    code = main(["pack", str(source.root), str(out), "--engine", "ray", "--ray-address", ray_here.address,
                 "--labels", str(source.table), "--field", "age:int", "--field", "attrs:list[int]", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["rows_left_out"] == PackedImageFolder(local).manifest["fields"][
        "rows_left_out_count"]
    _same(out, local)


def test_a_url_pack_without_its_fields_part_is_refused(store: ObjectStore, source, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/out/gone.shards"
    pack(source.root, url, labels=TableOptions(source.table, types=GIVEN), workers=1, progress=False,
         storage_options=store.options)
    store.filesystem().rm(f"{BUCKET}/out/gone.shards/{FIELDS_NAME}")
    ds = PackedImageFolder(url, storage_options=store.options, cache_dir=tmp_path / "cache")
    assert len(ds) == len(source.paths)  # the images read as ever
    with pytest.raises(PackFormatError, match="fields.bin: missing, though the manifest lists the pack's fields"):
        ds.field("age")
