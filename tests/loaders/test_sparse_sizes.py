"""Sizes read from a pack are checked against what can be true before anything is read or allocated:
sparse files (made with truncate) whose headers add up cost neither time nor memory, and get one
line naming the file; ``info`` reports sizes that were checked; ``verify`` and ``merge`` never hash
past what the manifest lists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packload import PackReader
from packload.core.errors import PackFormatError
from packload.core.format import INDEX_ENTRY, INDEX_HEADER, MAX_PATH_BYTES, decode_index
from packload.loaders.verify import file_problems, info, sha256_file, verify
from tests.reliability.crafted import copy_pack, index_with, rewrite
from tests.reliability.packs import child_env, cli, make_source, pack_both

TIB = 1 << 40
GIB = 1 << 30


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sparse")
    return pack_both(make_source(root / "src", per_class=6, big=2), root)  # several shards and chunks


def _manifest(pack: Path) -> dict[str, Any]:
    return json.loads((pack / "manifest.json").read_text())


def _set_manifest(pack: Path, manifest: dict[str, Any]) -> None:
    (pack / "manifest.json").write_text(json.dumps(manifest))


def _refused(pack: Path, *words: str) -> str:
    """Open ``pack`` with allocations traced: refused with one line holding ``words``, having
    allocated almost nothing."""
    tracemalloc.start()
    try:
        with pytest.raises(PackFormatError) as error:
            PackReader(pack)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text = str(error.value)
    assert "\n" not in text and all(word in text for word in words), text
    assert peak < 16 << 20, f"{peak:,} bytes allocated to refuse it"
    return text


def _sparse_index(pack: Path, size: int, **header: int) -> None:
    """Make the index ``size`` bytes (a hole past its real bytes) with a header that adds up: the
    paths blob (or ``count`` entries, when given) takes the rest."""
    raw = bytearray((pack / "index.bin").read_bytes())
    head = np.frombuffer(bytes(raw[: INDEX_HEADER.itemsize]), INDEX_HEADER).copy()
    for name, value in header.items():
        head[0][name] = value
    head[0]["paths_len"] = size - INDEX_HEADER.itemsize - int(head[0]["count"]) * INDEX_ENTRY.itemsize
    raw[: INDEX_HEADER.itemsize] = head.tobytes()
    with open(pack / "index.bin", "r+b") as f:
        f.write(raw)
        f.truncate(size)


@pytest.mark.parametrize("size", [6 * GIB, TIB])
@pytest.mark.parametrize("listed", [True, False], ids=["manifest-lists-it", "manifest-as-packed"])
def test_sparse_index_with_a_consistent_header(packs: dict[str, Path], tmp_path: Path, size: int,
                                               listed: bool) -> None:
    pack = copy_pack(packs["shards"], tmp_path / "p.shards")
    _sparse_index(pack, size)
    if listed:  # the manifest made to agree, as an attacker would
        manifest = _manifest(pack)
        manifest["index"]["size"] = size
        _set_manifest(pack, manifest)
        _refused(pack, "index.bin", "paths blob", "damaged")
    else:
        _refused(pack, "index.bin", f"{size:,} bytes", "larger than", "the manifest lists")


def test_sparse_index_claiming_many_records(packs: dict[str, Path], tmp_path: Path) -> None:
    """A header whose count fills a sparse 6 GiB with entries: refused on the count, before reading
    any entry, whether or not the manifest's count is made to agree."""
    pack = copy_pack(packs["shards"], tmp_path / "p.shards")
    count = (6 * GIB) // INDEX_ENTRY.itemsize
    _sparse_index(pack, INDEX_HEADER.itemsize + count * INDEX_ENTRY.itemsize, count=count)
    manifest = _manifest(pack)
    manifest["index"]["size"] = (pack / "index.bin").stat().st_size
    _set_manifest(pack, manifest)
    _refused(pack, "index.bin", "manifest says", f"index holds {count}")
    _set_manifest(pack, dict(manifest, records=count))
    _refused(pack, "index.bin", f"claims {count} records", "bytes of the pack's parts")


def test_decode_index_checks_before_reading() -> None:
    """The checks hold for any buffer: a paths blob longer than the records' paths can be, or one with
    bytes past the last path, and counts past the manifest's or the parts'."""
    from packload.core.format import encode_index

    entries = np.zeros(2, INDEX_ENTRY)
    entries["path_offset"] = [0, 3]
    entries["path_len"] = [3, 4]
    entries["payload_offset"] = entries["record_offset"] + 56 + entries["path_len"]
    good = encode_index(entries, b"abcdefg")
    assert decode_index(good, "i", records=2, part_bytes=112)[1] == b"abcdefg"
    with pytest.raises(PackFormatError, match="paths end at 7"):
        decode_index(encode_index(entries, b"abcdefg" + b"\0" * 10), "i")
    with pytest.raises(PackFormatError, match=f"more than 2 paths of at most {MAX_PATH_BYTES}"):
        decode_index(encode_index(entries, b"\0" * (2 * MAX_PATH_BYTES + 1)), "i")
    with pytest.raises(PackFormatError, match="manifest says 3 records, index holds 2"):
        decode_index(good, "i", records=3)
    with pytest.raises(PackFormatError, match="more than the 111 bytes"):
        decode_index(good, "i", part_bytes=111)
    with pytest.raises(PackFormatError, match="more than 0 paths"):
        decode_index(encode_index(np.zeros(0, INDEX_ENTRY), b"x"), "i")


def test_sparse_shard_larger_than_its_records(packs: dict[str, Path], tmp_path: Path) -> None:
    pack = copy_pack(packs["shards"], tmp_path / "p.shards")
    shard = pack / "shard-00001.bin"
    real = shard.stat().st_size
    os.truncate(shard, TIB)
    _refused(pack, "shard-00001.bin", f"{TIB} bytes", f"the manifest says {real}")
    code, err = cli(["info", str(pack)])
    assert code != 0 and "shard-00001.bin" in err and len(err.strip().splitlines()) == 1
    manifest = _manifest(pack)  # the manifest made to agree: the records still end where they did
    manifest["parts"][1]["size"] = TIB
    _set_manifest(pack, manifest)
    text = _refused(pack, "shard-00001.bin", f"{TIB:,} bytes", f"records end at {real:,}", "no record accounts for")
    for command in (["info", str(pack)], ["verify", "--quiet", str(pack)], ["merge", str(tmp_path / "m.shards"),
                                                                          str(pack)]):
        code, err = cli(command)
        assert code != 0 and text in err and len(err.strip().splitlines()) == 1, (command, err)
    assert not (tmp_path / "m.shards").exists()


def test_a_few_bytes_appended_to_a_shard(packs: dict[str, Path], tmp_path: Path) -> None:
    """Not only sparse terabytes: any tail no record accounts for, manifest in step or not."""
    pack = copy_pack(packs["shards"], tmp_path / "p.shards")
    with open(pack / "shard-00000.bin", "ab") as f:
        f.write(b"\0" * 10)
    manifest = _manifest(pack)
    manifest["parts"][0]["size"] += 10
    _set_manifest(pack, manifest)
    _refused(pack, "shard-00000.bin", "10 bytes no record accounts for")


def test_lmdb_index_and_chunk_sizes(packs: dict[str, Path], tmp_path: Path) -> None:
    """An LMDB pack's index against the manifest's size and count; a chunk against its records' end."""
    pack = copy_pack(packs["lmdb"], tmp_path / "p.lmdb")
    with PackReader(pack) as reader:
        manifest = dict(reader.manifest)
    rewrite(pack, manifest=dict(manifest, index=dict(manifest["index"], size=manifest["index"]["size"] + 64)),
            fix_sha=False)
    _refused(pack, "p.lmdb: index", "smaller than", "the manifest lists")
    pack = copy_pack(packs["lmdb"], tmp_path / "q.lmdb")
    rewrite(pack, index=index_with(pack, paths_len=10**9))
    _refused(pack, "q.lmdb", "index claims")


def test_lmdb_chunk_longer_than_its_records(packs: dict[str, Path], tmp_path: Path) -> None:
    from packload.core.format import lmdb_chunk_key
    from tests.reliability.crafted import _lmdb_put

    pack = copy_pack(packs["lmdb"], tmp_path / "p.lmdb")
    with PackReader(pack) as reader:
        chunk = bytes(reader.part_view(0))
    _lmdb_put(pack, {lmdb_chunk_key(0): chunk + b"\0" * 4096})
    with PackReader(pack) as reader, pytest.raises(PackFormatError, match=r"chunk 0 of .* bytes, but its records "
                                                                          f"end at {len(chunk):,}"):
        reader.payload(0)


def test_lmdb_file_with_a_sparse_tail(packs: dict[str, Path], tmp_path: Path) -> None:
    """A tail past LMDB's last page is never read: the pack opens and reads; ``info`` reports the
    pages' bytes, not the file's terabyte; ``verify`` names the tail without reading it."""
    pack = copy_pack(packs["lmdb"], tmp_path / "p.lmdb")
    real = pack.stat().st_size
    os.truncate(pack, TIB)
    with PackReader(pack) as reader:
        assert bytes(reader.payload(0, verify=True))
    assert info(pack)["pack_bytes"] == real
    report = verify(pack, progress=False)
    assert not report["ok"] and report["bad_files"] == [
        {"file": "p.lmdb", "problem": f"{TIB:,} bytes, but LMDB's pages end at {real:,}: {TIB - real:,} bytes past "
                                      "them are no part of the pack (never read); the pack is damaged or appended to: "
                                      "copy the pack again"}]


def test_info_reports_what_was_checked(packs: dict[str, Path], tmp_path: Path) -> None:
    """A stray file in the folder is no part of the pack: not counted."""
    pack = copy_pack(packs["shards"], tmp_path / "p.shards")
    want = sum(p.stat().st_size for p in pack.iterdir())
    assert info(pack)["pack_bytes"] == want
    with open(pack / "notes.bin", "wb") as f:
        f.truncate(TIB)
    assert info(pack)["pack_bytes"] == want
    assert info(packs["lmdb"])["pack_bytes"] == packs["lmdb"].stat().st_size


def test_hashing_stops_at_the_listed_size(packs: dict[str, Path], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard grown after the pack was opened is hashed no further than its listed size (counted:
    the bytes read, not the time taken)."""
    import packload.core.file_hash as file_hash_module

    pack = copy_pack(packs["shards"], tmp_path / "p.shards")
    shard = pack / "shard-00000.bin"
    listed = shard.stat().st_size
    assert sha256_file(shard, listed) == sha256_file(shard) == _manifest(pack)["parts"][0]["sha256"]
    read: dict[str, int] = {}

    class Counted:
        def __init__(self, path: Path, mode: str) -> None:
            self.file = open(path, mode)  # noqa: SIM115 - closed by __exit__
            self.name = Path(path).name

        def __enter__(self) -> Counted:
            return self

        def __exit__(self, *exc: object) -> None:
            self.file.close()

        def read(self, size: int = -1) -> bytes:
            block = self.file.read(size)
            read[self.name] = read.get(self.name, 0) + len(block)
            return block

    with PackReader(pack) as reader:
        os.truncate(shard, TIB)
        monkeypatch.setattr(file_hash_module, "open", Counted, raising=False)
        problems = file_problems(reader, index=False)
    assert problems[0] == {"file": "shard-00000.bin",
                           "problem": f"larger than the {listed:,} bytes the manifest lists; the pack is damaged, or "
                                      "the file is not this pack's: copy the pack again"}
    assert read["shard-00000.bin"] <= listed + 1


def test_memory_stays_bounded_under_a_cap(packs: dict[str, Path], tmp_path: Path) -> None:
    """In a child under a 1 GiB address-space cap (well under what copying a sparse 6 GiB would take),
    every command refuses each sparse pack in one line; none runs out of memory."""
    shards = copy_pack(packs["shards"], tmp_path / "a.shards")
    _sparse_index(shards, 6 * GIB)
    manifest = _manifest(shards)
    manifest["index"]["size"] = 6 * GIB
    _set_manifest(shards, manifest)
    grown = copy_pack(packs["shards"], tmp_path / "b.shards")
    os.truncate(grown / "shard-00000.bin", TIB)
    manifest = _manifest(grown)
    manifest["parts"][0]["size"] = TIB
    _set_manifest(grown, manifest)
    script = textwrap.dedent("""
        import resource, sys
        import packload.cli
        from tests.reliability.crafted import address_space_cap
        from tests.reliability.packs import cli, one_line_error
        address_space_cap(1 << 30).__enter__()  # never left: the child ends with the commands
        bad = []
        for pack in sys.argv[1:]:
            for command in (["info", pack], ["verify", "--quiet", pack], ["verify", "--decode", "--quiet", pack],
                            ["merge", pack + ".merged.shards", pack]):
                problem = one_line_error(*cli(command))
                if problem:
                    bad.append((command, problem))
        print(bad)
    """)
    done = subprocess.run([sys.executable, "-c", script, str(shards), str(grown)], capture_output=True, text=True,
                          env=child_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
