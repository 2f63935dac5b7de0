"""The fields of a pack made from a table, read: whole columns, one record's values, and batches.

``PackFields`` decodes the pack's fields part (``core.fields``) once per process, as views of the
pack's own bytes (a shards pack's ``fields.bin`` mapped, an LMDB pack's ``#fields`` value), so
reading one field of every record touches that column's pages only. Numbers and booleans come as
NumPy arrays; a string column as a ``StringColumn`` (a sequence of ``str`` over the UTF-8 bytes and
their offsets, no Python object per record until one is asked for); a list column as a
``ListColumn`` (a sequence of NumPy arrays).

``Target`` is what ``PackedImageFolder(target=...)`` returns beside each image: a field's name,
a tuple of names, or a callable given a mapping of the record's fields (``label``, the class index,
among them); it also batches them: numbers as tensors, strings as lists.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from packload.core.errors import ChecksumError, PackFormatError, UsageError
from packload.core.fields import Column, check_columns_match, decode_fields
from packload.core.manifest import Manifest
from packload.loaders.field_columns import FieldColumn, ListColumn, StringColumn
from packload.loaders.read import PackReader

LABEL = "label"  # the name the class index goes by among a record's fields


def field_types(manifest: Manifest) -> dict[str, str]:
    """``{name: type}`` of a pack's fields, as its manifest lists them (empty without a table)."""
    fields = manifest.fields
    return {c["name"]: c["type"] for c in fields["columns"]} if fields else {}


class PackFields:
    """The fields of one open pack (``reader``), decoded from its fields part. ``check``: compare the
    part with the manifest's sha256 first (what ``verify=True`` readers do)."""

    def __init__(self, reader: PackReader, check: bool = False) -> None:
        self.reader = reader
        listed = reader.manifest.fields
        self.columns: dict[str, Column] = {}
        if not listed:
            return
        where = f"{reader.path}: fields ({listed['name']})"
        data = reader.fields_bytes()
        if check and hashlib.sha256(data).hexdigest() != listed["sha256"]:
            raise ChecksumError(f"{where}: does not match the sha256 in the manifest; the pack is damaged: re-copy "
                                "it, or run `packload verify` on it")
        columns = decode_fields(data, where, reader.records)
        check_columns_match(columns, listed["columns"], where)
        self.columns = {column.name: column for column in columns}

    @property
    def types(self) -> dict[str, str]:
        return {name: column.type for name, column in self.columns.items()}

    def column(self, name: str) -> FieldColumn:
        """The field ``name`` of every record: a NumPy array for numbers and booleans, a
        ``StringColumn`` or ``ListColumn`` otherwise. ``label`` gives the class indices."""
        if name == LABEL:
            return self.reader.labels()
        column = self._get(name)
        if column.type == "bool":
            return column.values.view(np.bool_)
        if column.type == "string":
            return StringColumn(column)
        if column.offsets is not None:
            return ListColumn(column)
        return column.values

    def _get(self, name: str) -> Column:
        column = self.columns.get(name)
        if column is None:
            raise KeyError(_no_field(name, self.types))
        return column

    def value(self, name: str, i: int) -> Any:
        """Record ``i``'s value of field ``name`` (``label``: its class index)."""
        if name == LABEL:
            return int(self.reader.entries["label"][i])
        column = self._get(name)
        if column.offsets is not None and column.type != "string":
            return np.array(column.values[int(column.offsets[i]) : int(column.offsets[i + 1])])
        return column.value(i)

    def batch(self, name: str, indices: np.ndarray) -> torch.Tensor | list[Any]:
        """Field ``name`` of the records ``indices``, batched: numbers and booleans as a tensor, lists of
        one length as a 2-D tensor (else a list of 1-D tensors), strings as a list of ``str``."""
        indices = np.asarray(indices, dtype=np.int64)
        if name == LABEL:
            return torch.from_numpy(self.reader.entries["label"][indices].astype(np.int64))
        column = self._get(name)
        if column.offsets is None:
            values = column.values[indices]
            return torch.from_numpy(values.astype(np.bool_) if column.type == "bool" else values)
        if column.type == "string":
            return [column.value(i) for i in indices.tolist()]
        starts, stops = column.offsets[indices].astype(np.int64), column.offsets[indices + 1].astype(np.int64)
        lengths = stops - starts
        if len(lengths) and (lengths == lengths[0]).all():
            width = int(lengths[0])
            take = starts[:, None] + np.arange(width)[None, :]
            return torch.from_numpy(column.values[take].reshape(len(indices), width))
        return [torch.from_numpy(np.array(column.values[a:b])) for a, b in zip(starts.tolist(), stops.tolist(),
                                                                             strict=True)]


def _no_field(name: str, types: Mapping[str, str]) -> str:
    if not types:
        return (f"no field {name!r}: this pack has no fields (pack a table beside the images with "
                "`pack SRC DEST --labels labels.csv` to have some); its only target is the class, 'label'")
    return f"no field {name!r}: the pack's fields are {', '.join(types)} (and 'label', the class index)"


class RecordFields(Mapping[str, Any]):
    """One record's fields, read as they are asked for: what a callable ``target`` is given.
    ``label_offset`` is added to the class index; ``where`` starts the message of a missing field."""

    def __init__(self, fields: PackFields, index: int, label_offset: int = 0, where: str = "") -> None:
        self._fields, self._index, self._label_offset, self._where = fields, index, label_offset, where

    def __getitem__(self, name: str) -> Any:
        if name != LABEL and name not in self._fields.columns:
            raise KeyError(self._where + _no_field(name, self._fields.types))
        value = self._fields.value(name, self._index)
        return value + self._label_offset if name == LABEL else value

    def __iter__(self) -> Iterator[str]:
        return iter([LABEL, *self._fields.columns])

    def __len__(self) -> int:
        return 1 + len(self._fields.columns)


TargetSpec = str | Sequence[str] | Callable[[Mapping[str, Any]], Any]


class Target:
    """What a dataset returns beside each image: a field's name, a tuple of names, or a callable
    given ``RecordFields``. Checked against the pack's fields (``types``) when it is made.

    In a mix of packs (``mix_targets`` makes them): ``label_offset`` turns the pack's class indices into
    the mix's, ``where`` names the pack in errors, and ``part`` marks a pack's part of a mixed batch:
    a callable's targets then stay a list, batched once with the rest of the batch (``merge``)."""

    def __init__(self, spec: TargetSpec, types: Mapping[str, str], *, label_offset: int = 0, where: str = "",
                 part: bool = False) -> None:
        self.spec = spec
        self.label_offset, self.where, self.part = label_offset, where, part
        if callable(spec):
            self.names: tuple[str, ...] = ()
            return
        names = (spec,) if isinstance(spec, str) else tuple(spec) if isinstance(spec, Sequence) else ()
        if not names or not all(isinstance(name, str) for name in names):
            raise ValueError(f"target={spec!r}: give a field's name, a tuple of names, or a callable")
        for name in names:
            if name != LABEL and name not in types:
                raise ValueError(f"target={spec!r}: {where}{_no_field(name, types)}")
        self.names = names

    def one(self, fields: PackFields, index: int) -> Any:
        """Record ``index``'s target."""
        if callable(self.spec):
            return self.spec(RecordFields(fields, index, self.label_offset, self.where))
        values = tuple(fields.value(name, index) + self.label_offset if name == LABEL else fields.value(name, index)
                       for name in self.names)
        return values[0] if isinstance(self.spec, str) else values

    def batch(self, fields: PackFields, indices: np.ndarray) -> Any:
        """The targets of the records ``indices``, batched (``PackFields.batch`` for each name; a
        callable's results through torch's ``default_collate``, or as a list for a ``part``)."""
        if callable(self.spec):
            return self.collate([self.one(fields, i) for i in np.asarray(indices).tolist()])
        batches = tuple(fields.batch(name, indices) + self.label_offset if name == LABEL and self.label_offset
                        else fields.batch(name, indices) for name in self.names)
        return batches[0] if isinstance(self.spec, str) else batches

    @staticmethod
    def missing(name: str, types: Mapping[str, str]) -> str:
        """The message for a field ``name`` the pack does not have."""
        return _no_field(name, types)

    def collate(self, values: list[Any]) -> Any:
        """Targets already read one by one (and transformed), batched as ``batch`` would."""
        if isinstance(self.spec, str):
            return _collate_one(values)
        if callable(self.spec):
            return values if self.part else default_collate(values)
        return tuple(_collate_one(list(column)) for column in zip(*values, strict=True))

    def merge(self, parts: Sequence[tuple[np.ndarray, Any]], size: int) -> Any:
        """One batch of ``size`` targets from the packs' parts of it, each ``(its rows in the batch, its
        targets as a ``part`` Target batches them)``: each name's values as one pack would batch them
        (a tensor, or a list where they are strings or lists of differing lengths); a callable's
        results through ``default_collate``, in the batch's order."""
        if callable(self.spec):
            return default_collate(_placed(parts, size))
        if isinstance(self.spec, str):
            return _merged(parts, size)
        return tuple(_merged([(rows, batch[k]) for rows, batch in parts], size) for k in range(len(self.names)))


def _placed(parts: Sequence[tuple[np.ndarray, Any]], size: int) -> list[Any]:
    """The parts' values (a sequence each, a tensor's rows) at their rows of a list of ``size``."""
    values: list[Any] = [None] * size
    for rows, batch in parts:
        for row, value in zip(rows.tolist(), batch.unbind(0) if isinstance(batch, torch.Tensor) else batch,
                              strict=True):
            values[row] = value
    return values


def _merged(parts: Sequence[tuple[np.ndarray, Any]], size: int) -> Any:
    """One field's batch from the packs' batches of it: a tensor where every part is one of the same
    dtype and row shape, else a list."""
    if len(parts) == 1 and np.array_equal(parts[0][0], np.arange(size)):
        return parts[0][1]
    batches = [batch for _, batch in parts]
    if all(isinstance(batch, torch.Tensor) for batch in batches) and \
            len({(batch.dtype, tuple(batch.shape[1:])) for batch in batches}) == 1:
        out = torch.empty((size, *batches[0].shape[1:]), dtype=batches[0].dtype)
        for rows, batch in parts:
            out[torch.from_numpy(rows)] = batch
        return out
    return _placed(parts, size)


def mix_targets(spec: TargetSpec, packs: Sequence[tuple[str, Mapping[str, str], int]]) -> list[Target]:
    """The ``Target`` of each pack of a mix, ``packs`` giving each one's name (as errors show it), field
    types and label offset. Every field ``spec`` names must be in every pack, of one type in all: the
    first that is not gives one line naming the pack, the field and the fixes."""
    names = (spec,) if isinstance(spec, str) else () if callable(spec) or not isinstance(spec, Sequence) else spec
    for name in (name for name in names if isinstance(name, str) and name != LABEL):  # Target refuses the rest
        for shown, types, _ in packs:
            if name not in types:
                raise UsageError(f"target={spec!r}: pack {shown} has no field {name!r} ({_fields_of(types)}): give "
                                 f"every pack of the mix that field (pack it from a table with a {name!r} column), "
                                 f"leave the pack out, or give a callable target with a default for it, "
                                 f"target=lambda fields: fields.get({name!r}, ...)")
        (one, first), *others = [(shown, types[name]) for shown, types, _ in packs]
        other, second = next(((shown, kind) for shown, kind in others if kind != first), (None, first))
        if other is not None:
            given = "float" if {first, second} == {"int", "float"} else "TYPE"
            raise UsageError(f"target={spec!r}: field {name!r} is {first} in pack {one} and {second} in pack {other}: "
                             f"a batch takes one type; pack them with one type (--field {name}:{given}), or give a "
                             "callable target that converts it")
    return [Target(spec, types, label_offset=offset, where=f"pack {shown}: ", part=True)
            for shown, types, offset in packs]


def _fields_of(types: Mapping[str, str]) -> str:
    return f"its fields: {', '.join(types)}; 'label' is the class index" if types else \
        "it has no fields, only 'label', the class index"


def _collate_one(values: list[Any]) -> Any:
    if values and all(isinstance(v, str) for v in values):
        return values
    if values and all(isinstance(v, np.ndarray) for v in values):
        if all(v.shape == values[0].shape for v in values):
            return torch.from_numpy(np.stack(values))
        return [torch.from_numpy(v) for v in values]
    return default_collate(values)


def verify_fields(reader: PackReader) -> list[dict[str, str]]:
    """What is wrong with a pack's fields part (``verify``): its size and sha256 against the
    manifest, then its layout. Empty for a pack without fields, or with intact ones."""
    listed = reader.manifest.fields
    if not listed:
        return []
    name = listed["name"]
    try:
        data = reader.fields_bytes()
    except PackFormatError as exc:
        return [{"file": name, "problem": str(exc)}]
    if hashlib.sha256(data).hexdigest() != listed["sha256"]:
        return [{"file": name, "problem": "sha256 differs from the manifest"}]
    try:
        check_columns_match(decode_fields(data, name, reader.records), listed["columns"], name)
    except PackFormatError as exc:
        return [{"file": name, "problem": str(exc)}]
    return []


def fields_info(manifest: Manifest) -> dict[str, Any] | None:
    """What ``info`` says of a pack's fields: their types, the table they came from, its class
    column, and the rows left out (the first ones listed); None for a pack without a table."""
    fields = manifest.fields
    if not fields:
        return None
    return {"columns": field_types(manifest), "table": fields.get("table", {}),
            "path_column": fields.get("path_column"), "label_column": fields.get("label_column"),
            "label_type": fields.get("label_type"), "rows_left_out": fields.get("rows_left_out", []),
            "rows_left_out_count": fields.get("rows_left_out_count", len(fields.get("rows_left_out", [])))}


def table_text(reader: PackReader, paths: Sequence[str]) -> str:
    """The pack's table as CSV text (``unpack`` writes it beside the images): the path column (each
    record's path as written, ``paths``), the class column (names, or integers as packed) and every
    field, one row per record in record order. Numbers as Python writes them back exactly, booleans
    as ``true``/``false``, lists as JSON."""
    listed = reader.manifest.fields
    fields = PackFields(reader, check=True)
    label, label_type = listed.get("label_column"), listed.get("label_type")
    names = [name for name in fields.columns]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([listed.get("path_column") or "path", *([label] if label else []), *names])
    classes = reader.classes
    labels = reader.entries["label"].tolist()
    columns = [fields.columns[name] for name in names]
    for i, path in enumerate(paths):
        row: list[Any] = [path]
        if label:
            row.append(labels[i] if label_type == "int" else classes[labels[i]])
        for column in columns:
            row.append(_cell(column, i))
        writer.writerow(row)
    return out.getvalue()


def _cell(column: Column, i: int) -> str:
    value = column.value(i)
    if column.type == "bool":
        return "true" if value else "false"
    if column.type == "float":
        return repr(value)
    if column.offsets is not None and column.type != "string":
        return json.dumps(value, separators=(",", ":"))
    return value if isinstance(value, str) else str(value)
