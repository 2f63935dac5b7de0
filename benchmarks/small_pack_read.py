"""Does packing at training resolution pay? Decode + ResizeCenterCrop(224) from a pack made with
``--encoding jpeg --max-side 256`` (read with ``decode_size``) against the ImageFolder-style loader
on the original files, interleaved, same workers and batch size.

    python benchmarks/small_pack_read.py ORIGINAL_FOLDER SMALL_PACK [--workers 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch.utils.data import DataLoader  # noqa: E402

from loaders import PackedImageFolder, collate_uint8  # noqa: E402
from loaders.folder import FolderImages  # noqa: E402
from loaders.measure import time_loader  # noqa: E402
from loaders.transforms import ResizeCenterCrop  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("pack")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=40)
    args = parser.parse_args(argv)
    crop = ResizeCenterCrop(224)
    runs: dict[str, list[float]] = {"folder": [], "pack": []}
    for _ in range(args.rounds):
        folder = FolderImages(args.folder, transform=crop)
        runs["folder"].append(time_loader(DataLoader(folder, batch_size=64, shuffle=True, num_workers=args.workers,
                                                     collate_fn=collate_uint8), max_batches=args.batches).samples_per_s)
        pack = PackedImageFolder(args.pack, transform=crop, decode_size=(224, 224))
        runs["pack"].append(time_loader(DataLoader(pack, batch_size=64, sampler=pack.sampler(seed=0),
                                                   num_workers=args.workers, collate_fn=collate_uint8),
                                        max_batches=args.batches).samples_per_s)
    folder_rate, pack_rate = statistics.median(runs["folder"]), statistics.median(runs["pack"])
    print(f"| original files, FolderImages | {folder_rate:,.0f} | 1.00× |")
    print(f"| pack --encoding jpeg --max-side 256, decode_size=(224, 224) | {pack_rate:,.0f} | "
          f"{pack_rate / folder_rate:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
