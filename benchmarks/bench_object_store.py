"""Reading a shards pack from an S3-compatible server with a round trip added to every request.

    python benchmarks/bench_object_store.py [--images 3000] [--delay-ms 20] [--rounds 2]

Starts moto's S3 server on 127.0.0.1 behind the tests' counting proxy (``tests/object_store.py``),
which holds every request ``--delay-ms`` before forwarding it; packs seeded JPEGs (about 100 KiB
each, ImageNet-like sizes) into a local shards pack and uploads it. Each round then reads every
record once in sampler order, undecoded, in batches of 256, three ways, interleaved: from the store
with a cold (new, empty) cache folder, again from the store with the cache that first read filled
(the second epoch), and from the local pack. Prints images/s of each and their ratios, and the
requests the proxy saw. LitData's and Streaming's streaming reads are not measured here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packload.loaders.dataset import PackedImageFolder  # noqa: E402
from packload.packer.pipeline import pack  # noqa: E402
from tests.object_store import ObjectStore  # noqa: E402


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


def epoch(ds: PackedImageFolder, batch: int = 256) -> tuple[float, int]:
    order = list(ds.sampler(seed=1))
    started = time.perf_counter()
    got = 0
    for k in range(0, len(order), batch):
        got += sum(len(b) for b, _ in ds.__getitems__(order[k : k + batch]))
    return time.perf_counter() - started, got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ObjectStore(delay_s=args.delay_ms / 1000) as store:
        root = Path(tmp)
        make_images(root / "src", args.images)
        pack(root / "src", root / "p.shards", progress=False)
        store.make_bucket("bkt")
        store.filesystem().put(str(root / "p.shards"), "bkt/p.shards", recursive=True)
        local = PackedImageFolder(root / "p.shards", output="bytes")
        rows: dict[str, list[float]] = {"cold": [], "second": [], "local": []}
        for r in range(args.rounds):
            cache = root / f"cache-{r}"
            before = len(store.proxy.requests)
            cold = PackedImageFolder("s3://bkt/p.shards", output="bytes", cache_dir=cache,
                                     storage_options=store.options)
            seconds, size = epoch(cold)
            rows["cold"].append(len(cold) / seconds)
            cold_requests = len(store.proxy.requests) - before
            before = len(store.proxy.requests)
            warm = PackedImageFolder("s3://bkt/p.shards", output="bytes", cache_dir=cache,
                                     storage_options=store.options)
            rows["second"].append(len(warm) / epoch(warm)[0])
            warm_requests = len(store.proxy.requests) - before
            rows["local"].append(len(local) / epoch(local)[0])
            print(f"round {r}: cold {rows['cold'][-1]:.0f} img/s ({cold_requests} requests, {size / 1e6:.0f} MB), "
                  f"second epoch {rows['second'][-1]:.0f} img/s ({warm_requests} requests), "
                  f"local {rows['local'][-1]:.0f} img/s", flush=True)
        best = {k: max(v) for k, v in rows.items()}
        print(f"best of {args.rounds}: cold {best['cold']:.0f}, second epoch {best['second']:.0f}, "
              f"local {best['local']:.0f} img/s; second/local {best['second'] / best['local']:.2f}, "
              f"cold/local {best['cold'] / best['local']:.2f}")


if __name__ == "__main__":
    main()
