"""Full disks and file-size limits mid-pack (one clear error, nothing published, ``--resume``
afterwards), and an LMDB map far smaller than the data (it grows)."""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.reliability.packs import (
    LMDB_CHUNK,
    REPO,
    SHARD_SIZE,
    child_env,
    one_line_error,
    records_of,
    small_chunk_writer,
)


def snapshot(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _run_pack(args: list[str], preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    script = ("import sys; from tests.reliability.packs import small_chunks; from packload.cli import module_main\n"
              "with small_chunks(): code = module_main(sys.argv[1:])\nsys.exit(code)")
    return subprocess.run([sys.executable, "-c", script, *args, "--quiet", "--shard-size", str(SHARD_SIZE),
                           "--workers", "1"], cwd=REPO, env=child_env(), capture_output=True, text=True,
                          preexec_fn=preexec, timeout=300)


def write_limit_check(source: Path, workdir: Path, reference: Path, backend: str, kind: str,
                      limit: int) -> dict[str, Any]:
    """Pack ``source`` into a space of ``limit`` bytes (``kind`` ``tmpfs``, needs root) or under a
    file-size limit of ``limit`` bytes (``fsize``): one-line error, non-zero exit, nothing at the
    destination, partial output refused, source untouched; then, with room again, ``--resume``
    gives the same records as ``reference``."""
    from packload import PackReader
    from packload.core.errors import PackloadError
    from packload.packer.destination import partial_path

    problems: list[str] = []
    before = snapshot(source)
    where = workdir / f"{kind}-{limit}"
    where.mkdir()
    mounted = False
    if kind == "tmpfs":
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={limit}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return {"skipped": f"cannot mount tmpfs: {done.stderr.strip()}", "problems": []}
        mounted = True
    dst = where / f"x.{backend}"
    try:
        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        result = _run_pack([str(source), str(dst)], cap if kind == "fsize" else None)
        problem = one_line_error(result.returncode, result.stderr)
        if problem:
            problems.append(f"pack: {problem}")
        elif not any(s in result.stderr for s in ("No space", "too large", "File too large", "free")):
            problems.append(f"the error does not say what ran out: {result.stderr.strip()!r}")
        elif "--resume" not in result.stderr:
            problems.append(f"the error does not say how to go on: {result.stderr.strip()!r}")
        if dst.exists():
            problems.append("something was published at the destination")
        partial = partial_path(dst)
        try:
            PackReader(partial).close()
            problems.append("the partial output opens as a pack")
        except PackloadError:
            pass
        except Exception as exc:  # noqa: BLE001
            problems.append(f"opening the partial output: {type(exc).__name__}: {exc}")
        if snapshot(source) != before:
            problems.append("the source changed")
        if kind == "tmpfs":
            subprocess.run(["mount", "-o", "remount,size=256m", str(where)], check=True)
        resumed = _run_pack([str(source), str(dst), "--resume"])
        if resumed.returncode != 0:
            problems.append(f"--resume after freeing room failed: {resumed.stderr.strip()!r}")
        elif records_of(dst) != records_of(reference):
            problems.append("the resumed pack differs from the uninterrupted one")
        return {"backend": backend, "kind": kind, "limit": limit, "exit": result.returncode,
                "error": result.stderr.strip(), "problems": problems}
    finally:
        if mounted:
            subprocess.run(["umount", str(where)], check=False)


def lmdb_map_growth_check(source: Path, dst: Path, reference: Path) -> dict[str, Any]:
    """``pack`` into an LMDB map far smaller than the data: the map grows, the pack completes, and
    its records equal ``reference``'s."""
    import packload.packer.pipeline as pipeline

    base = small_chunk_writer()
    grown: list[int] = []

    class TinyMap(base):  # type: ignore[misc, valid-type]
        def __init__(self, path: Path, map_size: int, chunk_size: int = LMDB_CHUNK) -> None:
            super().__init__(path, 64 << 10, chunk_size)

        def finish(self, manifest: dict[str, Any]) -> dict[str, Any]:
            self._commits().commit({})  # everything so far committed: the map has grown as it needed
            grown.append(self.env.info()["map_size"])
            return super().finish(manifest)

    saved = pipeline.LmdbWriter
    pipeline.LmdbWriter = TinyMap
    try:
        from packload import pack

        pack(source, dst, workers=1, progress=False, shard_size=SHARD_SIZE)
    finally:
        pipeline.LmdbWriter = saved
    problems = [] if records_of(dst) == records_of(reference) else ["records differ after the map grew"]
    return {"start_map": 64 << 10, "final_map": grown[0], "pack_bytes": dst.stat().st_size, "problems": problems}
