"""Read one epoch of a pack across torch.distributed ranks and check the split, end to end.

    torchrun --standalone --nproc_per_node 2 benchmarks/ddp_read.py PACK [--backend gloo|nccl] [--pad|--drop]
             [--resume-at K] [--batch-size B] [--num-workers W] [--seed S] [--epoch E]

Every rank reads its share of one epoch with ``PackedImageFolder`` and its ``PackSampler``
through a DataLoader, and records which records it really received (the loader's output, not
the sampler's). The ranks gather what they saw and rank 0 checks: every rank got the same count;
with ``--pad`` (default) every record was seen, and only the padding (the first records of the
global order) twice; with ``--drop`` no record twice and only the tail left out; labels and
payload checksums agree with the index. With ``--resume-at K`` each rank then stops a fresh epoch
after K samples, saves the sampler state, and a new sampler and loader built from that state
(saved on rank 0, loaded on every rank) read the rest: what was seen before plus after the resume
must be exactly the full epoch of that rank. Rank 0 prints a JSON summary; every rank exits 1 when
a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packload import PackedImageFolder  # noqa: E402
from packload.core.errors import PackloadError  # noqa: E402
from packload.loaders.sampler import PackSampler  # noqa: E402


class Seen(Dataset):
    """``(index, label, CRC-32 of the payload)`` of each record read, to check what a rank got."""

    def __init__(self, pack: str) -> None:
        self.data = PackedImageFolder(pack, output="bytes", verify=True)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[int, int, int]:
        payload, label = self.data[index]
        return index, label, zlib.crc32(payload)


def read(loader: DataLoader, limit: int | None = None) -> list[tuple[int, int, int]]:
    """The (index, label, crc) triples the loader hands out, stopping after ``limit`` samples."""
    seen: list[tuple[int, int, int]] = []
    for index, label, crc in loader:
        seen += zip(index.tolist(), label.tolist(), crc.tolist(), strict=True)
        if limit is not None and len(seen) >= limit:
            return seen[:limit]
    return seen


def gather(values: list[int]) -> list[list[int]]:
    """All ranks' lists of ints (lengths may differ); on the GPU under nccl, which needs it."""
    world = dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(values)], dtype=torch.int64, device=device))
    longest = max(int(s) for s in sizes)
    padded = torch.full((longest,), -1, dtype=torch.int64, device=device)
    padded[: len(values)] = torch.tensor(values, dtype=torch.int64, device=device)
    out = [torch.empty(longest, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(out, padded)
    return [t[: int(n)].tolist() for t, n in zip(out, sizes, strict=True)]


def check_epoch(per_rank: list[list[int]], records: int, uneven: str, global_order: list[int]) -> dict[str, bool]:
    """The checks on one epoch's indices, as seen by each rank (pure: unit-tested on its own)."""
    world = len(per_rank)
    expect = -(-records // world) if uneven == "pad" else records // world
    counts = Counter(i for seen in per_rank for i in seen)
    total = sum(len(seen) for seen in per_rank)
    checks = {"same_count_per_rank": all(len(seen) == expect for seen in per_rank),
              "indices_in_range": all(0 <= i < records for i in counts)}
    if uneven == "pad":
        extra = Counter(global_order[: total - records])  # padding repeats the start of the order
        checks["every_record_seen"] = len(counts) == records
        checks["only_padding_repeated"] = all(counts[i] == 1 + extra[i] for i in counts)
    else:
        dropped = set(global_order[world * expect :])
        checks["no_record_twice"] = all(n == 1 for n in counts.values())
        checks["only_tail_dropped"] = set(range(records)) - set(counts) == dropped
    return checks


def loader_for(dataset: Seen, sampler: PackSampler, args: argparse.Namespace) -> DataLoader:
    return DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers,
                      persistent_workers=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pack", help="an .lmdb file or shards folder")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="process group backend")
    uneven = parser.add_mutually_exclusive_group()
    uneven.add_argument("--pad", dest="uneven", action="store_const", const="pad", help="pad to equal counts (default)")
    uneven.add_argument("--drop", dest="uneven", action="store_const", const="drop", help="drop the tail instead")
    parser.add_argument("--resume-at", type=int, metavar="K", help="also check a resume after K samples per rank")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epoch", type=int, default=1)
    args = parser.parse_args(argv)
    uneven_mode = args.uneven or "pad"
    if args.backend == "gloo" and os.environ.get("MASTER_ADDR", "127.0.0.1") in ("127.0.0.1", "localhost"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: no network interface needed
    if args.backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(args.backend)
    try:
        return run(args, uneven_mode)
    except PackloadError as exc:  # a missing or damaged pack: one line, no traceback
        print(f"ddp_read: error: {exc}", file=sys.stderr)
        return 2
    finally:
        dist.destroy_process_group()


def run(args: argparse.Namespace, uneven: str) -> int:
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = Seen(args.pack)
    records = len(dataset)
    targets = list(dataset.data.targets)
    reader = dataset.data.reader()
    crcs = reader.entries["payload_crc32"].tolist()

    def sampler() -> PackSampler:
        made = dataset.data.sampler(shuffle=True, seed=args.seed, uneven=uneven)
        made.set_epoch(args.epoch)
        return made

    started = time.perf_counter()
    full_sampler = sampler()
    seen = read(loader_for(dataset, full_sampler, args))
    seconds = time.perf_counter() - started
    indices = [i for i, _, _ in seen]
    per_rank = gather(indices)
    checks = check_epoch(per_rank, records, uneven, full_sampler.global_order().tolist())
    ok_local = all(targets[i] == label and crcs[i] == crc for i, label, crc in seen)
    checks["labels_and_checksums_match_index"] = all(flag == [1] for flag in gather([int(ok_local)]))
    checks["order_is_the_samplers"] = indices == full_sampler.epoch_order().tolist()

    resume: dict[str, Any] | None = None
    if args.resume_at is not None:
        first = sampler()
        before = read(loader_for(dataset, first, args), limit=args.resume_at)
        state = [first.state_dict(consumed=len(before)) if rank == 0 else None]
        dist.broadcast_object_list(state, src=0)  # saved on rank 0, loaded everywhere
        second = dataset.data.sampler(shuffle=True, seed=args.seed, uneven=uneven)
        second.load_state_dict(json.loads(json.dumps(state[0])))
        second.set_epoch(args.epoch)
        after = read(loader_for(dataset, second, args))
        joined = [i for i, _, _ in before] + [i for i, _, _ in after]
        same = gather([int(joined == indices)])
        checks["resume_completes_the_epoch"] = all(flag == [1] for flag in same)
        resume = {"at": args.resume_at, "before": len(before), "after": len(after)}

    ok = all(checks.values())
    if rank == 0:
        total = sum(len(seen) for seen in per_rank)
        print(json.dumps({
            "ok": ok, "checks": checks, "world_size": world, "backend": args.backend, "uneven": uneven,
            "records": records, "per_rank": [len(seen) for seen in per_rank], "seen_total": total,
            "distinct": len(set(i for seen in per_rank for i in seen)), "resume": resume,
            "seconds": round(seconds, 3), "samples_per_s_per_rank": round(len(seen) / seconds, 1) if seconds else None,
        }))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
