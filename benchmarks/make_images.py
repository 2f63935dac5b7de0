"""Generate a seeded synthetic ImageFolder dataset for benchmarks.

    python benchmarks/make_images.py imagenet OUT [--count N] [--classes K] [--seed S] [--workers W] [--quiet]
    python benchmarks/make_images.py cifar OUT ...

A thin command line over :mod:`packload.packer.synthetic`; see there for what the images look like.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

try:
    from packload.packer.synthetic import make_cifar_like, make_imagenet_like
except ModuleNotFoundError:  # run as a script from a checkout: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from packload.packer.synthetic import make_cifar_like, make_imagenet_like

_DEFAULTS = {"imagenet": (20000, 20), "cifar": (50000, 10)}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="make_images.py",
        description="Write a seeded synthetic ImageFolder dataset (OUT/<class>/<file>).",
    )
    p.add_argument("kind", choices=sorted(_DEFAULTS), help="imagenet: 200-500 px JPEGs; cifar: 32x32 PNGs")
    p.add_argument("out", type=Path, help="output folder (must be missing or empty unless --overwrite)")
    p.add_argument("--count", type=int, default=None, help="number of images (imagenet 20000, cifar 50000)")
    p.add_argument("--classes", type=int, default=None, help="number of classes (imagenet 20, cifar 10)")
    p.add_argument("--seed", type=int, default=0, help="random seed; same seed gives identical files")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: all cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--overwrite", action="store_true", help="allow writing into a non-empty OUT")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (0 ok, 2 usage error or non-empty OUT)."""
    args = _parser().parse_args(argv)
    out: Path = args.out
    if out.exists() and not out.is_dir():
        print(f"error: {out} exists and is not a directory", file=sys.stderr)
        return 2
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        print(f"error: {out} is not empty (use --overwrite to write into it anyway)", file=sys.stderr)
        return 2

    default_count, default_classes = _DEFAULTS[args.kind]
    make = make_imagenet_like if args.kind == "imagenet" else make_cifar_like
    try:
        files = make(
            out,
            count=default_count if args.count is None else args.count,
            classes=default_classes if args.classes is None else args.classes,
            seed=args.seed,
            workers=args.workers,
            progress=not args.quiet,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    total = sum(f.stat().st_size for f in files)
    n_classes = len({f.parent.name for f in files})
    print(
        f"{args.kind}: {len(files)} files in {n_classes} classes under {out}, "
        f"{total / 1e6:.1f} MB total, mean {total / len(files) / 1e3:.1f} KB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
