"""``packload.mix(..., target=...)``: a mix of packs made from tables gives each record's chosen fields
beside its image, as one pack does with ``PackedImageFolder(target=...)``: one by one, through a
DataLoader, and in the whole batches of ``get_batch``, ``PackLoader`` and ``batch_loader`` (numbers as
tensors, strings as lists, in the batch's order), ``label`` being the mix's class index. A field that
a pack lacks, or that has two types, is one line naming the pack and the field."""

from __future__ import annotations

import csv
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packload import CenterCrop, PackedImageFolder, PackLoader, UsageError, batch_loader, mix, pack
from packload.packer.table_options import TableOptions
from tests.fields_source import HEADER, make_source, write_images

# The second pack's rows: other classes ("cat" in both), every attrs list 3 long, and an "extra" column
# the first pack lacks; its "id" packed as an int (a string in the first pack).
OTHER = [
    ("p.png", "bird", "30", "0.25", "false", "a bird", "[1,2,3]", "[0.5]", "9", "x1"),
    ("q.png", "cat", "31", "1.5", "true", "a cat", "[4,5,6]", "[1.0,2.0]", "10", "x2"),
    ("r.png", "bird", "32", "2.5", "true", "another bird", "[7,8,9]", "[]", "11", "x3"),
    ("s.png", "cat", "33", "3.5", "false", "cat two", "[0,0,0]", "[3.0]", "12", "x4"),
]
NAMES = ("age", "height", "smiling", "caption", "attrs", "embedding")


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``a`` (shards, the five rows of tests/fields_source.py: cat, dog, emu) and ``b`` (LMDB, ``OTHER``)."""
    base = tmp_path_factory.mktemp("mix-targets")
    first = make_source(base / "a", bad=False)
    write_images(base / "b" / "images", [row[0] for row in OTHER])
    with open(base / "b" / "labels.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([*HEADER, "extra"])
        writer.writerows(OTHER)
    made = {"a": base / "a.shards", "b": base / "b.lmdb"}
    pack(first.root, made["a"], labels=TableOptions(first.table, types={"age": "int", "attrs": "list[int]"}),
         workers=1, progress=False)
    pack(base / "b" / "images", made["b"], workers=1, progress=False,
         labels=TableOptions(base / "b" / "labels.csv", types={"age": "int", "attrs": "list[int]", "id": "int"}))
    return made


def opened(packs: dict[str, Path], **kwargs) -> list[PackedImageFolder]:
    return [PackedImageFolder(packs[name], **kwargs) for name in ("a", "b")]


def expected(mixed, index: int, name: str):
    """Field ``name`` of the mix's record ``index``, read from its own pack (``label``: the mix's class)."""
    pack_number, records = mixed.locate([index])
    own = PackedImageFolder(mixed.datasets[int(pack_number[0])].root)
    if name == "label":
        return own.targets[int(records[0])] + int(mixed.label_offsets[int(pack_number[0])])
    value = own.field(name)[int(records[0])]
    return value.tolist() if isinstance(value, np.ndarray | np.generic) else value


def test_each_record_gives_its_packs_fields(packs: dict[str, Path]) -> None:
    a, b = opened(packs)
    mixed = mix([a, b], target=("label", "caption", "age"))
    assert mixed.target == ("label", "caption", "age") and mixed.classes == ["a/cat", "dog", "emu", "bird", "b/cat"]
    for index in range(len(mixed)):
        label, caption, age = mixed[index][1]
        assert (label, caption, age) == tuple(expected(mixed, index, name) for name in ("label", "caption", "age"))
        assert label == mixed.targets[index]
    assert mixed[5][1][:2] == (3, "a bird") and mixed.classes[mixed[6][1][0]] == "b/cat"
    assert a.target is None and isinstance(a[0][1], int)  # the packs given to the mix are left as they were
    assert mix([a, b], target="caption")[8][1] == "cat two"


def test_whole_batches_hold_every_packs_values_in_order(packs: dict[str, Path]) -> None:
    mixed = mix(opened(packs), target=(*NAMES, "label"))
    order = [6, 0, 8, 2, 5, 3]  # both packs, interleaved
    images, (age, height, smiling, caption, attrs, embedding, label) = mixed.get_batch(order, crop=CenterCrop(4))
    assert images.shape == (6, 3, 4, 4)
    assert age.dtype == torch.int64 and age.tolist() == [expected(mixed, i, "age") for i in order]
    assert height.dtype == torch.float64 and height.tolist() == [expected(mixed, i, "height") for i in order]
    assert smiling.dtype == torch.bool and smiling.tolist() == [expected(mixed, i, "smiling") for i in order]
    assert caption == [expected(mixed, i, "caption") for i in order]
    assert [t.tolist() for t in attrs] == [expected(mixed, i, "attrs") for i in order]  # lengths differ: a list
    assert [t.tolist() for t in embedding] == [expected(mixed, i, "embedding") for i in order]
    assert label.dtype == torch.int64 and label.tolist() == [mixed.targets[i] for i in order]
    even = [6, 0, 8, 1, 3]  # every attrs list 3 long: one tensor, as one pack gives it
    same = mixed.get_batch(even, crop=CenterCrop(4))[1][4]
    assert isinstance(same, torch.Tensor) and same.tolist() == [expected(mixed, i, "attrs") for i in even]
    alone = mixed.get_batch([8, 5], crop=CenterCrop(4))[1]  # one pack: its own batch, labels the mix's
    own = mixed.datasets[1].get_batch([3, 0], crop=CenterCrop(4))[1]
    assert alone[6].tolist() == [4, 3] and alone[3] == own[3] == ["cat two", "a bird"]
    data, offsets, targets = mixed.get_encoded_batch(order)  # the stored bytes, and the same targets
    assert len(offsets) == 7 and targets[3] == caption and targets[0].tolist() == age.tolist()


def test_a_callable_target_and_the_callers_transform(packs: dict[str, Path]) -> None:
    def made(fields):
        return {"age": fields["age"] * 2, "label": fields["label"], "caption": fields["caption"]}

    mixed = mix(opened(packs, output="numpy", transform=lambda image: image[:4, :4]), target=made)
    order = [1, 7, 4, 5]
    images, targets = mixed.get_batch(order)  # no crop: each pack's samples through its transform
    assert images.shape == (4, 3, 4, 4)
    assert targets["age"].tolist() == [2 * expected(mixed, i, "age") for i in order]
    assert targets["label"].tolist() == [mixed.targets[i] for i in order]
    assert targets["caption"] == [expected(mixed, i, "caption") for i in order]
    cropped = mixed.get_batch(order, crop=CenterCrop(4))[1]
    assert cropped["age"].tolist() == targets["age"].tolist() and cropped["caption"] == targets["caption"]
    assert mixed.get_batch([7], crop=CenterCrop(4))[1]["label"].tolist() == [mixed.targets[7]]


def corner(image: torch.Tensor) -> torch.Tensor:
    """A transform that makes every image one size (and pickles, for workers)."""
    return image[:, :4, :4]


def test_loaders_batch_a_mix_as_they_batch_one_pack(packs: dict[str, Path]) -> None:
    mixed = mix(opened(packs, output="tensor", transform=corner), [0.5, 0.5],
                samples_per_epoch=12, target=("label", "caption"))
    order = mixed.sampler(seed=3).epoch_order().tolist()
    want = ([mixed.targets[i] for i in order], [expected(mixed, i, "caption") for i in order])
    samples = DataLoader(mixed, batch_size=5, sampler=mixed.sampler(seed=3))  # torch's default collate
    labels, captions = zip(*[(batch_labels, batch_captions) for _, (batch_labels, batch_captions) in samples],
                           strict=True)
    assert torch.cat(labels).tolist() == want[0] and [c for batch in captions for c in batch] == want[1]
    for threads in (0, 2):
        loader = PackLoader(mixed, 5, sampler=mixed.sampler(seed=3), crop=4, threads=threads)
        got = [targets for _, targets in loader]
        assert torch.cat([t[0] for t in got]).tolist() == want[0] and sum((t[1] for t in got), []) == want[1]
    workers = batch_loader(mixed, 5, sampler=mixed.sampler(seed=3), crop=4, num_workers=1)
    assert sum((captions for _, (_, captions) in workers), []) == want[1]
    encoded = PackLoader(mixed, 5, sampler=mixed.sampler(seed=3), encoded=True, threads=0)
    assert sum((targets[1] for _, _, targets in encoded), []) == want[1]
    again = pickle.loads(pickle.dumps(mixed))  # to spawned workers
    assert [again[i][1] for i in order[:4]] == [(want[0][k], want[1][k]) for k in range(4)]


def test_a_field_one_pack_lacks_is_one_line(packs: dict[str, Path]) -> None:
    with pytest.raises(UsageError, match=r"target='extra': pack 'a' \(.*a\.shards\) has no field 'extra' \(its "
                                         r"fields: age, .*\): give every pack .* fields\.get\('extra', \.\.\.\)") as got:
        mix(opened(packs), target="extra")
    assert "\n" not in str(got.value)
    with pytest.raises(UsageError, match="target=.*field 'id' is string in pack 'a' .* and int in pack 'b' .*: a "
                                         "batch takes one type; pack them with one type"):
        mix(opened(packs), target=("label", "id"))
    with pytest.raises(UsageError, match=r"target=\('label', 'nothing'\): pack 'a' .* has no field 'nothing'"):
        mix(opened(packs), target=("label", "nothing"))
    lacking = mix(opened(packs), target=lambda fields: fields["extra"])  # a callable: found out when read
    assert lacking[6][1] == "x2"
    with pytest.raises(KeyError, match=r"pack 'a' \(.*\): no field 'extra'"):
        lacking[0]
    defaulted = mix(opened(packs), target=lambda fields: fields.get("extra", "none"))  # the fix the error gives
    assert [defaulted[i][1] for i in (0, 5)] == ["none", "x1"]


def test_the_packs_own_targets_are_the_mixs(packs: dict[str, Path]) -> None:
    same = mix(opened(packs, target="caption"))
    assert same.target == "caption" and same[5][1] == "a bird"
    assert mix(opened(packs, target=["label", "age"]), target=("label", "age"))[5][1] == (3, 30)
    a, b = opened(packs)
    with pytest.raises(UsageError, match="pack 'b' was opened with target='caption' and pack 'a' with target=None: "
                                         r"a mix gives one target; .* mix\(\.\.\., target=\.\.\.\)"):
        mix([a, PackedImageFolder(packs["b"], target="caption")])
    with pytest.raises(UsageError, match="pack 'a' was opened with target='age' and the mix with target='caption'"):
        mix([PackedImageFolder(packs["a"], target="age"), b], target="caption")
    with pytest.raises(ValueError, match="give a field's name, a tuple of names, or a callable"):
        mix([a, b], target=7)
