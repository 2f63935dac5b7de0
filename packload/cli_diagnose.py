"""The subcommands that measure: ``tune`` (the DataLoader settings that keep a GPU fed),
``doctor`` (the machine and where a dataset's pipeline stalls) and ``demo`` (a dataset made, packed,
loaded and tuned). Their verdicts speak of this command line's flags, not the library's parameters.
"""

from __future__ import annotations

import argparse
from typing import Any

from packload.cli_parser import Parser, check_output_file, in_flag_names, subcommand_parsers
from packload.cli_report import EXIT_OK, emit, in_flags, print_report


# -- demo ------------------------------------------------------------------------------------
def add_demo(sub: Any) -> None:
    """Register ``packload demo``."""
    p = sub.add_parser("demo", help="generate a demo dataset, pack it, load it, and report the speed-up")
    p.add_argument("--dir", default="demo-data", help="working folder, about 200 MB (default ./demo-data)")
    p.add_argument("--count", type=int, default=2000, help="images to generate (default 2000)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print a machine-readable report")
    p.set_defaults(run=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from packload.demo import run_demo as demo

    result = demo(args.dir, count=args.count, progress=not (args.quiet or args.json))
    args.quiet = False  # --quiet hides the progress bars; the report is the point of the demo
    # its tune part speaks of `packload tune`'s flags (--budget, not budget_s), as that command's report does
    tune = tune_parser()
    result["report"] = [in_flag_names(line, tune) for line in result["report"]]
    result["tune"]["message"] = in_flag_names(result["tune"]["message"], tune)
    emit(args, result, result["report"])
    return EXIT_OK


# -- tune ------------------------------------------------------------------------------------
def add_tune(sub: Any) -> None:
    """Register ``packload tune``."""
    p = sub.add_parser("tune", help="find the fastest DataLoader settings against an emulated or real GPU step",
                       description="Benchmark num_workers, prefetch_factor and pin_memory for a pack or an image "
                                   "folder against a GPU step, pick the cheapest fast setting, and say whether "
                                   "training is input-bound.")
    p.add_argument("path", help="a pack (.lmdb file or shards folder) or an image folder")
    p.add_argument("--batch-size", type=int, default=256, help="your training batch size (default 256)")
    step = p.add_mutually_exclusive_group()
    step.add_argument("--step-ms", type=float, help="GPU time of one training step to emulate, in ms (default: 100, "
                      "said in the verdict; packload.watch(loader) measures yours)")
    step.add_argument("--model", choices=("small-cnn",), help="run a small CNN forward+backward on the GPU")
    loop = p.add_mutually_exclusive_group()
    loop.add_argument("--sync", dest="sync", action="store_true", default=True,
                      help="your loop waits for every step, e.g. loss.item() each step (the default, as for "
                           "doctor: a pick for it holds for a loop that does not wait as well)")
    loop.add_argument("--async", dest="sync", action="store_false",
                      help="your loop never waits for the step before loading the next batch")
    p.add_argument("--transform", metavar="MODULE:CALLABLE",
                   help="time your own transform (e.g. mytraining.data:train_transform) instead of the built-in "
                        "resize and centre crop; it must give equal-sized images")
    p.add_argument("--budget", type=float, default=60.0, help="seconds to spend searching (default 60)")
    p.add_argument("--max-workers", type=int, help="largest num_workers to try (default: the usable cores, and past "
                   "them, up to 64, while the workers wait on storage rather than compute)")
    p.add_argument("--save", metavar="FILE", help="write the winning DataLoader settings as JSON")
    p.add_argument("--plot", metavar="FILE", help="draw throughput against num_workers (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print a machine-readable result")
    p.set_defaults(run=run_tune)


def run_tune(args: argparse.Namespace) -> int:
    from packload.diagnose.tune_inputs import tune_path
    from packload.diagnose.tune_plot import require_matplotlib
    from packload.diagnose.tune_report import format_report

    check_output_file("--save", args.save)
    check_output_file("--plot", args.plot)  # the file first: a wrong path is said with or without matplotlib
    if args.plot:
        require_matplotlib()  # before the search, not after a minute of it
    result = tune_path(args.path, batch_size=args.batch_size, step_ms=args.step_ms, model=args.model,
                       budget_s=args.budget, max_workers=args.max_workers, progress=not (args.quiet or args.json),
                       sync=args.sync, transform=args.transform)
    if args.save:
        result.save(args.save)
    if args.plot:
        result.plot(args.plot)
    result.message = in_flags(args, result.message)  # the verdict in the words the user typed
    print_report(args, result.as_dict(), [] if args.json else format_report(result))
    return EXIT_OK


def tune_parser() -> Parser:
    """``packload tune``'s parser, alone: the demo's report speaks of its flags."""
    parser = Parser(prog="packload")
    add_tune(parser.add_subparsers(dest="command"))
    [tune] = subcommand_parsers(parser)
    return tune


# -- doctor ----------------------------------------------------------------------------------
def add_doctor(sub: Any) -> None:
    """Register ``packload doctor``."""
    p = sub.add_parser("doctor", help="is slow training really the GPU's fault? check the machine and a dataset",
                       description="Check this machine (GPU, CPUs, memory, /dev/shm, storage) and, given an "
                                   "image folder or a pack, measure where the input pipeline stalls.")
    p.add_argument("path", nargs="?", help="an image folder or a pack (.lmdb file or shards folder) to analyse")
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch (default 64)")
    p.add_argument("--step-ms", type=float, help="GPU time of one training step in ms (default: 100, said in the "
                   "verdict)")
    p.add_argument("--model", choices=("small-cnn",), help="run a real small CNN step instead of --step-ms (CUDA)")
    p.add_argument("--workers", type=int, help="DataLoader workers (default: the usable CPUs)")
    p.add_argument("--max-batches", type=int, default=20, help="timed batches per loader pass (default 20)")
    p.add_argument("--repeats", type=int, default=2, help="passes per loader figure, the best counts (default 2)")
    p.add_argument("--crop", type=int, default=224, help="resize + centre-crop size of the loader (default 224)")
    p.add_argument("--no-measure", action="store_true", help="machine and dataset checks only, no timing")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--json", action="store_true", help="print the report as JSON (packload.diagnose.doctor.REPORT_SCHEMA)")
    p.set_defaults(run=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from packload.diagnose.doctor import doctor, format_report

    report = doctor(args.path, batch_size=args.batch_size, step_ms=args.step_ms, model=args.model,
                    workers=args.workers, max_batches=args.max_batches, repeats=args.repeats, crop=args.crop,
                    measure=not args.no_measure, progress=not (args.quiet or args.json))
    report["verdict"] = in_flags(args, report["verdict"])  # in the words the user typed
    for item in report["checks"]:
        item["message"] = in_flags(args, item["message"])
        item["fix"] = item["fix"] and in_flags(args, item["fix"])
    print_report(args, report, [] if args.json else format_report(report))
    return EXIT_OK  # a diagnosis: exit 0 whatever it finds

