"""What checking each record's CRC-32 on read costs: the same pack read with and without
``verify=True``, interleaved, undecoded bytes and decoded, num_workers=0.

    python benchmarks/verify_cost.py PACK [--rounds 5] [--decode]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch.utils.data import DataLoader  # noqa: E402

from packload import PackedImageFolder, collate_uint8  # noqa: E402
from packload.diagnose.measure import time_loader  # noqa: E402
from packload.loaders.collate import collate_as_list  # noqa: E402
from packload.loaders.transforms import ResizeCenterCrop  # noqa: E402


def rate(pack: str, verify: bool, decode: bool) -> float:
    ds = PackedImageFolder(pack, verify=verify, output="pil" if decode else "bytes",
                           transform=ResizeCenterCrop(224) if decode else None)
    loader = DataLoader(ds, batch_size=64, sampler=ds.sampler(seed=0), num_workers=0,
                        collate_fn=collate_uint8 if decode else collate_as_list)
    result = time_loader(loader, max_batches=20 if decode else None).samples_per_s
    ds.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pack")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--decode", action="store_true", help="decode + ResizeCenterCrop(224) too")
    args = parser.parse_args(argv)
    for decode in (False, True) if args.decode else (False,):
        runs: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for verify in (False, True):
                runs[verify].append(rate(args.pack, verify, decode))
        off, on = statistics.median(runs[False]), statistics.median(runs[True])
        print(f"| {Path(args.pack).name} | {'decode+crop224' if decode else 'bytes'} | {off:,.0f} | {on:,.0f} | "
              f"{on / off:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
