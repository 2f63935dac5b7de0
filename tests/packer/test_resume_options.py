"""``packer.resume_options``: the options a pack notes in its manifest (packs made here) read back into
the ``EncodeOptions`` that made them, and two such records compared flag by flag, in the order
``pack`` lists its flags, for the one-line refusal of ``pack --resume`` with other options. (That
refusal on the command line is tested in test_cli_errors.py.)"""

from __future__ import annotations

from typing import Any

import pytest

from packload import PackedImageFolder, pack
from packload.packer.encode import EncodeOptions
from packload.packer.resume_options import options_changed, options_from_record
from tests.image_factory import make_image_folder

MADE = {
    "plain.lmdb": EncodeOptions(),
    "raw.shards": EncodeOptions(encoding="raw", size=(8, 12), check="full"),
    "small.shards": EncodeOptions(encoding="jpeg", quality=75, max_side=20, check="full", max_pixels=10**7),
}


@pytest.fixture(scope="module")
def noted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The ``options`` each pack of ``MADE`` notes in its manifest."""
    root = tmp_path_factory.mktemp("options")
    make_image_folder(root / "src", classes=("a", "b"), per_class=2)
    records = {}
    for name, options in MADE.items():
        pack(root / "src", root / name, options=options, workers=1, progress=False)
        records[name] = PackedImageFolder(root / name).manifest["options"]
    return records


@pytest.mark.parametrize("name", list(MADE))
def test_a_manifests_options_are_the_ones_it_was_made_with(noted: dict[str, dict[str, Any]], name: str) -> None:
    """The record holds more than the encoding (the backend, as ``--format``) and a size as a JSON list;
    read back it is the same ``EncodeOptions``, its size a tuple again."""
    record = noted[name]
    assert record["backend"] == name.split(".")[1]
    options = options_from_record(record)
    assert options == MADE[name]
    assert options.size is None or type(options.size) is tuple


def test_a_record_from_before_an_option_existed_reads_as_its_default() -> None:
    assert options_from_record({"backend": "lmdb", "encoding": "png", "future_option": 3}) == EncodeOptions("png")


def test_every_changed_flag_in_the_order_pack_lists_them(noted: dict[str, dict[str, Any]]) -> None:
    assert options_changed(noted["plain.lmdb"], noted["small.shards"]) == (
        "--format was lmdb, now shards; --encoding was keep, now jpeg; --quality was 90, now 75; "
        "--max-side was unset, now 20; --check was fast, now full; --max-pixels was unset, now 10000000")
    assert options_changed(noted["small.shards"], noted["raw.shards"]) == (
        "--encoding was jpeg, now raw; --quality was 75, now 90; --max-side was 20, now unset; "
        "--size was unset, now 8x12; --max-pixels was 10000000, now unset")


def test_what_is_not_a_change() -> None:
    """The same record; an option one record lacks and the other leaves unset; a key ``pack`` has no
    flag for is named as it is, after the flags."""
    record = {"backend": "lmdb", "encoding": "keep", "size": [8, 12]}
    assert options_changed(record, dict(record)) == "unknown"
    assert options_changed(record, {**record, "max_pixels": None}) == "unknown"
    assert options_changed({**record, "shard_size": 1 << 20}, {"max_pixels": 5, **record, "shard_size": 1 << 16}) == (
        "--max-pixels was unset, now 5; shard_size was 1048576, now 65536")
