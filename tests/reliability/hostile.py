"""Hostile packs, all together: crafted indexes, manifests, record paths and decompression bombs
against every command, refused with our one-line error, nothing written outside the unpack folder,
nothing unpickled; and bombs in a source at pack time."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.reliability.crafted import (
    address_space_cap,
    copy_pack,
    craft_pack,
    files_under,
    index_with,
    jpeg_bomb,
    jpeg_bytes,
    rewrite,
)
from tests.reliability.packs import cli, make_source, one_line_error, pack_small


def _index_cases() -> dict[str, dict[str, Any]]:
    """Crafted index fields (with the manifest's index sha256 made to match): name → fields."""
    return {
        "index count 2**40": {"count": 2**40},
        "negative payload offset": {"payload_offset": (0, 2**64 - 8)},
        "payload length 2**63": {"payload_len": (1, 2**63)},
        "record offset past the part": {"record_offset": (0, 10**12)},
        "part 10**6": {"part": (0, 10**6)},
        "path offset past the blob": {"path_offset": (0, 10**9)},
        "label 99 of 3 classes": {"label": (0, 99)},
        "label -7": {"label": (1, -7)},
        "payload format code 200": {"format": (0, 200)},
        "index version 2": {"version": 2},
    }


def _manifest_cases(backend: str) -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    cases: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
        "manifest records 10**12": lambda m: dict(m, records=10**12),
        "manifest records -1": lambda m: dict(m, records=-1),
        "manifest version 2": lambda m: dict(m, version=2),
        "manifest format other": lambda m: dict(m, format="other"),
        "manifest backend zip": lambda m: dict(m, backend="zip"),
        "manifest class_counts a list": lambda m: dict(m, class_counts=[1, 2]),
        "manifest payload_bytes a string": lambda m: dict(m, payload_bytes="many"),
        "manifest index a list": lambda m: dict(m, index=[1]),
        "manifest parts a string": lambda m: dict(m, parts="all"),
    }
    if backend == "shards":
        def part(m: dict[str, Any], **fields: Any) -> dict[str, Any]:
            return dict(m, parts=[dict(m["parts"][0], **fields), *m["parts"][1:]])

        cases.update({
            "shard name ../../outside.bin": lambda m: part(m, name="../../outside.bin"),
            "shard name absolute": lambda m: part(m, name="/etc/hostname"),
            "shard size 2**62": lambda m: part(m, size=2**62),
            "shard size -5": lambda m: part(m, size=-5),
        })
    else:
        cases["manifest chunks -1"] = lambda m: dict(m, parts={"chunks": -1, "chunk_size": 1})
    return cases


def _exercise(pack: Path, workdir: Path) -> dict[str, Any]:
    """Open, read (checksums on and off), info, verify, verify --decode and unpack a hostile pack.
    Returns each step's outcome: ``ok``, ``refused: message`` or ``FOREIGN: exception``."""
    from packload import PackedImageFolder
    from packload.core.errors import PackloadError

    steps: dict[str, str] = {}
    for verify in (True, False):
        name = f"read (checksums {'on' if verify else 'off'})"
        try:
            ds = PackedImageFolder(pack, verify=verify, output="numpy")
            try:
                for lo in range(0, len(ds), 8):
                    ds.__getitems__(list(range(lo, min(len(ds), lo + 8))))
                steps[name] = "ok"
            finally:
                ds.close()
        except PackloadError as exc:
            steps[name] = f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001
            steps[name] = f"FOREIGN: {type(exc).__name__}: {exc}"
    out = workdir / "unpacked" / pack.name
    for key, command in (("info", ["info", str(pack)]), ("verify", ["verify", "--quiet", str(pack)]),
                         ("verify --decode", ["verify", "--decode", "--quiet", str(pack)]),
                         ("unpack", ["unpack", "--quiet", str(pack), str(out)])):
        stdout = io.StringIO()
        code, err = cli(command, stdout)
        if code == 0:
            steps[key] = "ok"
        elif key.startswith("verify") and code == 1 and not err.strip():
            steps[key] = "reported: " + " | ".join(stdout.getvalue().strip().splitlines()[1:4])
        else:
            problem = one_line_error(code, err)
            steps[key] = f"FOREIGN: {problem}" if problem else f"refused: {err.strip()}"
    return steps


def _tiny_source(workdir: Path) -> Path:
    src = workdir / "tiny-src"
    if not src.is_dir():
        make_source(src, per_class=2)
    return src


def _raw_options() -> Any:
    from packload.packer.encode import EncodeOptions

    return EncodeOptions(encoding="raw", size=(8, 8))


def pack_time_bombs(workdir: Path) -> dict[str, Any]:
    """A source holding decompression bombs (a PNG and a JPEG whose headers claim billions of
    pixels): ``pack`` skips each with a reason that names ``--max-pixels``; ``--strict`` stops with a
    one-line error that does too. Every check mode and encoding is tried."""
    from packload import PackReader, pack
    from packload.packer.encode import EncodeOptions
    from tests.image_factory import decompression_bomb_png

    src = workdir / "bomb-src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "fine.jpg").write_bytes(jpeg_bytes())
    (src / "a" / "bomb.png").write_bytes(decompression_bomb_png())
    (src / "a" / "bomb.jpg").write_bytes(jpeg_bomb())
    problems: list[str] = []
    runs = 0
    for k, (check, encoding) in enumerate([("fast", "keep"), ("full", "keep"), ("fast", "jpeg"), ("fast", "raw")]):
        for backend in ("lmdb", "shards"):
            runs += 1
            dst = workdir / f"bombs-{k}.{backend}"
            size = (8, 8) if encoding == "raw" else None
            with address_space_cap():
                summary = pack(src, dst, options=EncodeOptions(encoding=encoding, check=check, size=size), workers=1,
                               progress=False)
            with PackReader(dst) as reader:
                reasons = {item["path"]: item["reason"] for item in reader.manifest["skipped"]}
            if summary["records"] != 1 or sorted(reasons) != ["a/bomb.jpg", "a/bomb.png"]:
                problems.append(f"{check}/{encoding}/{backend}: packed {summary['records']}, skipped {sorted(reasons)}")
            problems += [f"{check}/{encoding}/{backend}: {path}: reason does not say how to raise the limit: {why}"
                         for path, why in reasons.items() if "--max-pixels" not in why]
        code, err = cli(["pack", str(src), str(workdir / f"strict-{k}.shards"), "--strict", "--quiet",
                         "--check", check, "--encoding", encoding, *(["--size", "8x8"] if size else [])])
        runs += 1
        problem = one_line_error(code, err)
        if problem or "--max-pixels" not in err:
            problems.append(f"--strict {check}/{encoding}: {problem or err.strip()}")
    return {"runs": runs, "problems": problems}


def hostile_suite(base: dict[str, Path], workdir: Path) -> dict[str, Any]:
    """Crafted indexes, manifests, record paths and bombs against copies of the packs in ``base``
    (backend → pack). Every case must be refused by every command, with our one-line error, nothing
    written outside the unpack folder, nothing unpickled. Returns per-case outcomes and problems."""
    import pickle

    from tests.image_factory import decompression_bomb_png

    outcomes: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    cases: list[tuple[str, Path, bool]] = []  # name, pack, must every command refuse it
    workdir.mkdir(parents=True, exist_ok=True)
    for backend, pack in base.items():
        for name, fields in _index_cases().items():
            copy = copy_pack(pack, workdir / f"{backend}-{len(cases)}{pack.suffix}")
            rewrite(copy, index=index_with(copy, **fields))
            cases.append((f"{backend}: {name}", copy, True))
        from packload import PackReader

        with PackReader(pack) as reader:
            manifest = dict(reader.manifest)
        for name, change in _manifest_cases(backend).items():
            copy = copy_pack(pack, workdir / f"{backend}-{len(cases)}{pack.suffix}")
            rewrite(copy, manifest=change(manifest))
            cases.append((f"{backend}: {name}", copy, True))
        copy = copy_pack(pack, workdir / f"{backend}-{len(cases)}{pack.suffix}")  # huge but harmless: read
        rewrite(copy, manifest=dict(manifest, classes=[str(k) for k in range(10**5)]))
        cases.append((f"{backend}: manifest with 10**5 classes (labels still in range)", copy, False))
        if backend == "shards":
            copy = copy_pack(pack, workdir / f"{backend}-{len(cases)}{pack.suffix}")
            with open(copy / "shard-00000.bin", "r+b") as f:
                f.seek(4)
                f.write((2).to_bytes(4, "little"))
            cases.append((f"{backend}: shard header version 2", copy, True))
        for path in ("../escape.png", str(workdir / "absolute.png"), "a/../../up.png", "a\\..\\win.png", "a//b.png",
                     "./dot.png", "a/nul\0.png", ""):
            crafted = craft_pack(workdir / f"{backend}-{len(cases)}{pack.suffix}",
                                 [("a/fine.jpg", 0, jpeg_bytes()), (path, 0, jpeg_bytes(seed=1))])
            cases.append((f"{backend}: record path {path!r}", crafted, False))
        raw = workdir / f"{backend}-raw{pack.suffix}"
        pack_small(_tiny_source(workdir), raw, options=_raw_options())
        for name, fields in {"raw width 1 too large": {"width": (0, 9)},
                             "raw height 2**32-1": {"height": (1, 2**32 - 1)}}.items():
            copy = copy_pack(raw, workdir / f"{backend}-{len(cases)}{pack.suffix}")
            rewrite(copy, index=index_with(copy, **fields))
            cases.append((f"{backend}: {name}", copy, True))
        bombs = craft_pack(workdir / f"{backend}-bombs{pack.suffix}",
                           [("a/png-bomb.png", 0, decompression_bomb_png()), ("a/jpeg-bomb.jpg", 0, jpeg_bomb())])
        cases.append((f"{backend}: decompression bombs", bombs, False))
    before = files_under(workdir)
    real = (pickle.loads, pickle.load)

    def no_unpickling(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a pack made packload unpickle something")

    pickle.loads = pickle.load = no_unpickling  # type: ignore[assignment]
    try:
        with address_space_cap():
            for name, pack, all_refuse in cases:
                steps = _exercise(pack, workdir)
                outcomes[name] = steps
                for step, outcome in steps.items():
                    if outcome.startswith("FOREIGN"):
                        problems.append(f"{name}: {step}: {outcome}")
                must = ("read (checksums on)", "verify", "unpack") if all_refuse else ()
                must += ("unpack",) if "record path" in name else ()
                must += ("read (checksums on)", "read (checksums off)", "verify --decode") if "bombs" in name else ()
                problems += [f"{name}: {step} accepted it" for step in must if steps[step] == "ok"]
                if "bombs" in name:
                    for step in ("read (checksums on)", "read (checksums off)", "verify --decode"):
                        if "MAX_IMAGE_PIXELS" not in steps[step]:
                            problems.append(f"{name}: {step} does not say how to raise the limit: {steps[step]}")
    finally:
        pickle.loads, pickle.load = real  # type: ignore[assignment]
    unpacked = workdir / "unpacked"
    escaped = sorted(str(p) for p in files_under(workdir) - before if p != unpacked and unpacked not in p.parents)
    escaped += [p for p in ("absolute.png", "escape.png", "up.png") if (workdir.parent / p).exists()]
    if escaped:
        problems.append(f"files written outside the unpack folders: {escaped}")
    bombs = pack_time_bombs(workdir / "pack-time")
    problems += [f"pack-time bombs: {p}" for p in bombs["problems"]]
    return {"cases": len(cases), "outcomes": outcomes, "pack_time_bomb_runs": bombs["runs"], "problems": problems}
