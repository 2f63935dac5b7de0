"""Whether a shards pack at a URL is still the one a reader opened (``packload.loaders.remote_pin``):
the pin's look at the manifest there now (by its version, else by its bytes, through a connection
of its own), its error, and the check of a fetched block's records against the index opened (a
few CRC-32s: another pack's bytes raise the pin's error, damage is left to the records' checks)."""

from __future__ import annotations

import hashlib
import types
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install -e '.[dev]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")

from packload.core.errors import PackChangedError  # noqa: E402
from packload.core.format import MANIFEST_NAME  # noqa: E402
from packload.core.remote import RemoteStore  # noqa: E402
from packload.loaders import remote_pin  # noqa: E402
from packload.loaders.read import PackReader  # noqa: E402
from packload.loaders.remote_pin import RECORDS_CHECKED, BlockCheck, ChangedWhileOpening, PackPin  # noqa: E402
from tests.remote_packs import filesystem, options, other_packs, store_with_bucket, upload  # noqa: E402

BUCKET = "bkt-pin"  # moto keeps one store per process: a bucket of this file's own


@pytest.fixture(scope="module")
def store():
    with store_with_bucket(BUCKET) as s:
        yield s


@pytest.fixture(scope="module")
def packs(tmp_path_factory) -> dict[str, Path]:
    """Two shards packs of other images, each of one shard (16 records)."""
    return other_packs(tmp_path_factory.mktemp("pin"), per_class=8, shard_size=1 << 20)


def _manifest(pack: Path) -> bytes:
    return (pack / MANIFEST_NAME).read_bytes()


def _opened(store, url: str, pack: Path, versions: bool = True) -> PackPin:
    """The pin of an open of ``url`` (``pack`` there): the versions its listing found (none where
    ``versions`` is False: a store that gives none), the sha256 of the manifest it read."""
    remote = RemoteStore(url, options(store))
    remote.listing()
    return PackPin(remote, dict(remote.tags) if versions else {}, hashlib.sha256(_manifest(pack)).hexdigest())


def test_the_pin_sees_the_manifest_replaced_or_gone_and_says_to_open_again(store, packs, tmp_path):
    url = upload(store, packs["a"], BUCKET, f"{tmp_path.name}/p.shards")
    pin = _opened(store, url, packs["a"])
    tags = dict(pin.store.tags)
    assert MANIFEST_NAME in pin.tags
    fs = filesystem(store)
    manifest = f"{BUCKET}/{tmp_path.name}/p.shards/{MANIFEST_NAME}"
    assert not pin.changed_now()
    pin.refuse_if_changed_while_opening()
    fs.pipe_file(manifest, _manifest(packs["a"]))  # written again, the same bytes: the same version
    assert not pin.changed_now()
    fs.pipe_file(manifest, _manifest(packs["b"]))
    assert pin.changed_now()
    with pytest.raises(ChangedWhileOpening):
        pin.refuse_if_changed_while_opening()
    fs.rm(manifest)
    assert pin.changed_now()
    assert pin.store.tags == tags  # the looks went through a connection of their own: the open's pins stay
    error = pin.error()
    assert isinstance(error, PackChangedError) and "\n" not in str(error)
    assert str(error).startswith(f"{url}: the pack changed since it was opened")
    assert "open it again (create the dataset again)" in str(error)


def test_without_versions_the_manifests_bytes_decide(store, packs, tmp_path):
    url = upload(store, packs["a"], BUCKET, f"{tmp_path.name}/p.shards")
    pin = _opened(store, url, packs["a"], versions=False)
    manifest = f"{BUCKET}/{tmp_path.name}/p.shards/{MANIFEST_NAME}"
    assert not pin.changed_now()
    filesystem(store).pipe_file(manifest, _manifest(packs["b"]))
    assert pin.changed_now()
    filesystem(store).pipe_file(manifest, _manifest(packs["a"]))  # the one opened, back again
    assert not pin.changed_now()


# -- the check of a fetched block ---------------------------------------------------------------
class FakePin:
    """A pin whose answer to "is the manifest there now another?" the test chooses; counts the asks."""

    def __init__(self, changed: bool) -> None:
        self.changed = changed
        self.asked = 0
        self.raised = PackChangedError("s3://bkt/p.shards: the pack changed since it was opened")

    def changed_now(self) -> bool:
        self.asked += 1
        return self.changed

    def error(self) -> PackChangedError:
        return self.raised


@pytest.fixture(scope="module")
def shard(packs) -> tuple[np.ndarray, bytes]:
    """(index entries, the bytes of its one shard) of pack ``a``."""
    with PackReader(packs["a"]) as reader:
        assert len(reader.part_names) == 1 and reader.records == 16
        return reader.entries.copy(), (packs["a"] / reader.part_names[0]).read_bytes()


def _damaged(data: bytes, entries: np.ndarray, record: int) -> bytes:
    """``data`` (a whole shard) with one byte of record ``record``'s payload flipped."""
    out = bytearray(data)
    out[int(entries["payload_offset"][record]) + 1] ^= 0xFF
    return bytes(out)


def test_an_intact_block_asks_nothing(shard):
    entries, data = shard
    pin = FakePin(changed=True)
    check = BlockCheck(entries, pin)
    check(0, 0, data)
    start = int(entries["record_offset"][5])
    check(0, start, data[start : start + 5000])
    assert pin.asked == 0


def test_a_record_of_another_pack_raises_the_pins_error_and_damage_is_left_alone(shard):
    entries, data = shard
    start = int(entries["record_offset"][6])  # a block in the middle of the shard: offsets from its start
    stop = int(entries["payload_offset"][8] + entries["payload_len"][8])
    block = _damaged(data, entries, 7)[start:stop]
    changed = FakePin(changed=True)
    with pytest.raises(PackChangedError) as info:
        BlockCheck(entries, changed)(0, start, block)
    assert info.value is changed.raised and changed.asked == 1
    damaged = FakePin(changed=False)  # the manifest is still the one opened: damage on the store
    assert BlockCheck(entries, damaged)(0, start, block) is None and damaged.asked == 1


def test_only_records_lying_wholly_in_the_block_are_compared(shard):
    entries, data = shard
    end = int(entries["payload_offset"][3] + entries["payload_len"][3])
    pin = FakePin(changed=True)
    damaged = _damaged(data, entries, 3)
    BlockCheck(entries, pin)(0, 0, damaged[: end - 1])  # record 3 cut at the block's end
    start = int(entries["payload_offset"][3]) + 1  # and at its start, the flipped byte in the block
    BlockCheck(entries, pin)(0, start, damaged[start:end])
    assert pin.asked == 0
    with pytest.raises(PackChangedError):
        BlockCheck(entries, pin)(0, 0, damaged[:end])


@pytest.mark.parametrize("record", [0, 15])
def test_at_most_a_few_records_are_compared_the_first_and_last_among_them(shard, monkeypatch, record):
    entries, data = shard
    computed = []

    def crc32(view) -> int:
        computed.append(len(view))
        return zlib.crc32(view)

    monkeypatch.setattr(remote_pin, "zlib", types.SimpleNamespace(crc32=crc32))
    pin = FakePin(changed=True)
    BlockCheck(entries, pin)(0, 0, data)
    assert len(computed) == RECORDS_CHECKED < len(entries) and pin.asked == 0
    with pytest.raises(PackChangedError):
        BlockCheck(entries, pin)(0, 0, _damaged(data, entries, record))
