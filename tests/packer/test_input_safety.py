"""Input that is not what it says: files that are not regular files, images in formats packload
does not decode, and names that would drive a terminal.

* A FIFO named ``y.jpg`` must not stop ``pack``, a link to ``/dev/zero`` named ``x.jpg`` must not be
  read on and on, a link into ``/proc`` must not be walked: such entries are left out with the
  reason, or end in a one-line error, within seconds, on both backends and under ``--strict``;
  files swapped for one after the scan are skipped when read.
* An EPS file (whose PIL plugin runs Ghostscript) named ``.jpg`` is skipped at pack time, and an
  EPS payload in a pack (under any stored format code) is refused at read time with an error that
  names the record. A fake ``gs`` first on ``PATH`` proves that no program is started.
* Class names and file names holding ESC sequences, C1 controls, newlines and bidirectional
  overrides reach the terminal escaped, and ``--json`` output stays valid JSON without them.
"""

from __future__ import annotations

import io
import json
import os
import re
import resource
import signal
import socket
import stat
import subprocess
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import EpsImagePlugin, Image

from packload.cli import main
from packload.core import safe_files
from packload.core.errors import PackFormatError, SkippedFileError
from packload.core.probe import NotDecodableError, not_decodable_reason, open_image
from packload.core.scan import Sample, scan_folder
from packload.loaders.crop import CenterCrop
from packload.loaders.dataset import PackedImageFolder
from packload.loaders.decode import decode_array
from packload.loaders.folder import FolderImages
from packload.loaders.verify import verify
from packload.packer import encode as encode_module
from packload.packer.encode import Encoded, EncodeOptions, Skipped, encode_chunk, encode_file
from packload.packer.pipeline import pack
from packload.packer.write_lmdb import LmdbWriter
from packload.packer.write_shards import ShardsWriter
from tests.image_factory import textured_rgb

BACKENDS = ("shards", "lmdb")
SECONDS = 20  # far more than any of these takes; a hang ends the test instead of the run
HEADROOM = 2 << 30  # more memory than any of these takes; an endless read ends the test, not the machine
HOSTILE = "\x1b[2J\x9b\n\u202e"  # clear screen, CSI, a forged line, right-to-left override
# What must never reach a terminal raw (a newline only between the lines a command prints).
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


# -- helpers -------------------------------------------------------------------------------------
class Hung(Exception):  # noqa: N818 - not an OSError, which the code under test would take for a bad file
    """The code under test blocked or read on past ``SECONDS``."""


@contextmanager
def within(seconds: float = SECONDS) -> Iterator[None]:
    """Fail instead of hanging: a blocked ``open`` is interrupted after ``seconds``, and an endless
    read runs into MemoryError (the address space is capped at its size now plus ``HEADROOM``)."""
    def expire(signum: int, frame: Any) -> None:
        raise Hung(f"still running after {seconds} s: blocked or reading without end")

    with open("/proc/self/status") as f:
        size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    previous = signal.signal(signal.SIGALRM, expire)
    resource.setrlimit(resource.RLIMIT_AS, (size + HEADROOM if hard == resource.RLIM_INFINITY
                                            else min(size + HEADROOM, hard), hard))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, previous)


def encoded(fmt: str, size: tuple[int, int] = (24, 16), seed: int = 0, mode: str = "RGB", **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(textured_rgb(size, seed)).convert(mode).save(buf, format=fmt, **kwargs)
    return buf.getvalue()


def eps_bytes() -> bytes:
    """An EPS file as PIL writes it (no Ghostscript needed to write one)."""
    data = encoded("EPS", (8, 8))
    assert data.startswith(b"%!PS-Adobe-3.0 EPSF-3.0")
    return data


# Formats PIL knows but packload does not decode, each as PIL writes it (the mode it can save).
REFUSED = {"EPS": ("RGB", {}), "ICO": ("RGB", {}), "PCX": ("RGB", {}), "SGI": ("RGB", {}), "TGA": ("RGB", {}),
           "DDS": ("RGB", {}), "XBM": ("1", {})}


def refused_payloads() -> dict[str, bytes]:
    return {fmt: encoded(fmt, (8, 8), mode=mode, **kwargs) for fmt, (mode, kwargs) in REFUSED.items()}


def assert_terminal_safe(text: str) -> None:
    found = RAW_CONTROL.search(text)
    assert found is None, f"raw {found.group()!r} reaches the terminal in {text!r}"


def craft(dst: Path, items: list[tuple[str, bytes, str]], classes: list[str] | None = None) -> Path:
    """A pack whose checksums are right but whose payloads and stored format codes are chosen here:
    ``items`` are (path, payload, format code name), all of class 0 (what a hostile pack can hold)."""
    classes = classes or ["a"]
    if dst.suffix == ".lmdb":
        writer: Any = LmdbWriter(dst, 1 << 24)
    else:
        dst.mkdir()
        writer = ShardsWriter(dst, 1 << 20)
    for path, payload, fmt in items:
        writer.write(Encoded(path, 0, payload, 8, 8, "RGB", fmt, 0, len(payload), zlib.crc32(payload)))
    writer.finish({"format": "packload", "version": 1, "backend": "lmdb" if dst.suffix == ".lmdb" else "shards",
                   "encoding": "keep", "records": len(items), "classes": classes, "skipped": [], "labelled": True,
                   "class_counts": {classes[0]: len(items)}, "payload_bytes": sum(len(p) for _, p, _ in items)})
    return dst


def pack_path(tmp_path: Path, backend: str, stem: str = "p") -> Path:
    return tmp_path / (f"{stem}.lmdb" if backend == "lmdb" else f"{stem}.shards")


@pytest.fixture()
def no_programs(tmp_path, monkeypatch):
    """A fake ``gs`` first on ``PATH`` that leaves a marker if anything starts it, and every
    ``subprocess.Popen`` recorded; the test fails if either saw a program started."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    marker = tmp_path / "gs-was-started"
    for name in ("gs", "gsc", "gswin32c", "gswin64c"):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho \"$@\" >> '{marker}'\nexit 1\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(EpsImagePlugin, "gs_binary", None)  # PIL looks for Ghostscript again
    started: list[Any] = []
    real_popen = subprocess.Popen

    class Recorded(real_popen):  # type: ignore[misc, valid-type]
        def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
            started.append(args)
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Recorded)
    yield marker
    assert not marker.exists(), f"Ghostscript was started: {marker.read_text()!r}"
    assert started == [], f"programs were started: {started}"


# -- the detector detects ------------------------------------------------------------------------
def test_the_fake_ghostscript_notices_an_unrestricted_open(tmp_path, monkeypatch):
    """The premise: PIL left to itself starts ``gs`` on an EPS payload, and the marker shows it."""
    marker = tmp_path / "marker"
    (tmp_path / "gs").write_text(f"#!/bin/sh\necho started >> '{marker}'\nexit 1\n")
    (tmp_path / "gs").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(EpsImagePlugin, "gs_binary", None)
    with pytest.raises(Exception):  # noqa: B017 - whatever PIL raises once the fake gs fails
        Image.open(io.BytesIO(eps_bytes())).load()
    assert marker.exists()


# -- formats: pack time --------------------------------------------------------------------------
def test_open_image_refuses_other_formats_and_names_them(no_programs):
    Image.init()
    for fmt, payload in refused_payloads().items():
        with pytest.raises(NotDecodableError, match="not a format packload decodes|not an image in a format") as caught:
            open_image(payload)
        if Image.OPEN[fmt][1] is not None:  # without a signature check PIL can only try its decoder: not named
            assert caught.value.format == fmt
    assert not_decodable_reason(eps_bytes()).startswith("EPS image: not a format packload decodes (JPEG, ")
    assert not_decodable_reason(b"plain text, no image").startswith("not an image in a format packload decodes")
    for fmt in ("JPEG", "PNG", "BMP", "TIFF", "WEBP", "PPM", "GIF"):
        assert open_image(encoded(fmt)).format == fmt
    frames = [Image.fromarray(textured_rgb((8, 8), k)) for k in range(2)]
    mpo = io.BytesIO()
    frames[0].save(mpo, "MPO", save_all=True, append_images=frames[1:])
    assert open_image(mpo.getvalue()).format == "MPO"


@pytest.fixture()
def mixed_source(tmp_path):
    """Class ``a``: two real images, a GIF named ``.png`` (decodable), and refused formats named
    ``.jpg``/``.png``."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "good.png").write_bytes(encoded("PNG"))
    (src / "a" / "good.jpg").write_bytes(encoded("JPEG"))
    (src / "a" / "gif.png").write_bytes(encoded("GIF"))
    for k, (fmt, payload) in enumerate(refused_payloads().items()):
        (src / "a" / f"{fmt.lower()}.{'jpg' if k % 2 else 'png'}").write_bytes(payload)
    return src


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options", [EncodeOptions(), EncodeOptions(check="full"),
                                     EncodeOptions(encoding="jpeg"), EncodeOptions(encoding="raw", size=(8, 8))],
                         ids=["keep-fast", "keep-full", "jpeg", "raw"])
def test_pack_skips_formats_it_does_not_decode(mixed_source, tmp_path, backend, options, no_programs):
    dst = pack_path(tmp_path, backend)
    summary = pack(mixed_source, dst, backend=backend, options=options, workers=1, progress=False)
    ds = PackedImageFolder(dst)
    assert sorted(ds.path(i) for i in range(len(ds))) == ["a/gif.png", "a/good.jpg", "a/good.png"]
    reasons = {item["path"]: item["reason"] for item in ds.manifest["skipped"]}
    assert summary["skipped"] == len(REFUSED) == len(reasons)
    assert reasons["a/eps.png"].startswith("EPS image: not a format packload decodes (JPEG, ")
    assert all("format packload decodes" in reason for reason in reasons.values())
    for i in range(len(ds)):
        assert ds[i][0].size[0] > 0  # the kept ones read back


@pytest.mark.parametrize("backend", BACKENDS)
def test_strict_pack_stops_at_a_refused_format(mixed_source, tmp_path, backend, no_programs, capsys):
    with pytest.raises(SkippedFileError, match="not a format packload decodes"):
        pack(mixed_source, pack_path(tmp_path, backend), backend=backend, workers=1, progress=False, strict=True)
    code = main(["pack", str(mixed_source), str(pack_path(tmp_path, backend, "cli")), "--strict", "--quiet",
                 "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1 and "not a format packload decodes" in err


# -- formats: read time --------------------------------------------------------------------------
@pytest.fixture(params=BACKENDS)
def hostile_pack(request, tmp_path):
    """EPS under the codes JPEG, PNG and other, other refused formats under ``other``, a GIF under
    ``other`` (decodable), junk under JPEG, and a real JPEG last."""
    items = [("a/eps-as-jpeg.jpg", eps_bytes(), "JPEG"), ("a/eps-as-png.png", eps_bytes(), "PNG"),
             ("a/eps-as-other.jpg", eps_bytes(), "other"), ("a/eps-as-mpo.jpg", eps_bytes(), "MPO")]
    items += [(f"a/{fmt.lower()}.png", payload, "other") for fmt, payload in refused_payloads().items() if fmt != "EPS"]
    items += [("a/gif.png", encoded("GIF", (8, 8)), "other"), ("a/junk.jpg", b"\xff\xd8\xff" + b"junk" * 10, "JPEG"),
              ("a/real.jpg", encoded("JPEG", (8, 8)), "JPEG")]
    return craft(pack_path(tmp_path, request.param), items), items


@pytest.mark.parametrize("output", ["pil", "numpy", "tensor"])
@pytest.mark.parametrize("verify_reads", [False, True])
def test_reading_refuses_payloads_of_other_formats(hostile_pack, output, verify_reads, no_programs):
    path, items = hostile_pack
    for on_error in ("raise", "skip"):
        ds = PackedImageFolder(path, output=output, verify=verify_reads, on_error=on_error)
        for i, (name, _, _) in enumerate(items):
            if name in ("a/gif.png", "a/real.jpg"):
                assert ds[i][0] is not None
            elif on_error == "raise":
                with pytest.raises(PackFormatError, match=re.escape(name)) as caught:
                    ds[i]
                if not name.startswith("a/junk"):
                    assert "not a format packload decodes" in str(caught.value)
            else:
                with pytest.warns(UserWarning, match="skipping damaged"):
                    assert ds[i][0] is not None  # an intact record in its place
    ds = PackedImageFolder(path, output="bytes", verify=verify_reads)
    assert [ds[i][0] for i in range(len(items))] == [payload for _, payload, _ in items]  # undecoded, as stored


def test_batches_refuse_payloads_of_other_formats(hostile_pack, no_programs):
    path, items = hostile_pack
    ds = PackedImageFolder(path)
    for i, (name, _, _) in enumerate(items[:4]):
        with pytest.raises(PackFormatError, match=re.escape(name)):
            ds.get_batch([i], crop=CenterCrop(8))
    batch, _ = ds.get_batch([len(items) - 3, len(items) - 1], crop=CenterCrop(8))  # the GIF and the JPEG
    assert tuple(batch.shape) == (2, 3, 8, 8)


def test_verify_decode_refuses_payloads_of_other_formats(hostile_pack, no_programs, capsys):
    path, items = hostile_pack
    assert verify(path, progress=False)["ok"]  # checksums alone: every record is as written
    report = verify(path, decode=True, progress=False)
    bad = {item["path"]: item["problem"] for item in report["bad_records"]}
    assert not report["ok"] and set(bad) == {name for name, _, _ in items} - {"a/gif.png", "a/real.jpg"}
    assert "EPS image: not a format packload decodes" in bad["a/eps-as-jpeg.jpg"]
    assert main(["verify", str(path), "--decode", "--quiet"]) == 1
    assert "EPS image: not a format packload decodes" in capsys.readouterr().out


def test_libjpeg_turbo_sees_only_what_starts_like_a_jpeg(monkeypatch, no_programs):
    import packload.loaders.decode as decode_module

    real = decode_module.simplejpeg
    if real is None:
        pytest.skip("simplejpeg is not installed")
    seen: list[bytes] = []

    class Spy:
        """simplejpeg, noting the first bytes of everything it is given."""

        def __getattr__(self, name: str) -> Any:
            function = getattr(real, name)

            def call(data: Any, *args: Any, **kwargs: Any) -> Any:
                seen.append(bytes(data[:3]))
                return function(data, *args, **kwargs)

            return call

    monkeypatch.setattr(decode_module, "simplejpeg", Spy())
    with pytest.raises(NotDecodableError):
        decode_array(eps_bytes(), "JPEG", "RGB", 8, 8)
    assert decode_array(encoded("JPEG", (8, 8)), "JPEG", "RGB", 8, 8).shape == (8, 8, 3)
    assert seen and set(seen) == {b"\xff\xd8\xff"}


# -- formats: raw folders (tune, doctor) ---------------------------------------------------------
def test_folder_images_refuse_other_formats(mixed_source, no_programs):
    ds = FolderImages(mixed_source)
    names = [Path(p).name for p, _ in ds.samples]
    for i, name in enumerate(names):
        if name.startswith(("good", "gif")):
            assert ds[i][0].mode == "RGB"
        else:
            with pytest.raises(NotDecodableError, match=re.escape(name)):
                ds[i]
    assert FolderImages(mixed_source, output="bytes")[names.index("eps.png")][0] == eps_bytes()


# -- files that are not regular files ------------------------------------------------------------
def _block_device() -> str | None:
    for name in sorted(os.listdir("/dev")):
        path = os.path.join("/dev", name)
        try:
            if stat.S_ISBLK(os.stat(path).st_mode):
                return path
        except OSError:
            continue
    return None


@pytest.fixture()
def special_source(tmp_path):
    """Class ``a`` with one real image among a FIFO, a socket, links to devices and links into
    ``/dev``, ``/proc`` and ``/sys``, all with image names; a FIFO named like a class folder; a
    class ``b`` that is a link to ``/proc``; a symlink loop."""
    src = tmp_path / "src"
    a = src / "a"
    a.mkdir(parents=True)
    (a / "ok.jpg").write_bytes(encoded("JPEG"))
    os.mkfifo(a / "y.jpg")
    os.mkfifo(src / "fifo-class")
    (a / "zero.jpg").symlink_to("/dev/zero")
    (a / "null.png").symlink_to("/dev/null")
    (a / "urandom.png").symlink_to("/dev/urandom")
    block = _block_device()
    if block is not None:
        (a / "disk.png").symlink_to(block)
    (a / "dev").symlink_to("/dev")
    (a / "proc").symlink_to("/proc")
    (a / "sys").symlink_to("/sys")
    (a / "loop").symlink_to(a)
    (src / "b").symlink_to("/proc")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(a / "s.png"))
    yield src
    sock.close()


def test_scan_leaves_out_what_is_not_a_regular_file(special_source):
    with within():
        scan = scan_folder(special_source)
    assert [s.path for s in scan.samples] == ["a/ok.jpg"] and scan.classes == ["a", "b"]
    reasons = {item["path"]: item["reason"] for item in scan.ignored}
    assert reasons["a/y.jpg"] == "a FIFO (named pipe), not a regular file"
    assert reasons["a/s.png"] == "a socket, not a regular file"
    assert reasons["a/zero.jpg"] == "a character device (through a symbolic link), not a regular file"
    assert "character device" in reasons["a/null.png"] and "character device" in reasons["a/urandom.png"]
    if "a/disk.png" in reasons:
        assert "block device" in reasons["a/disk.png"]
    for link in ("a/dev", "a/proc", "a/sys", "b"):
        assert "file system" in reasons[link] and "not scanned" in reasons[link]
    assert "FIFO" in reasons["fifo-class"]
    assert "symlink loop" in reasons["a/loop"]
    assert {item["path"] for item in scan.not_regular} >= {"a/y.jpg", "a/s.png", "a/zero.jpg", "fifo-class"}
    assert "a/loop" not in {item["path"] for item in scan.not_regular}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("strict", [False, True])
def test_pack_never_waits_on_special_files(special_source, tmp_path, backend, strict, capsys):
    dst = pack_path(tmp_path, backend)
    with within():
        code = main(["pack", str(special_source), str(dst), "--json", "--workers", "1"] + ["--strict"] * strict)
    out, err = capsys.readouterr()
    if code != 0:  # --strict may refuse them: one line that names one
        assert strict and len(err.strip().splitlines()) == 1 and "not a regular file" in err
        return
    assert json.loads(out)["records"] == 1
    ds = PackedImageFolder(dst)
    assert [ds.path(i) for i in range(len(ds))] == ["a/ok.jpg"]
    listed = {item["path"]: item["reason"] for item in ds.manifest["ignored"] + ds.manifest["skipped"]}
    assert {"a/y.jpg", "a/s.png", "a/zero.jpg", "a/null.png", "a/urandom.png", "fifo-class"} <= set(listed)
    assert "FIFO (named pipe), not a regular file" in listed["a/y.jpg"]


def test_pack_refuses_a_special_file_system_as_source(tmp_path, capsys):
    with within():
        assert main(["pack", "/proc", str(tmp_path / "p.shards"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "proc file system" in err and len(err.strip().splitlines()) == 1


class _Grows:
    """``os`` as seen by a module, but ``fstat`` reports ``path`` 10 bytes shorter than it is: the
    file grew between sizing it and reading it."""

    def __init__(self, ino: int) -> None:
        self._ino = ino

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def fstat(self, fd: int) -> os.stat_result:
        info = os.fstat(fd)
        if info.st_ino != self._ino:
            return info
        fields = list(info)
        fields[stat.ST_SIZE] -= 10
        return os.stat_result(fields)


@pytest.mark.parametrize("options", [EncodeOptions(), EncodeOptions(check="full"), EncodeOptions(encoding="jpeg")],
                         ids=["keep-fast", "keep-full", "jpeg"])
def test_files_swapped_after_the_scan_are_skipped_when_read(tmp_path, options, monkeypatch):
    """What the scan saw as regular files and is not any more when read (the reads decide on
    their own): each is skipped with the reason, without blocking or reading on."""
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    big = encoded("PNG", (400, 400), seed=3, compress_level=0)  # more than one first read
    assert len(big) > encode_module.FIRST_READ
    (root / "a" / "ok.png").write_bytes(encoded("PNG"))
    (root / "a" / "big.png").write_bytes(big)
    os.mkfifo(root / "a" / "fifo.png")
    os.mkfifo(root / "a" / "fed.png")
    (root / "a" / "zero.jpg").symlink_to("/dev/zero")
    (root / "a" / "null.jpg").symlink_to("/dev/null")
    (root / "a" / "folder.jpg").mkdir()
    (root / "a" / "status.png").symlink_to("/proc/self/status")  # a regular file of size 0 that holds text
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "a" / "sock.png"))
    feeder = os.open(root / "a" / "fed.png", os.O_RDWR | os.O_NONBLOCK)  # a FIFO holding a whole PNG
    os.write(feeder, encoded("PNG"))
    names = ["ok.png", "fifo.png", "fed.png", "zero.jpg", "null.jpg", "folder.jpg", "status.png", "sock.png", "big.png"]
    samples = [Sample(f"a/{name}", 0) for name in names]
    try:
        with within():
            got = {item.path[2:]: item for item in encode_chunk(str(root), samples, options)}
            one = {s.path[2:]: encode_file(str(root), s, options) for s in samples}
        monkeypatch.setattr(encode_module, "os", _Grows(os.stat(root / "a" / "big.png").st_ino))
        monkeypatch.setattr(safe_files, "os", _Grows(os.stat(root / "a" / "big.png").st_ino))
        with within():
            [grown] = encode_chunk(str(root), [Sample("a/big.png", 0)], options)
    finally:
        os.close(feeder)
        sock.close()
    for decided in (got, one):
        assert isinstance(decided["ok.png"], Encoded) and isinstance(decided["big.png"], Encoded)
        reasons = {name: item.reason for name, item in decided.items() if isinstance(item, Skipped)}
        assert reasons["fifo.png"] == reasons["fed.png"] == "a FIFO (named pipe), not a regular file"
        assert reasons["zero.jpg"] == reasons["null.jpg"] == "a character device, not a regular file"
        assert reasons["folder.jpg"] == "a folder, not a regular file"
        assert reasons["sock.png"] == "a socket, not a regular file"
        assert "changed size while being read" in reasons["status.png"]
    assert isinstance(grown, Skipped) and "changed size while being read" in grown.reason


def test_folder_images_read_regular_files_only(tmp_path):
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    for name in ("x.png", "y.png", "z.png"):
        (root / "a" / name).write_bytes(encoded("PNG"))
    ds, raw = FolderImages(root), FolderImages(root, output="bytes")
    (root / "a" / "x.png").unlink()
    os.mkfifo(root / "a" / "x.png")  # swapped after the scan
    (root / "a" / "y.png").unlink()
    (root / "a" / "y.png").symlink_to("/dev/zero")
    with within():
        for dataset in (ds, raw):
            for i in (0, 1):
                with pytest.raises(OSError, match="not a regular file"):
                    dataset[i]
            assert dataset[2][0] is not None
    assert [Path(p).name for p, _ in FolderImages(root).samples] == ["z.png"]  # a new scan leaves them out


# -- terminal escaping ---------------------------------------------------------------------------
@pytest.fixture()
def hostile_names(tmp_path):
    """A class folder and files whose names hold ``HOSTILE``; one of the files is broken."""
    src = tmp_path / "src"
    cls = src / f"cls{HOSTILE}"
    cls.mkdir(parents=True)
    (cls / f"img{HOSTILE}.png").write_bytes(encoded("PNG"))
    (cls / "plain.png").write_bytes(encoded("PNG", seed=1))
    (cls / f"broken{HOSTILE}.jpg").write_bytes(b"not an image")
    (cls / f"notes{HOSTILE}.txt").write_text("left out")
    return src


def _escaped_forms(text: str) -> None:
    assert "\\x1b[2J" in text and "\\x9b" in text and "\\x0a" in text and "\\u202e" in text


@pytest.mark.parametrize("backend", BACKENDS)
def test_names_reach_the_terminal_escaped(hostile_names, tmp_path, backend, capsys):
    dst = tmp_path / (f"out{HOSTILE}.lmdb" if backend == "lmdb" else f"out{HOSTILE}")
    assert main(["pack", str(hostile_names), str(dst), "--workers", "1"]) == 0
    out, _ = capsys.readouterr()  # stderr holds the progress bar, which names the source only
    for line in out.splitlines():
        assert_terminal_safe(line)
    assert len(out.splitlines()) == 2 and out.startswith("packed 2 images") and "\\x1b[2J" in out

    assert main(["info", str(dst)]) == 0
    out, err = capsys.readouterr()
    for line in out.splitlines():
        assert_terminal_safe(line)
    _escaped_forms(out)
    assert "skipped cls" in out and "broken" in out

    crafted = craft(pack_path(tmp_path, backend, "eps"), [(f"cls{HOSTILE}/x{HOSTILE}.jpg", eps_bytes(), "JPEG")],
                    classes=[f"cls{HOSTILE}"])
    assert main(["verify", str(crafted), "--decode", "--quiet"]) == 1
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 2 and "EPS image" in out
    for line in out.splitlines() + err.splitlines():
        assert_terminal_safe(line)
    _escaped_forms(out)


@pytest.mark.parametrize("command", ["pack", "info", "verify"])
def test_json_output_is_valid_and_free_of_controls(hostile_names, tmp_path, command, capsys):
    dst = tmp_path / f"out{HOSTILE}.shards"
    assert main(["pack", str(hostile_names), str(dst), "--json", "--workers", "1"]) == 0
    packed = capsys.readouterr().out
    if command == "pack":
        out = packed
    else:
        assert main([command, str(dst), "--json"] + (["--decode"] if command == "verify" else [])) == 0
        out, _ = capsys.readouterr()
    assert_terminal_safe(out.rstrip("\n"))
    result = json.loads(out)
    assert f"out{HOSTILE}" in result["destination" if command == "pack" else "path"]  # parsed back as it is
    if command == "info":
        assert result["classes"] == [f"cls{HOSTILE}"]
        assert {item["path"] for item in result["skipped"]} == {f"cls{HOSTILE}/broken{HOSTILE}.jpg"}


def test_errors_naming_such_paths_are_escaped(hostile_names, tmp_path, capsys):
    code = main(["pack", str(hostile_names), str(tmp_path / "s.shards"), "--strict", "--quiet", "--workers", "1"])
    _, err = capsys.readouterr()
    assert code == 1 and len(err.strip().splitlines()) == 1 and "broken" in err
    assert_terminal_safe(err.rstrip("\n"))
    _escaped_forms(err)
    missing = tmp_path / f"missing{HOSTILE}.lmdb"
    for argv in (["info", str(missing)], ["verify", str(missing)], ["pack", str(missing), str(tmp_path / "o")]):
        assert main(argv) != 0
        _, err = capsys.readouterr()
        assert len(err.strip().splitlines()) == 1, err
        assert_terminal_safe(err.rstrip("\n"))
    with pytest.raises(SystemExit):
        main(["pack", str(hostile_names), str(tmp_path / "o"), "--encoding", f"bad{HOSTILE}"])
    _, err = capsys.readouterr()
    for line in err.splitlines():
        assert_terminal_safe(line)


def test_numpy_payload_views_still_decode():
    """The JPEG check on a memoryview payload (as the readers pass) lets real JPEGs through."""
    data = encoded("JPEG", (16, 16))
    view = memoryview(np.frombuffer(data, np.uint8))
    assert decode_array(view, "JPEG", "RGB", 16, 16).shape == (16, 16, 3)
