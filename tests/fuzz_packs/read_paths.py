"""Every read path a case is probed with (dataset items and batches in each output, DataLoader,
PackLoader, the command line), each run against one pack and judged (``run_probe``)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from tests.fuzz_packs.judge import Probe
from tests.fuzz_packs.reference import Reference, unpack_refuses
from tests.reliability.kills import collate_list
from tests.reliability.packs import one_line_error

CROP = 24
BATCH = 8
PROBE_TIMEOUT = 60.0  # seconds a probe may take before it counts as a hang
OUTPUTS = ("pil", "numpy", "tensor", "bytes")
CLI_COMMANDS = {"info": ["info"], "verify": ["verify", "--quiet"],
                "verify --decode": ["verify", "--decode", "--quiet"], "unpack": ["unpack", "--quiet"],
                "merge": ["merge", "--quiet"]}


def read_paths() -> dict[str, dict[str, Any]]:
    """Every read path a case can be probed with, by name."""
    paths: dict[str, dict[str, Any]] = {}
    for verify in (False, True):
        for output in OUTPUTS:
            for kind, name in (("item", "ds[i]"), ("items", "getitems")):
                paths[f"{name} {output} verify={verify}"] = {"kind": kind, "output": output, "verify": verify}
    paths["DataLoader numpy workers=2"] = {"kind": "dataloader", "output": "numpy", "verify": False}
    paths["PackLoader crop"] = {"kind": "packloader", "crop": CROP, "verify": False}
    paths["PackLoader crop, torch resize"] = {"kind": "packloader", "crop": CROP, "verify": False,
                                              "server": "torch"}
    for verify in (False, True):
        paths["PackLoader one size" + (" verify=True" if verify else "")] = {
            "kind": "packloader", "crop": None, "verify": verify, "raw_only": True}
    for name in CLI_COMMANDS:
        paths[name] = {"kind": "cli", "command": name}
    return paths


READ_PATHS = read_paths()
# Without recomputed checksums the damage is plain to see: the paths that check them, and two that do not.
UNSEALED_PATHS = ("ds[i] bytes verify=True", "getitems numpy verify=True", "ds[i] numpy verify=False",
                  "PackLoader crop", "verify", "unpack")


def run_probe(ref: Reference, spec: dict[str, Any], pack: Path, scratch: Path) -> Probe:
    """Run one read path against ``pack`` and judge it; exceptions escaping are judged too."""
    probe = Probe(ref, spec)
    kind = spec["kind"]
    runner = {"item": _probe_items, "items": _probe_items, "dataloader": _probe_dataloader,
              "packloader": _probe_packloader, "cli": _probe_cli}[kind]
    try:
        runner(probe, pack, scratch)
    except Exception as exc:  # noqa: BLE001 - judged: ours is a refusal, any other a failure
        probe.exception(exc, "open" if probe.returned == 0 else "read")
    return probe


def _dataset(probe: Probe, pack: Path, output: str, verify: bool) -> Any:
    from packload import PackedImageFolder

    ds = PackedImageFolder(pack, output=output, verify=verify)
    probe.opened(len(ds), verify)
    return ds


def _probe_items(probe: Probe, pack: Path, scratch: Path) -> None:
    """``ds[i]`` for every record, or ``ds.__getitems__`` over batches of 8."""
    spec = probe.spec
    output, verify = spec["output"], spec["verify"]
    ds = _dataset(probe, pack, output, verify)
    try:
        n = len(ds)
        batches = [[i] for i in range(n)] if spec["kind"] == "item" else [list(range(lo, min(n, lo + BATCH)))
                                                                         for lo in range(0, n, BATCH)]
        for batch in batches:
            try:
                got = [ds[batch[0]]] if spec["kind"] == "item" else ds.__getitems__(batch)
            except Exception as exc:  # noqa: BLE001 - judged
                probe.exception(exc, f"records {batch[0]}..{batch[-1]}")
                continue
            if len(got) != len(batch):
                probe.fail("wrong", "a batch of another length", f"{len(got)} for {len(batch)}")
            for i, (value, label) in zip(batch, got, strict=False):
                probe.item(i, value, label, output, verify)
    finally:
        ds.close()


def _probe_dataloader(probe: Probe, pack: Path, scratch: Path) -> None:
    """One epoch of ``DataLoader(ds, batch_size=4, num_workers=2)``, in order."""
    from torch.utils.data import DataLoader

    ds = _dataset(probe, pack, "numpy", False)
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_list,
                        timeout=PROBE_TIMEOUT / 2)
    seen = 0
    try:
        for batch in loader:
            for value, label in batch:
                probe.item(seen, value, label, "numpy", False)
                seen += 1
    except Exception as exc:  # noqa: BLE001 - judged
        probe.exception(exc, f"after {seen} samples")
    finally:
        ds.close()


def expected_crop(pixels: np.ndarray, size: int) -> np.ndarray | None:
    """``CenterCrop(size)`` of raw pixels as its documentation defines it: the centred square of
    224/256 of the shorter side, resized by torch's antialiased bilinear filter (None: no square)."""
    import torch

    h, w = pixels.shape[:2]
    if not h or not w:
        return None
    side = max(1, int(224 / 256 * min(h, w)))
    top, left = (h - side) // 2, (w - side) // 2
    square = np.ascontiguousarray(pixels[top : top + side, left : left + side])
    if side == size:
        return square
    source = torch.from_numpy(square).permute(2, 0, 1).unsqueeze(0)
    out = torch.nn.functional.interpolate(source, size=(size, size), mode="bilinear", antialias=True,
                                          align_corners=False)
    return out[0].permute(1, 2, 0).numpy()


def _probe_packloader(probe: Probe, pack: Path, scratch: Path) -> None:
    """One epoch of ``PackLoader(ds, 8, crop=CenterCrop(24))``, or of ``PackLoader(ds, 8)`` over a
    pack of one image size; each sample judged against the reference (raw pixels exactly)."""
    from packload import CenterCrop, PackLoader

    spec = probe.spec
    crop = spec["crop"]
    ds = _dataset(probe, pack, "numpy", spec["verify"])
    loader = PackLoader(ds, BATCH, crop=CenterCrop(crop) if crop else None)
    order = loader.sampler.epoch_order(0).tolist()
    done = 0
    try:
        for images, labels in loader:
            for k in range(len(labels)):
                _judge_batch_image(probe, order[done + k], images[k], labels[k], crop)
            done += len(labels)
    except Exception as exc:  # noqa: BLE001 - judged
        probe.exception(exc, f"after {done} samples")
    finally:
        loader.close()
        ds.close()


def _judge_batch_image(probe: Probe, i: int, image: Any, label: Any, crop: int | None) -> None:
    rec = probe.allowed(i, probe.spec["verify"])
    if rec is None:
        return
    if int(label) != rec.label:
        probe.fail("wrong", "the label is not the index's", f"record {i}")
    array = image.permute(1, 2, 0).numpy()
    pixels = rec.pixels()
    if crop:
        if rec.fmt == 0:
            want = None if pixels is None else expected_crop(pixels, crop)
            if want is None:
                probe.fail("wrong", "returned a crop of an image that has no pixels",
                           f"record {i}: {rec.height}x{rec.width}")
            elif not np.array_equal(array, want):
                probe.fail("wrong", "cropped raw pixels differ from the stored image's crop", f"record {i}")
        return
    if array.shape[:2] != (rec.height, rec.width):
        probe.fail("wrong", "the image's size is not the index's width and height",
                   f"record {i}: {array.shape}")
    elif pixels is None or not np.array_equal(array, pixels):
        probe.fail("wrong", "raw pixels differ from the stored bytes", f"record {i}")


def _run_cli(args: list[str]) -> tuple[int, str, str, BaseException | None]:
    from packload.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
    except Exception as exc:  # noqa: BLE001 - a traceback a user would see
        return -1, out.getvalue(), err.getvalue(), exc
    return code, out.getvalue(), err.getvalue(), None


def _probe_cli(probe: Probe, pack: Path, scratch: Path) -> None:
    """``packload COMMAND`` through ``packload.cli.main``: success (then judged by the command), our
    one-line error and a non-zero exit, or for ``verify`` a report and exit 1."""
    name = probe.spec["command"]
    args = [*CLI_COMMANDS[name], str(pack)]
    other = "shards" if probe.ref.backend == "lmdb" else "lmdb"  # into the other backend: every payload read
    target = scratch / ("unpacked" if name == "unpack" else f"merged.{other}")
    if name == "unpack":
        args.append(str(target))
    elif name == "merge":
        args = [*CLI_COMMANDS[name], str(target), str(pack)]
    outside = _outside(probe.ref, target) if name == "unpack" else {}
    code, out, err, exc = _run_cli(args)
    for place, before in outside.items():  # whatever the exit: a partial unpack must not escape either
        if place.exists() and place.stat().st_mtime != before:
            probe.fail("wrong", "unpack wrote a file outside its folder", str(place))
    if exc is not None:
        probe.exception(exc, f"packload {name}")
        return
    if code != 0:
        if name.startswith("verify") and code == 1 and not err.strip():
            probe.refused.append("reported: " + " | ".join(out.strip().splitlines()[:3])[:200])
        else:
            problem = one_line_error(code, err)
            if problem:
                probe.fail("foreign", f"packload {name}: not a one-line error", problem)
            else:
                probe.refused.append(err.strip()[:200])
        return
    probe.notes.append("exit 0")
    ref = probe.ref
    if ref.pack_bad:
        probe.fail("accepted", f"packload {name} succeeded on a pack every reader must refuse", ref.pack_bad)
    elif name.startswith("verify"):
        problems = ref.problems()
        if problems:
            probe.fail("accepted", f"packload {name} passed a pack that breaks: {problems[0][0]}",
                       problems[0][1])
    elif name == "unpack":
        _judge_unpack(probe, target)
    elif name == "merge":
        _judge_merge(probe, target)


def _outside(ref: Reference, out: Path) -> dict[Path, float | None]:
    """Where records' paths would land outside ``out``, with each place's mtime now (None: absent)."""
    places: dict[Path, float | None] = {}
    for rec in ref.records:
        path = rec.text_path
        if path is None or "\0" in path:
            continue
        place = Path(os.path.normpath(os.path.join(out, path)))
        if place != out and out not in place.parents:
            places[place] = place.stat().st_mtime if place.exists() else None
    return places


def _judge_unpack(probe: Probe, out: Path) -> None:
    """A successful unpack wrote one file per record: each stored payload (a raw record's pixels, as
    an image) exactly once, whatever the files' names."""
    ref = probe.ref
    if any(probe.allowed(i, True) is None for i in range(len(ref.records))):
        return
    if unpack_refuses(ref):
        probe.fail("wrong", "unpack wrote a pack with paths that are unsafe, not UTF-8 or the same twice")
        return
    wanted: dict[str, int] = {}
    for rec in ref.records:
        key = hashlib.sha256(rec.pixels().tobytes() if rec.fmt == 0 else rec.payload or b"").hexdigest()
        wanted[key] = wanted.get(key, 0) + 1
    for file in sorted(p for p in out.rglob("*") if p.is_file()):
        data = file.read_bytes()
        key = hashlib.sha256(data).hexdigest()
        if not wanted.get(key):
            key = _pixels_digest(data) or key
        if not wanted.get(key):
            probe.fail("wrong", "an unpacked file is no record's payload", str(file.relative_to(out)))
            return
        wanted[key] -= 1
    if any(wanted.values()):
        probe.fail("wrong", "unpack left a record out (or wrote two on one path)",
                   f"{sum(wanted.values())} of {len(ref.records)}")


def _pixels_digest(data: bytes) -> str | None:
    """The sha256 of an image file's RGB pixels (None: not an image)."""
    from PIL import Image

    try:
        return hashlib.sha256(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).tobytes()).hexdigest()
    except Exception:  # noqa: BLE001 - any file that does not decode
        return None


def _judge_merge(probe: Probe, out: Path) -> None:
    """A successful merge of one pack copied no record a reader must refuse, wrote a pack that breaks
    no rule the input did not already break, and holds the same records."""
    ref = probe.ref
    if any(probe.allowed(i, False) is None for i in range(len(ref.records))):
        return
    merged = Reference(out, ref.manifest_limit)
    broken = {rule for rule, _ in ref.problems()}
    problems = [p for p in merged.problems() if p[0] not in broken]
    if problems:
        probe.fail("wrong", f"merge wrote a pack that breaks: {problems[0][0]}", problems[0][1])
        return
    if len(merged.records) != len(ref.records):
        probe.fail("wrong", "merge changed the number of records",
                   f"{len(merged.records)} != {len(ref.records)}")
        return
    for i, (a, b) in enumerate(zip(ref.records, merged.records, strict=True)):
        names = (ref.classes[a.label] if 0 <= a.label < len(ref.classes) else None,
                 merged.classes[b.label] if 0 <= b.label < len(merged.classes) else None)
        if (a.payload, a.path) != (b.payload, b.path) or names[0] != names[1]:
            probe.fail("wrong", "merge changed a record (payload, path or class)", f"record {i}")
            return
