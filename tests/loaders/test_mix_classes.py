"""``loaders.mix_classes``: packs' names from their paths, and one class list for a mix that keeps
the packs' class indices apart unless every pack has the same list, in the same order. (``mix()``
on packs made here is tested in test_mix.py.)"""

from __future__ import annotations

from pathlib import Path, PureWindowsPath
from typing import Any

import pytest

from packload.loaders.mix_classes import merge_classes, pack_names


def test_names_from_paths() -> None:
    """The last part of the path up to its first dot, whatever separator or trailing slash it has."""
    roots = ["data/clean.shards", Path("/x/web.v2.lmdb"), "s3://bucket/curated.shards/", "C:\\packs\\night.lmdb",
             PureWindowsPath("D:/old/plain"), ".hidden"]
    assert pack_names(roots) == ["clean", "web", "curated", "night", "plain", ".hidden"]


def test_names_two_packs_would_share_are_numbered() -> None:
    """``#<pack number>`` (its place among all the packs) on every pack of a shared name, and on those only."""
    roots = ["a/train.shards", "b/val.lmdb", "c/train.lmdb", "d/train"]
    assert pack_names(roots) == ["train#0", "val", "train#2", "train#3"]


def test_names_given_are_kept_or_refused_in_one_line() -> None:
    assert pack_names(["a.shards", "a.lmdb"], ("web", "curated")) == ["web", "curated"]
    cases: list[tuple[Any, type[Exception], str]] = [
        ("web", TypeError, "names must be a list of strings, one per pack, got str"),
        ({"web": 1, "x": 2}, TypeError, "names must be a list of strings, one per pack, got dict"),
        (["web"], ValueError, "names has 1 entries for 2 packs; give one name per pack"),
        (["web", ""], ValueError, "names[1] must be a non-empty string, got ''"),
        ([None, "x"], ValueError, "names[0] must be a non-empty string, got None"),
        (["b", "b"], ValueError, "names must differ from pack to pack; ['b'] given more than once"),
    ]
    for names, error, message in cases:
        with pytest.raises(error) as caught:
            pack_names(["a.shards", "a.lmdb"], names)
        assert str(caught.value) == message


def test_one_class_list_is_shared() -> None:
    lists = [["cat", "dog"], ("cat", "dog"), ["cat", "dog"]]
    assert merge_classes(lists, ["a", "b", "c"]) == (["cat", "dog"], [0, 0, 0])
    assert merge_classes([["cat"]], ["only"]) == (["cat"], [0])


@pytest.mark.parametrize(("lists", "merged", "offsets"), [
    # the same names in another order are another list: "cat" would mean class 0 in one pack, 1 in the other
    ([["cat", "dog"], ["dog", "cat"]], ["a/cat", "a/dog", "b/dog", "b/cat"], [0, 2]),
    # a list that is a prefix of the other is another list too
    ([["cat", "dog"], ["cat", "dog", "fox"]], ["a/cat", "a/dog", "b/cat", "b/dog", "fox"], [0, 2]),
    # two packs agreeing does not let them share while a third differs
    ([["x"], ["x"], ["y"]], ["a/x", "b/x", "y"], [0, 1, 2]),
    # no name in common: the lists end to end, unprefixed; a pack with no classes takes no room
    ([["bird"], [], ["cat", "dog"]], ["bird", "cat", "dog"], [0, 1, 1]),
])
def test_other_class_lists_are_kept_apart(lists: list[list[str]], merged: list[str], offsets: list[int]) -> None:
    """Pack p's class i becomes offsets[p] + i, whose name is its own, prefixed by its pack's name when
    another pack has a class of that name; no two of the mix's classes have the same name."""
    names = ["a", "b", "c"][: len(lists)]
    assert merge_classes(lists, names) == (merged, offsets)
    for pack, (name, classes) in enumerate(zip(names, lists, strict=True)):
        for i, own in enumerate(classes):
            assert merged[offsets[pack] + i] in (own, f"{name}/{own}")
    assert len(set(merged)) == len(merged)


def test_a_class_named_like_a_prefixed_one_is_refused() -> None:
    """Pack b has a class literally called "a/x": prefixing a's "x" would give two classes one name."""
    with pytest.raises(ValueError) as caught:
        merge_classes([["x"], ["x", "a/x"]], ["a", "b"])
    assert str(caught.value) == ("the mix's class names ['a/x'] would name two classes; give mix(names=...) pack "
                                 "names that no class name starts with")
    assert merge_classes([["x"], ["x", "a/x"]], ["web", "b"])[0] == ["web/x", "b/x", "a/x"]  # the fix it names
