"""Running out of space or hitting the file-size limit mid-pack ends in one clear line, a non-zero
exit, no pack at the destination, and the source untouched."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

from tests.image_factory import make_image_folder

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    make_image_folder(root, classes=("a", "b"), per_class=60, seed=11)
    big = root / "a"
    from PIL import Image

    from tests.image_factory import textured_rgb

    for k in range(12):  # a few large PNGs so the pack is several MB
        Image.fromarray(textured_rgb((300, 300), seed=100 + k)).save(big / f"big{k}.png")
    return root


def snapshot(root):
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_pack(args, **kwargs):
    return subprocess.run([sys.executable, "-m", "packload", *args, "--quiet"], capture_output=True, text=True,
                          cwd=REPO, **kwargs)


@pytest.mark.parametrize("name", ["x.lmdb", "x.shards"])
def test_disk_full(source, tmp_path, name):
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs: {mounted.stderr.decode().strip()}")
    try:
        before = snapshot(source)
        result = run_pack([str(source), str(small / name)])
        assert result.returncode == 1, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "--resume" in lines[0], result.stderr
        assert "No space left" in lines[0] or "free disk space" in lines[0], result.stderr
        assert not (small / name).exists()
        assert snapshot(source) == before
        info = subprocess.run([sys.executable, "-m", "packload", "info", str(small / (name + ".partial"))],
                              capture_output=True, text=True, cwd=REPO)
        assert info.returncode != 0  # the partial output is not accepted as a pack
    finally:
        subprocess.run(["umount", str(small)], check=False)


@pytest.mark.parametrize("name", ["x.lmdb", "x.shards"])
def test_file_size_limit(source, tmp_path, name):
    limit = 1 << 20

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    result = run_pack([str(source), str(tmp_path / name)], preexec_fn=cap)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--resume" in lines[0], result.stderr
    assert "too large" in lines[0].lower() or "file-size limit" in lines[0], result.stderr
    assert not (tmp_path / name).exists()
