"""What a reader checks of a pack's index before it trusts it (``packload.loaders.read_checks``): that
it agrees with the manifest (its count, its labels inside the classes, or none in an unlabelled
pack) and with itself, and, where asked, that its bytes have the manifest's sha256; each refusal
one line naming the pack and what to do."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from packload import pack
from packload.core.errors import ChecksumError, PackFormatError
from packload.core.manifest import Manifest
from packload.loaders.read import PackReader
from packload.loaders.read_checks import check_index_agrees, check_index_digest
from tests.image_factory import make_image_folder, write_image

WHERE = "/data/p.shards"  # how the reader names the pack in its messages


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Manifest, np.ndarray, bytes]]:
    """(manifest, index entries, index bytes) of a labelled pack of 3 classes and of an unlabelled
    one (images with no class folders)."""
    root = tmp_path_factory.mktemp("read-checks")
    make_image_folder(root / "labelled", classes=("a", "b", "c"), per_class=2)
    for k in range(4):
        write_image(root / "flat" / f"img_{k}.jpg", seed=k)
    out = {}
    for name in ("labelled", "flat"):
        pack(root / name, root / f"{name}.shards", progress=False)
        with PackReader(root / f"{name}.shards") as reader:
            out[name] = (Manifest(reader.manifest), reader.entries.copy(), bytes(reader.index_bytes()))
    assert out["flat"][0].labelled is False and out["flat"][1]["label"].tolist() == [-1] * 4
    return out


def _with_labels(entries: np.ndarray, **labels: int) -> np.ndarray:
    """A copy of ``entries`` with record ``r<k>``'s label set: ``r2=-1``."""
    changed = entries.copy()
    for record, label in labels.items():
        changed["label"][int(record[1:])] = label
    return changed


def _refused(manifest: dict[str, Any], entries: np.ndarray) -> str:
    with pytest.raises(PackFormatError) as info:
        check_index_agrees(manifest, entries, WHERE)
    text = str(info.value)
    assert text.startswith(f"{WHERE}: ") and "\n" not in text and text.endswith("the pack is damaged")
    return text


def test_an_index_that_agrees_passes(packs):
    for manifest, entries, _ in packs.values():
        check_index_agrees(manifest, entries, WHERE)
    manifest = packs["labelled"][0].copy()
    manifest["records"] = 0
    check_index_agrees(manifest, packs["labelled"][1][:0], WHERE)  # an empty pack: nothing to disagree


@pytest.mark.parametrize("labels", [{"r2": -1}, {"r0": -2}, {"r5": 3}, {"r1": -(2 ** 31)}],
                         ids=["unlabelled record", "below -1", "past the classes", "far below"])
def test_a_label_outside_a_labelled_packs_classes_is_refused(packs, labels):
    manifest, entries, _ = packs["labelled"]
    assert "labels outside the manifest's 3 classes" in _refused(manifest, _with_labels(entries, **labels))


@pytest.mark.parametrize("labels", [{"r0": 0}, {"r3": -2}], ids=["a class", "below -1"])
def test_an_unlabelled_pack_holds_no_label(packs, labels):
    manifest, entries, _ = packs["flat"]
    assert "labels outside the manifest's 0 classes" in _refused(manifest, _with_labels(entries, **labels))
    named = manifest.copy()
    named["classes"], named["labelled"] = ["a", "b"], False  # classes listed, but said to be unlabelled
    check_index_agrees(named, entries, WHERE)
    assert "outside the manifest's 2 classes" in _refused(named, _with_labels(entries, r1=1))


def test_the_count_and_the_entries_themselves_are_checked(packs):
    manifest, entries, _ = packs["labelled"]
    more = manifest.copy()
    more["records"] = len(entries) + 1
    assert f"manifest says {len(entries) + 1} records, index holds {len(entries)}" in _refused(more, entries)
    flat = entries.copy()
    flat["height"][4] = 0
    assert "record 4: index height 0 is not an image's" in _refused(manifest, flat)
    raw = entries.copy()
    raw["format"][1] = 0  # a raw payload in a pack of encoded files
    assert "record 1: a raw payload in a pack of encoding 'keep'" in _refused(manifest, raw)


def test_the_index_digest_is_the_manifests(packs):
    manifest, _, index = packs["labelled"]
    check_index_digest(manifest, index, WHERE)
    damaged = bytearray(index)
    damaged[-1] ^= 0x01  # one bit of the last path
    without = manifest.copy()
    del without["index"]
    for checked, data in ((manifest, bytes(damaged)), (manifest, index[:-1]), (without, index)):
        with pytest.raises(ChecksumError) as info:
            check_index_digest(checked, data, WHERE)
        text = str(info.value)
        assert text.startswith(f"{WHERE}: the index does not match the sha256 in the manifest") and "\n" not in text
        assert "re-copy it, or run `packload verify` on it" in text

