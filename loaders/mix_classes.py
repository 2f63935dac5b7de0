"""The class list of a mix of packs, and where each pack's class indices land in it.

The rule (docs/MIXING.md): packs whose class lists are identical (the same names in the same order)
share them, and a label means the same class whichever pack it comes from. Otherwise the classes are
kept apart: pack ``p``'s class ``i`` becomes ``offset[p] + i``, the packs' lists laid end to end, and a
class name found in more than one pack is written ``"<pack name>/<class>"`` in each, so that
``class_to_idx`` has one entry per class. Names found in one pack only stay as they are.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import PurePosixPath

__all__ = ["merge_classes", "pack_names"]


def pack_names(roots: Sequence[str | os.PathLike[str]], names: Sequence[str] | None = None) -> list[str]:
    """Each pack's name: ``names`` if given (distinct, non-empty strings), else the last part of its
    path without its suffix (``clean`` for ``data/clean.shards``); names two packs would share get
    ``#<pack number>`` appended (``train#0``, ``train#1``)."""
    if names is not None:
        if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
            raise TypeError(f"names must be a list of strings, one per pack, got {type(names).__name__}")
        if len(names) != len(roots):
            raise ValueError(f"names has {len(names)} entries for {len(roots)} packs; give one name per pack")
        for k, name in enumerate(names):
            if not isinstance(name, str) or not name:
                raise ValueError(f"names[{k}] must be a non-empty string, got {name!r}")
        repeated = sorted(name for name, count in Counter(names).items() if count > 1)
        if repeated:
            raise ValueError(f"names must differ from pack to pack; {repeated} given more than once")
        return list(names)
    stems = []
    for root in roots:
        name = PurePosixPath(str(root).replace("\\", "/").rstrip("/")).name
        stems.append(name.split(".", 1)[0] or name)
    counts = Counter(stems)
    return [f"{stem}#{k}" if counts[stem] > 1 else stem for k, stem in enumerate(stems)]


def merge_classes(class_lists: Sequence[Sequence[str]], names: Sequence[str]) -> tuple[list[str], list[int]]:
    """(the mix's class list, the offset added to each pack's labels), by the rule above."""
    first = list(class_lists[0])
    if all(list(classes) == first for classes in class_lists):
        return first, [0] * len(class_lists)
    seen_in = Counter(name for classes in class_lists for name in set(classes))
    merged: list[str] = []
    offsets = []
    for pack, classes in zip(names, class_lists, strict=True):
        offsets.append(len(merged))
        merged += [f"{pack}/{name}" if seen_in[name] > 1 else name for name in classes]
    clashes = sorted(name for name, count in Counter(merged).items() if count > 1)
    if clashes:  # a class literally named "<pack>/<class>" in another pack
        raise ValueError(f"the mix's class names {clashes} would name two classes; give mix(names=...) "
                         "pack names that no class name starts with")
    return merged, offsets
