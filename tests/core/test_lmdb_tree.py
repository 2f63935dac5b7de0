"""The pages of an LMDB file's B-tree (``packload.core.lmdb_tree``), read by ``LmdbTree`` from a real file
that py-lmdb writes (a branch level over several leaves, values inline and on overflow runs) and from
copies of it damaged one field at a time: what ``walk``, ``leaf`` and ``check_run`` give is what was
written, and each kind of damage is refused with its own message naming the file, the page and the
fix. (Whole-file agreement and bit-flip fuzzing through ``LmdbLayout`` are in
tests/core/test_lmdb_pages.py; here, the tree's own steps and their exact errors.)"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from packload.core.errors import PackFormatError
from packload.core.lmdb_meta import HEADER, P_INVALID, current_meta
from packload.core.lmdb_tree import Leaf, LmdbTree, merged
from tests.lmdb_files import lmdb_file

PAGE = mmap.PAGESIZE  # LMDB writes new files in pages of the system's size
WHERE = "t.lmdb"
FIX = "the LMDB file is damaged: copy it again"
BIG = {b"big0": b"B" * (PAGE + 1000), b"big1": b"C" * (2 * PAGE + 1000)}  # overflow runs of 2 and 3 pages


@pytest.fixture(scope="module")
def items() -> dict[bytes, bytes]:
    """A big value, enough small ones for several leaves under one branch page, another big value
    (written in that order, so that the first big value's run lies before the later leaves)."""
    small = {b"k%05d" % i: bytes([i % 251]) * 40 for i in range(100 * PAGE // 1024)}
    return {b"big0": BIG[b"big0"], **small, b"big1": BIG[b"big1"]}


@pytest.fixture(scope="module")
def good(items: dict[bytes, bytes], tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return lmdb_file(tmp_path_factory.mktemp("lmdb-tree") / "t.lmdb", items)


def tree_of(data: bytes | bytearray, **meta_changes: int) -> LmdbTree:
    meta = current_meta(data, WHERE)
    return LmdbTree(data, WHERE, replace(meta, **meta_changes) if meta_changes else meta)


def offsets(data: bytes | bytearray, pgno: int) -> list[int]:
    """The node offsets of page ``pgno``, read from its header (in key order)."""
    lower = struct.unpack_from("<H", data, pgno * PAGE + 12)[0]
    return list(struct.unpack_from(f"<{(lower - HEADER) // 2}H", data, pgno * PAGE + HEADER))


def node_at(pgno: int, data: bytes | bytearray, i: int) -> int:
    """The file offset of node ``i`` of page ``pgno``."""
    return pgno * PAGE + offsets(data, pgno)[i]


def refused(match: str, call: Callable[..., object], *args: object, **kwargs: object) -> None:
    """``call`` raises ``PackFormatError`` saying ``match`` of the file, then the fix."""
    with pytest.raises(PackFormatError) as info:
        call(*args, **kwargs)
    assert str(info.value) == f"{WHERE}: {match}; {FIX}"


# -- reading a sound file ------------------------------------------------------------------------
def test_merged_joins_touching_and_overlapping_ranges() -> None:
    assert merged([]) == []
    assert merged([(20, 1), (10, 5), (0, 5), (5, 2), (15, 5)]) == [(0, 7), (10, 11)]
    assert merged([(0, 10), (2, 3)]) == [(0, 10)] and merged([(0, 4), (5, 4)]) == [(0, 4), (5, 4)]


def test_walk_gives_the_leaves_in_key_order_with_their_bounds(good: bytes, items: dict[bytes, bytes]) -> None:
    tree = tree_of(good)
    leaves = tree.walk()
    meta = tree.meta
    assert meta.depth == 2 and len(leaves) == meta.leaf_pages >= 3 and meta.branch_pages == 1
    assert tree.tree_pages == sorted([meta.root] + [pgno for pgno, _, _ in leaves])
    assert leaves[0][1] == b"" and leaves[-1][2] is None
    assert all(high == following[1] for (_, _, high), following in zip(leaves, leaves[1:], strict=False))
    keys = []
    for pgno, low, high in leaves:
        leaf = tree.leaf(pgno, low, high)
        assert all(low <= key and (high is None or key < high) for key in leaf.keys)
        keys += leaf.keys
    assert keys == sorted(items)


def test_each_value_lies_where_the_leaf_says(good: bytes, items: dict[bytes, bytes]) -> None:
    tree = tree_of(good)
    runs = {}
    for pgno, low, high in tree.walk():
        leaf = tree.leaf(pgno, low, high)
        assert isinstance(leaf, Leaf) and len(leaf.keys) == len(leaf.offsets) == len(leaf.sizes)
        for i, (key, offset, size) in enumerate(zip(leaf.keys, leaf.offsets, leaf.sizes, strict=True)):
            assert good[offset:offset + size] == items[key], key
            if i in leaf.unchecked:  # on an overflow run: 16 bytes into its first page
                first = leaf.unchecked[i]
                assert offset == first * PAGE + HEADER
                runs[key] = tree.check_run(pgno, i, first, size)
    assert {key: pages for key, (_, pages) in runs.items()} == {b"big0": 2, b"big1": 3}


def test_an_empty_database_has_no_leaves(tmp_path: Path) -> None:
    data = lmdb_file(tmp_path / "empty.lmdb", {})
    tree = tree_of(data)
    assert tree.meta.root == P_INVALID and tree.walk() == [] and tree.tree_pages == []


def test_the_prefetch_hook_is_told_merged_ranges(good: bytes) -> None:
    told: list[list[tuple[int, int]]] = []
    meta = current_meta(good, WHERE)
    tree = LmdbTree(good, WHERE, meta, prefetch=told.append)
    tree.fetch([])  # nothing to read: nothing told
    tree.fetch([(3 * PAGE, PAGE), (2 * PAGE, PAGE), (9 * PAGE, HEADER)])
    assert told == [[(2 * PAGE, 2 * PAGE), (9 * PAGE, HEADER)]]
    LmdbTree(good, WHERE, meta).fetch([(0, 1)])  # no hook: no error


def test_a_closed_tree_reads_nothing(good: bytes) -> None:
    tree = tree_of(good)
    pgno, low, high = tree.walk()[0]
    tree.close()
    for call, args in ((tree.leaf, (pgno, low, high)), (tree.check_run, (pgno, 0, 3, 10))):
        with pytest.raises(ValueError, match=f"^{WHERE}: the LMDB layout is closed$"):
            call(*args)


# -- damage: the meta's pages ----------------------------------------------------------------------
def test_a_root_outside_the_database(good: bytes) -> None:
    meta = current_meta(good, WHERE)
    last = meta.last_pgno
    refused(f"LMDB page {meta.page}: the root page (page {last + 1}) lies outside the database (pages 2..{last})",
            tree_of, good, root=last + 1)


def test_a_file_cut_before_its_root(good: bytes) -> None:
    meta = current_meta(good, WHERE)
    cut = good[: meta.root * PAGE]  # the root page and everything after it gone
    refused(f"LMDB page {meta.page}: the root page (page {meta.root}) lies past the end of the file "
            f"({meta.root} pages): truncated?", tree_of, cut)


# -- damage: branch pages --------------------------------------------------------------------------
def test_a_child_outside_the_database(good: bytes) -> None:
    data = bytearray(good)
    meta = current_meta(data, WHERE)
    root = meta.root
    struct.pack_into("<HH", data, node_at(root, data, 1), 1, 0)  # the child's page number: 1, a meta page
    refused(f"LMDB page {root}: a child page (page 1) lies outside the database (pages 2..{meta.last_pgno})",
            tree_of(data).walk)


def test_a_child_reached_twice(good: bytes) -> None:
    data = bytearray(good)
    root = current_meta(data, WHERE).root
    first_child = struct.unpack_from("<H", data, node_at(root, data, 0))[0]
    struct.pack_into("<H", data, node_at(root, data, 2), first_child)
    refused(f"LMDB page {root}: page {first_child} is reached twice", tree_of(data).walk)


def test_branch_keys_out_of_order(good: bytes) -> None:
    data = bytearray(good)
    root = current_meta(data, WHERE).root
    order = offsets(data, root)
    order[2], order[3] = order[3], order[2]
    struct.pack_into(f"<{len(order)}H", data, root * PAGE + HEADER, *order)
    refused(f"LMDB page {root}: node 3's key is out of order", tree_of(data).walk)


def test_a_branch_without_children_and_a_key_past_its_page(good: bytes) -> None:
    data = bytearray(good)
    root = current_meta(data, WHERE).root
    struct.pack_into("<H", data, root * PAGE + 12, HEADER)  # lower: no node offsets
    refused(f"LMDB page {root}: a branch page without children", tree_of(data).walk)
    data = bytearray(good)
    struct.pack_into("<H", data, node_at(root, data, 1) + 6, PAGE)  # the key's size
    refused(f"LMDB page {root}: node 1's key runs past the page", tree_of(data).walk)


# -- damage: leaf pages ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def first_leaf(good: bytes) -> tuple[int, int]:
    """The first leaf page (big0 and big1 first in it, then small values) and the first page of
    big0's overflow run."""
    tree = tree_of(good)
    leaves = tree.walk()
    return leaves[0][0], tree.leaf(*leaves[0]).unchecked[0]


def damaged_leaf(good: bytes, first_leaf: tuple[int, int], change: Callable[[bytearray, int], None]) -> str:
    """The message of reading the first leaf of a copy of the file changed by ``change(data, pgno)``."""
    data = bytearray(good)
    pgno = first_leaf[0]
    change(data, pgno)
    tree = tree_of(data)
    _, low, high = tree.walk()[0]  # the branch is sound: the walk reads no leaf
    with pytest.raises(PackFormatError) as info:
        tree.leaf(pgno, low, high)
    return str(info.value)


def test_a_branch_page_read_as_a_leaf(good: bytes) -> None:
    tree = tree_of(good)
    tree.walk()
    root = tree.meta.root
    refused(f"LMDB page {root}: flags 0x1 where a leaf page (0x2) belongs", tree.leaf, root, b"", None)


def test_leaf_damage_is_named(good: bytes, first_leaf: tuple[int, int]) -> None:
    pgno = first_leaf[0]
    upper = struct.unpack_from("<H", good, pgno * PAGE + 14)[0]

    def lower_odd(data: bytearray, page: int) -> None:
        struct.pack_into("<H", data, page * PAGE + 12, HEADER + 1)

    def offset_below_upper(data: bytearray, page: int) -> None:
        struct.pack_into("<H", data, page * PAGE + HEADER, 5)

    def swapped(data: bytearray, page: int) -> None:
        order = offsets(data, page)
        struct.pack_into("<2H", data, page * PAGE + HEADER, order[1], order[0])

    def flags(value: int) -> Callable[[bytearray, int], None]:
        return lambda data, page: struct.pack_into("<H", data, node_at(page, data, 2) + 4, value)

    def value_past_the_page(data: bytearray, page: int) -> None:
        struct.pack_into("<H", data, node_at(page, data, 2), PAGE)  # node 2 is inline: its size

    assert damaged_leaf(good, first_leaf, lower_odd) == (
        f"{WHERE}: LMDB page {pgno}: node array bounds lower {HEADER + 1}, upper {upper}; {FIX}")
    assert damaged_leaf(good, first_leaf, offset_below_upper) == (
        f"{WHERE}: LMDB page {pgno}: node 0 at offset 5, outside {upper}..{PAGE - 8}; {FIX}")
    assert damaged_leaf(good, first_leaf, swapped) == f"{WHERE}: LMDB page {pgno}: node 1's key is out of order; {FIX}"
    assert damaged_leaf(good, first_leaf, flags(0x8)) == (
        f"{WHERE}: LMDB page {pgno}: node 2 has unknown flags 0x8; {FIX}")
    assert damaged_leaf(good, first_leaf, flags(0x4)) == (
        f"{WHERE}: LMDB page {pgno}: node 2 holds a sub-database or duplicates (flags 0x4); packload reads LMDB "
        "files with one unnamed database and no DUPSORT: give the .lmdb file `pack` wrote, or if it is one, "
        f"{FIX}")
    assert damaged_leaf(good, first_leaf, value_past_the_page) == (
        f"{WHERE}: LMDB page {pgno}: node 2 runs past the page; {FIX}")


def test_overlapping_nodes(good: bytes, first_leaf: tuple[int, int]) -> None:
    """An inline value one byte longer runs into the node stored right after it."""
    pgno = first_leaf[0]
    extents = []
    for i, at in enumerate(offsets(good, pgno)):
        lo, _, node_flags, key_size = struct.unpack_from("<HHHH", good, pgno * PAGE + at)
        if not node_flags:
            extents.append((at, at + 8 + key_size + lo, i))
    at, end, i = next((a, e, i) for a, e, i in extents if any(start == e for start, _, _ in extents))

    def longer(data: bytearray, page: int) -> None:
        struct.pack_into("<H", data, page * PAGE + at, struct.unpack_from("<H", data, page * PAGE + at)[0] + 1)

    assert damaged_leaf(good, first_leaf, longer) == f"{WHERE}: LMDB page {pgno}: nodes overlap at offset {end}; {FIX}"


def test_keys_outside_the_bounds_the_branch_gives(good: bytes) -> None:
    tree = tree_of(good)
    leaves = tree.walk()
    pgno, low, high = leaves[1]
    keys = tree.leaf(pgno, low, high).keys
    refused(f"LMDB page {pgno}: node 0's key is out of order", tree.leaf, pgno, keys[0] + b"\0", high)
    refused(f"LMDB page {pgno}: node {len(keys) - 1}'s key is above its branch's bound", tree.leaf, pgno, low,
            keys[-1])


def test_an_overflow_value_pointing_at_the_tree_or_past_the_database(good: bytes, first_leaf: tuple[int, int]) -> None:
    pgno = first_leaf[0]
    last = current_meta(good, WHERE).last_pgno
    size = len(BIG[b"big0"])

    def run_at(page_number: int) -> Callable[[bytearray, int], None]:
        return lambda data, page: struct.pack_into("<Q", data, node_at(page, data, 0) + 8 + 4, page_number)

    assert damaged_leaf(good, first_leaf, run_at(pgno)) == (
        f"{WHERE}: LMDB page {pgno}: node 0's value (from page {pgno}) lies over a page of the tree; {FIX}")
    assert damaged_leaf(good, first_leaf, run_at(last)) == (
        f"{WHERE}: LMDB page {pgno}: node 0's value of {size} bytes (pages {last}..{last + 1}) lies outside the "
        f"database (pages 2..{last}); {FIX}")


# -- damage: overflow runs -------------------------------------------------------------------------
def test_overflow_run_headers(good: bytes, first_leaf: tuple[int, int]) -> None:
    leaf_page, first = first_leaf
    size = len(BIG[b"big0"])
    last = current_meta(good, WHERE).last_pgno

    def checked(change: Callable[[bytearray], None]) -> str:
        data = bytearray(good)
        change(data)
        tree = tree_of(data)
        tree.walk()
        with pytest.raises(PackFormatError) as info:
            tree.check_run(leaf_page, 0, first, size)
        return str(info.value)

    assert tree_of(good).check_run(leaf_page, 0, first, size) == (first, 2)
    assert checked(lambda d: struct.pack_into("<Q", d, first * PAGE, 99)) == (
        f"{WHERE}: LMDB page {first}: the overflow page of leaf {leaf_page}'s node 0 says page 99, flags 0x4; {FIX}")
    assert checked(lambda d: struct.pack_into("<H", d, first * PAGE + 10, 0x2)) == (
        f"{WHERE}: LMDB page {first}: the overflow page of leaf {leaf_page}'s node 0 says page {first}, flags 0x2; "
        f"{FIX}")
    assert checked(lambda d: struct.pack_into("<I", d, first * PAGE + 12, 1)) == (
        f"{WHERE}: LMDB page {first}: an overflow run of 1 pages for a value of {size} bytes; {FIX}")
    assert checked(lambda d: struct.pack_into("<I", d, first * PAGE + 12, 50)) == (
        f"{WHERE}: LMDB page {first}: the overflow run (pages {first}..{first + 49}) lies outside the database "
        f"(pages 2..{last}); {FIX}")
    tree = tree_of(good)
    tree.walk()
    tree_page = min(page for page in tree.tree_pages if page > first + 1)  # a leaf written after big0's run
    covering = tree_page - first + 1
    assert checked(lambda d: struct.pack_into("<I", d, first * PAGE + 12, covering)) == (
        f"{WHERE}: LMDB page {first}: an overflow run of {covering} pages over a page of the tree; {FIX}")
