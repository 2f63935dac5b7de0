"""Streaming reads from an S3-compatible server with a round trip added to every request: packload
against LitData and MosaicML Streaming, cold and second epoch, and the local pack.

    python benchmarks/bench_object_store.py [--images 3000] [--delay-ms 20] [--rounds 2] [--workers 0,2]
        [--peers-python .venv-peers/bin/python]

Starts moto's S3 server on 127.0.0.1 (objects kept in memory unless ``--on-disk``) behind the tests'
proxy (``tests/object_store.py``), which holds every request ``--delay-ms`` before forwarding it and
streams the answer back. Makes seeded JPEGs
(about 100 KiB each, ImageNet-like sizes) and writes three copies of them: a packload shards pack,
a LitData ``optimize()`` output and a Streaming ``MDSWriter`` output (through
``benchmarks/peers.py``, in the peers' environment), all of 64 MB objects, and uploads each to the
server. Each round then reads every image through a DataLoader with each of the ``--workers``
worker counts (0 reads in the main process, where packload decodes a batch on threads; batches of
64), bytes and decoded (packload's codec for all three), in a fresh process per read: packload
(``PackedImageFolder`` of the ``s3://`` URL with its sampler: in stored order, as the peers read
here, and as ``packload-shuffled`` with its block-local shuffle), LitData
(``litdata.StreamingDataset`` with ``storage_options={"endpoint_url": ...}``) and Streaming
(``streaming.StreamingDataset`` with ``S3_ENDPOINT_URL``), each with a new, empty cache folder: the
first epoch is the cold read; for bytes, a second epoch follows in the same process, from the cache
the first filled. Then packload's local pack. The order of the readers turns each round. Each reader
is compared at its best (of the rounds and the worker counts). Prints images/s, the first batch's
wait and the requests the proxy saw for each, and the ratios.

The peers need their own environment (BENCHMARKS.md, "Reproduce"); it must import *this* checkout's
packload nowhere: the peers' reads and writes import only ``benchmarks/peers.py``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# packload in stored order (as the peers read here), and with its block-local shuffle (a training run's order)
READERS = ("packload", "packload-shuffled", "litdata", "streaming")
MODES = ("bytes", "decoded")
BATCH = 64
OBJECT_SIZE = 64 << 20  # bytes: packload's shards, LitData's chunks and Streaming's shards alike
BUCKET = "bkt"
WHERE = {"packload": "p.shards", "packload-shuffled": "p.shards", "litdata": "litdata", "streaming": "mds"}
CHILD_TIMEOUT = 900  # seconds one read may take


def make_images(root: Path, count: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"c{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        h, w = int(rng.integers(300, 420)), int(rng.integers(380, 500))
        base = rng.integers(0, 255, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
        pixels = np.kron(base, np.ones((8, 8, 1), np.uint8))[:h, :w]
        noise = rng.integers(0, 40, pixels.shape, dtype=np.uint8)
        Image.fromarray(pixels + noise).save(folder / f"{i:06d}.jpg", quality=90)


def samples_of(src: Path) -> list[tuple[Path, int]]:
    """(file, class index) in ImageFolder's order: classes sorted, files sorted within each."""
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    return [(f, label) for label, name in enumerate(classes) for f in sorted((src / name).iterdir())]


# ---------------------------------------------------------------- what the children run


def decode_rgb(data: bytes) -> np.ndarray:
    """HxWx3 uint8 with packload's codec (libjpeg-turbo through simplejpeg; PIL without it)."""
    try:
        import simplejpeg  # noqa: PLC0415 - in both environments, looked up in the child

        return simplejpeg.decode_jpeg(bytes(data), colorspace="RGB")
    except ImportError:
        return np.asarray(Image.open(io.BytesIO(bytes(data))).convert("RGB"))


def as_bytes(data: bytes) -> bytes:
    return bytes(data)


def as_list(batch: list[Any]) -> list[Any]:
    return batch


def _peers() -> Any:
    """``benchmarks/peers.py`` as a module of its own (the peers' environment has no packload of
    this checkout to import, so the ``benchmarks`` package is not put on the path)."""
    sys.path.insert(0, str(HERE))
    import peers  # noqa: PLC0415

    return peers


def write_peer(name: str, src: Path, out: Path) -> None:
    peers = _peers()
    peer = peers.LitDataPeer(chunk_bytes="64MB") if name == "litdata" else peers.StreamingPeer(size_limit=OBJECT_SIZE)
    reason = peer.unavailable()
    if reason:
        raise SystemExit(f"{name}: {reason}")
    peer.write(samples_of(src), out)


def peer_dataset(name: str, url: str, cache: Path, endpoint: str, decode: Any) -> Any:
    """The peer's streaming dataset of ``url``, pointed at the server with the peer's own options."""
    import functools  # noqa: PLC0415

    peers = _peers()
    if name == "litdata":
        import litdata  # noqa: PLC0415

        ds = litdata.StreamingDataset(url, cache_dir=str(cache), shuffle=False,
                                      storage_options={"endpoint_url": endpoint})
        return peers._MapIterable(ds, functools.partial(peers._litdata_pair, decode=decode), len(ds))
    streaming = peers._import_streaming()
    os.environ["S3_ENDPOINT_URL"] = endpoint
    ds = streaming.StreamingDataset(remote=url, local=str(cache), shuffle=False, batch_size=BATCH)
    return peers._StreamingIterable(ds, functools.partial(peers._mds_pair, decode=decode), len(ds))


def read(reader: str, mode: str, url: str, cache: Path, endpoint: str, workers: int,
         epochs: int = 1) -> dict[str, Any]:
    """Read every image ``epochs`` times through one DataLoader; the first epoch's figures (timed from
    building the dataset), with the second's under ``second_epoch`` (timed from its start)."""
    import torch.utils.data as tud  # noqa: PLC0415 - imports are the process's cost, not the read's: before the clock

    # Each reader's client of the store too (s3fs for packload, boto3 for the peers): each imports it
    # on its first request, which would put a library's import time into the read's.
    if reader.startswith("packload"):
        sys.path.insert(0, str(REPO))
        from packload.loaders.dataset import PackedImageFolder  # noqa: PLC0415

        if "://" in url:
            import s3fs  # noqa: F401, PLC0415
    elif reader == "litdata":
        import boto3  # noqa: F401, PLC0415
        import litdata  # noqa: F401, PLC0415
        import litdata.streaming.client  # noqa: F401, PLC0415
    else:
        import boto3  # noqa: F401, PLC0415, I001

        _peers()._import_streaming()
    started = time.perf_counter()
    decode = decode_rgb if mode == "decoded" else as_bytes
    sampler = None
    if reader.startswith("packload"):
        options = {"client_kwargs": {"endpoint_url": endpoint}} if "://" in url else None
        ds = PackedImageFolder(url, output="numpy" if mode == "decoded" else "bytes",
                               cache_dir=cache if options else None, storage_options=options)
        # Stored order, or the default block-local shuffle; either way announcing the next window.
        sampler = ds.sampler(shuffle=reader == "packload-shuffled", seed=1)
    else:
        ds = peer_dataset(reader, url, cache, endpoint, decode)
    loader = tud.DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=workers, collate_fn=as_list)
    figures: dict[str, Any] = {}
    for epoch in range(epochs):  # the second from the cache the first filled, in the same process
        if sampler is not None:
            sampler.set_epoch(epoch)
        first = None
        images = size = 0
        for batch in loader:
            if first is None:
                first = time.perf_counter() - started
            images += len(batch)
            size += sum(len(item) if isinstance(item, bytes) else item.nbytes for item, _ in batch)
        seconds = time.perf_counter() - started
        figures = figures or {"images": images, "bytes": size, "seconds": seconds, "first_batch_s": first,
                              "images_per_s": images / seconds}
        if epoch:
            figures["second_epoch"] = {"images": images, "seconds": seconds, "first_batch_s": first,
                                       "images_per_s": images / seconds}
        started = time.perf_counter()
    return figures


# ---------------------------------------------------------------- the run


def child(python: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run this script's ``args`` in a fresh ``python`` process; its last line, as JSON."""
    done = subprocess.run([python, __file__, *args], capture_output=True, text=True, timeout=CHILD_TIMEOUT,
                          env={**os.environ, **(env or {})}, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])}: failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", default="0,2", help="DataLoader worker counts, comma separated: every "
                        "reader reads with each, and is compared at its best")
    parser.add_argument("--peers-python", default=str(REPO / ".venv-peers" / "bin" / "python"),
                        help="the Python of the environment that has LitData and Streaming")
    parser.add_argument("--readers", default=",".join(READERS), help="comma separated, of " + ", ".join(READERS))
    parser.add_argument("--modes", default=",".join(MODES), help="comma separated, of " + ", ".join(MODES))
    parser.add_argument("--on-disk", action="store_true", help="moto keeps objects in temporary files (its "
                        "default), not in memory: every ranged request then reads the whole object from disk")
    args = parser.parse_args()
    readers, modes = args.readers.split(","), args.modes.split(",")
    worker_counts = [int(n) for n in args.workers.split(",")]
    sys.path.insert(0, str(REPO))
    from packload.packer.pipeline import pack  # noqa: PLC0415
    from tests.object_store import FAKE_CREDENTIALS, ObjectStore  # noqa: PLC0415

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server logs every request otherwise

    with tempfile.TemporaryDirectory() as tmp, ObjectStore(delay_s=args.delay_ms / 1000,
                                                               in_memory=not args.on_disk) as store:
        root = Path(tmp)
        make_images(root / "src", args.images)
        pack(root / "src", root / "p.shards", shard_size=OBJECT_SIZE, progress=False)
        store.make_bucket(BUCKET)
        fs = store.filesystem()
        fs.put(str(root / "p.shards"), f"{BUCKET}/{WHERE['packload']}", recursive=True)
        env = {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": store.proxy.endpoint}
        python = {"packload": sys.executable, "packload-shuffled": sys.executable, "litdata": args.peers_python,
                  "streaming": args.peers_python}
        for name in readers:
            if name.startswith("packload"):
                continue
            out = root / name
            child(python[name], "write", name, str(root / "src"), str(out), env=env)
            written = out / "chunks" if name == "litdata" else out
            fs.put(str(written), f"{BUCKET}/{WHERE[name]}", recursive=True)
        rows: dict[str, list[dict[str, Any]]] = {}

        def run(key: str, name: str, mode: str, url: str, cache: Path, workers: int, epochs: int = 1) -> None:
            before = len(store.proxy.requests)
            got = child(python[name], "read", name, mode, url, str(cache), store.proxy.endpoint,
                        str(workers), str(epochs), env=env)
            got["requests"] = len(store.proxy.requests) - before
            got["workers"] = workers
            second = got.pop("second_epoch", None)
            rows.setdefault(key, []).append(got)
            print(f"  {key:36s} workers {workers}  {got['images_per_s']:8.0f} img/s  first batch "
                  f"{got['first_batch_s']:.2f} s  {got['requests']} requests  {got['images']} images", flush=True)
            if second is not None:  # requests: both epochs' (the cold read's are its own row's)
                second.update(workers=workers, requests=got["requests"])
                rows.setdefault(key.replace(" cold", " second epoch"), []).append(second)
                print(f"  {key.replace(' cold', ' second epoch'):36s} workers {workers}  "
                      f"{second['images_per_s']:8.0f} img/s  first batch {second['first_batch_s']:.2f} s", flush=True)

        for r in range(args.rounds):
            print(f"round {r}", flush=True)
            turn = readers[r % len(readers):] + readers[: r % len(readers)]
            for mode in modes:
                for workers in worker_counts:
                    for name in turn:
                        url = f"s3://{BUCKET}/{WHERE[name]}"
                        cache = root / f"cache-{name}-{mode}-{workers}-{r}"
                        run(f"{name} {mode} cold", name, mode, url, cache, workers, 2 if mode == "bytes" else 1)
            if "packload" in readers:
                for workers in worker_counts:
                    run("packload local bytes cold", "packload", "bytes", str(root / "p.shards"), root / "unused",
                        workers, 2)
        print(summary(rows, readers))


def summary(rows: dict[str, list[dict[str, Any]]], readers: list[str]) -> str:
    """Each reader's best read (over the rounds and the worker counts), and the ratios of packload's."""
    best = {key: max(runs, key=lambda run: run["images_per_s"]) for key, runs in rows.items()}
    rate = {key: run["images_per_s"] for key, run in best.items()}
    lines = ["best of the rounds and worker counts, images/s:"]
    lines += [f"  {key:36s} {run['images_per_s']:8.0f}  (workers {run['workers']}, first batch "
              f"{run['first_batch_s']:.2f} s, {run['requests']} requests)" for key, run in best.items()]
    for mode in MODES:
        for ours in ("packload", "packload-shuffled"):
            mine = rate.get(f"{ours} {mode} cold")
            for peer in ("litdata", "streaming"):
                theirs = rate.get(f"{peer} {mode} cold")
                if mine and theirs:
                    lines.append(f"  {ours} / {peer}, {mode}, cold: {mine / theirs:.2f}x")
    local = rate.get("packload local bytes second epoch")
    for ours in ("packload", "packload-shuffled"):
        if local and rate.get(f"{ours} bytes second epoch"):
            lines.append(f"  {ours} second epoch / the local pack's: {rate[f'{ours} bytes second epoch'] / local:.2f}")
    return "\n".join(lines)


def child_main(argv: list[str]) -> None:
    if argv[0] == "write":
        write_peer(argv[1], Path(argv[2]), Path(argv[3]))
        print(json.dumps({"ok": True}))
    else:
        _, reader, mode, url, cache, endpoint, workers, epochs = argv
        print(json.dumps(read(reader, mode, url, Path(cache), endpoint, int(workers), int(epochs))))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("write", "read"):
        child_main(sys.argv[1:])
    else:
        main()
