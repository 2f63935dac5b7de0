"""Reading a table file row by row, whatever its size: CSV, TSV, JSON lines, or Parquet where
pyarrow is installed, from a path or a URL. Each row comes as its cells by column name, or as the
reason it cannot be read (a row of the wrong width, a line that is not a JSON object), and the
file's SHA-256 is taken on the way, so that a table that changes between two passes is caught."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

from packload.core.errors import UsageError
from packload.core.fields import MAX_COLUMNS, MAX_NAME_BYTES
from packload.core.remote import is_url
from packload.packer.table_options import TableOptions

SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
            ".pq": "parquet"}
_READ_BLOCK = 1 << 20


class _Hashing(io.RawIOBase):
    """A binary stream that hashes what is read through it."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.digest = raw, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.raw.read(len(buffer))
        buffer[: len(data)] = data
        self.digest.update(data)
        return len(data)


class TableReader:
    """The rows of one table file, read as many times as needed, its columns known after ``open``."""

    def __init__(self, options: TableOptions, storage_options: dict[str, Any] | None = None) -> None:
        self.options, self.storage_options = options, storage_options
        self.shown = options.path
        suffix = PurePosixPath(options.path.split("?", 1)[0]).suffix.lower()
        if suffix not in SUFFIXES:
            raise UsageError(f"{self.shown}: not a table packload reads; give a .csv, .tsv, .jsonl or .parquet file")
        self.kind = SUFFIXES[suffix]
        if self.kind == "parquet":
            try:
                import pyarrow.parquet  # noqa: F401
            except ImportError:
                raise UsageError(f"{self.shown}: a Parquet table needs pyarrow, which is not installed; "
                                 'pip install "packload[parquet]", or give the table as CSV or JSON lines') from None
        self.columns: list[str] = []
        self.sha256 = ""

    def _open(self) -> IO[bytes]:
        try:
            if is_url(self.options.path):
                import fsspec

                return fsspec.open(self.options.path, "rb", **(self.storage_options or {})).open()
            if Path(self.options.path).is_dir():
                raise UsageError(f"{self.shown}: is a folder; give the table file (labels.csv)")
            return open(self.options.path, "rb")
        except FileNotFoundError:
            raise UsageError(f"{self.shown}: table not found; give the file of labels (--labels labels.csv)") from None
        except PermissionError:
            raise UsageError(f"{self.shown}: cannot read the table; check its permissions") from None

    def header(self) -> list[str]:
        """The columns a CSV, TSV or Parquet table names before its rows (read without the rows)."""
        if self.kind == "parquet":
            import pyarrow.parquet as pq

            with self._open() as raw:
                try:
                    self._set_columns(list(pq.ParquetFile(raw).schema_arrow.names))
                except UsageError:
                    raise
                except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a file that is not Parquet
                    raise UsageError(f"{self.shown}: not a Parquet file ({type(exc).__name__}); give a .parquet "
                                     "table, or the table as CSV") from None
            return self.columns
        with self._open() as raw:
            for _ in self._csv_rows(_Hashing(raw)):
                break  # the header is read before the first row
        return self.columns

    def rows(self) -> Iterator[tuple[int, dict[str, Any] | str]]:
        """``(row number, cells or the reason the row cannot be read)`` for every row (numbered from
        1, the header not counted; blank lines are not rows). ``columns`` and ``sha256`` are set as
        the file is read (the digest when the last row has been given)."""
        with self._open() as raw:
            hashing = _Hashing(raw)
            if self.kind in ("csv", "tsv"):
                yield from self._csv_rows(hashing)
            elif self.kind == "jsonl":
                yield from self._jsonl_rows(hashing)
            else:
                yield from self._parquet_rows(raw)
                raw.seek(0)
            while hashing.read(_READ_BLOCK):  # what the reader left unread (a trailing blank line)
                pass
            self.sha256 = hashing.digest.hexdigest()

    def _csv_rows(self, stream: io.RawIOBase) -> Iterator[tuple[int, dict[str, Any] | str]]:
        text = io.TextIOWrapper(io.BufferedReader(stream, _READ_BLOCK), encoding="utf-8-sig", newline="")
        reader = csv.reader(text, delimiter="\t" if self.kind == "tsv" else ",")
        try:
            header = next(reader, None)
            if header is None:
                raise UsageError(f"{self.shown}: empty; give a table whose first row names its columns (path,label,...)")
            self._set_columns([name.strip() for name in header])
            width = len(self.columns)
            number = 0
            for cells in reader:
                if not cells:
                    continue  # a blank line
                number += 1
                if len(cells) != width:
                    yield number, f"has {len(cells)} cells, the header names {width} columns"
                    continue
                yield number, dict(zip(self.columns, cells, strict=True))
        except UnicodeDecodeError:
            raise UsageError(f"{self.shown}: not UTF-8 text (near line {reader.line_num + 1}); save the table as "
                             "UTF-8") from None
        except csv.Error as exc:
            raise UsageError(f"{self.shown}, line {reader.line_num}: {exc}; fix the table") from None

    def _jsonl_rows(self, stream: io.RawIOBase) -> Iterator[tuple[int, dict[str, Any] | str]]:
        seen: dict[str, None] = dict.fromkeys(self.columns)
        number = 0
        for line_number, line in enumerate(io.BufferedReader(stream, _READ_BLOCK), 1):
            if not line.strip():
                continue
            number += 1
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
                yield number, f"line {line_number} is not valid JSON ({str(exc).split(':')[0]})"
                continue
            if not isinstance(row, dict):
                yield number, f"line {line_number} is not a JSON object"
                continue
            for name in row:
                if name not in seen:
                    seen[name] = None
                    self._set_columns(list(seen))
            yield number, row
        if not number and not self.columns:
            raise UsageError(f"{self.shown}: no rows; give a table of one JSON object per line")

    def _parquet_rows(self, raw: IO[bytes]) -> Iterator[tuple[int, dict[str, Any] | str]]:
        import pyarrow.parquet as pq

        try:
            table = pq.ParquetFile(raw)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a file that is not Parquet
            raise UsageError(f"{self.shown}: not a Parquet file ({type(exc).__name__}); give a .parquet table, "
                             "or the table as CSV") from None
        self._set_columns(list(table.schema_arrow.names))
        number = 0
        for batch in table.iter_batches(batch_size=65536):
            for row in batch.to_pylist():
                number += 1
                yield number, row

    def _set_columns(self, names: list[str]) -> None:
        for k, name in enumerate(names):
            if not name:
                raise UsageError(f"{self.shown}: column {k + 1} has no name; name every column in the header")
            if len(name.encode("utf-8")) > MAX_NAME_BYTES:
                raise UsageError(f"{self.shown}: column name {name[:40]!r}... is longer than {MAX_NAME_BYTES} bytes; "
                                 "shorten it")
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise UsageError(f"{self.shown}: two columns named {duplicates[0]!r}; give each column its own name")
        if len(names) > MAX_COLUMNS:
            raise UsageError(f"{self.shown}: {len(names)} columns, more than the {MAX_COLUMNS} a pack may hold")
        self.columns = names
