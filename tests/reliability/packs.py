"""Sources, small packs and the command line, shared by every reliability check.

A generated ImageFolder source, ``pack`` with small shards and LMDB chunks (so a small pack has
several parts), each record read back checked against its CRC, and ``packload`` run in this
process with what a user sees (exit code, stderr) and the rule a failed command keeps (one line
that says ``error``).
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SHARD_SIZE = 1 << 16  # small shards, so a small pack has several
LMDB_CHUNK = 16 << 10  # small LMDB chunks, so a small pack has several
MEMORY_HEADROOM = 2 << 30  # a capped reader may allocate this much beyond its start: more is "absurd"


def child_env() -> dict[str, str]:
    """This environment with the repository first on ``PYTHONPATH``, for child processes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


# -- sources and packs -------------------------------------------------------------------------------


def make_source(root: Path, per_class: int = 30, seed: int = 5, big: int = 0) -> Path:
    """An ImageFolder tree of 3 classes (JPEG and PNG), broken files in class ``b`` (skipped when
    packing) and ``big`` large PNGs in class ``a`` (to make a pack of several MB)."""
    from PIL import Image

    from tests.image_factory import make_image_folder, textured_rgb, write_broken_files

    make_image_folder(root, classes=("a", "b", "c"), per_class=per_class, seed=seed)
    write_broken_files(root / "b")
    for k in range(big):
        Image.fromarray(textured_rgb((300, 300), seed=100 + k)).save(root / "a" / f"big{k}.png")
    return root


def small_chunk_writer() -> type:
    """``LmdbWriter`` with ``LMDB_CHUNK``-byte chunks (the same layout in every run that uses it)."""
    from packload.packer.write_lmdb import LmdbWriter

    class SmallChunks(LmdbWriter):
        def __init__(self, path: Path, map_size: int, chunk_size: int = LMDB_CHUNK) -> None:
            super().__init__(path, map_size, chunk_size)

    return SmallChunks


@contextlib.contextmanager
def small_chunks() -> Iterator[None]:
    """Make ``pack`` write LMDB packs with small chunks while the block runs."""
    import packload.packer.pipeline as pipeline

    saved = pipeline.LmdbWriter
    pipeline.LmdbWriter = small_chunk_writer()
    try:
        yield
    finally:
        pipeline.LmdbWriter = saved


def pack_small(source: Path, dst: Path, **kwargs: Any) -> dict[str, Any]:
    """``pack`` with small shards and chunks, one worker, no progress bar."""
    from packload import pack

    with small_chunks():
        return pack(source, dst, workers=1, progress=False, shard_size=SHARD_SIZE, **kwargs)


def both_backends(root: Path, per_class: int) -> dict[str, Path]:
    """A generated source under ``root`` packed into a small LMDB pack and a small shards pack."""
    return pack_both(make_source(root / "src", per_class=per_class), root)


def pack_both(source: Path, root: Path, stem: str = "p") -> dict[str, Path]:
    """``source`` packed small into ``root/STEM.lmdb`` and ``root/STEM.shards``."""
    out = {}
    for backend in ("lmdb", "shards"):
        out[backend] = root / f"{stem}.{backend}"
        pack_small(source, out[backend])
    return out


def records_of(path: Path) -> list[tuple[str, int, bytes]]:
    """(original path, label, payload) of every record, each payload checked against its CRC."""
    from packload import PackReader

    with PackReader(path) as reader:
        return [(reader.path_of(i), int(reader.entries["label"][i]), bytes(reader.payload(i, verify=True)))
                for i in range(reader.records)]


def cli(args: list[str], stdout: io.StringIO | None = None) -> tuple[int, str]:
    """Run ``packload ARGS`` in this process; (exit code, stderr), stdout into ``stdout`` if given.
    An exception escaping the command line (a traceback for the user) is returned as exit code -1
    with the exception's text."""
    from packload.cli import main

    err, out = io.StringIO(), stdout if stdout is not None else io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(args)
    except Exception as exc:  # noqa: BLE001 - what we are looking for
        return -1, f"traceback: {type(exc).__name__}: {exc}"
    return code, err.getvalue()


def one_line_error(code: int, stderr: str) -> str | None:
    """None if a failed command ended as it should (non-zero exit, one line on stderr that says
    ``error``); else what was wrong."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if code == 0:
        return "exit code 0"
    if code < 0:
        return stderr
    if len(lines) != 1 or "error" not in lines[0] or "Traceback" in stderr:
        return f"not a one-line error: {stderr.strip()[:300]!r}"
    return None
