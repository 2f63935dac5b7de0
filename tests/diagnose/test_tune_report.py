"""What ``packload tune`` shows agrees with itself and speaks to the one who ran it: every figure is one
trial's measurement, the same in the progress lines, the table, the pick, ``--json`` and the verdict;
the verdict follows from those figures (PackLoader recommended when it was measured faster, storage
named only when the page cache says the data came from it), and the command line's verdict names
its flags, not the library's parameters. Runs on a small pack of real images with a 1 ms step."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from packload import pack
from packload.cli import build_parser, main
from packload.cli_parser import in_flag_names, subcommand_parsers
from packload.diagnose.training_loop import DEFAULT_STEP_MS, loop_words
from packload.diagnose.tune import TuneResult, tune
from packload.diagnose.tune_report import TABLE_HEAD, format_report
from packload.diagnose.tune_trials import Trial, rate_text
from tests.diagnose.test_tune import Sleepy
from tests.diagnose.test_tune_result import result as hand_built
from tests.image_factory import make_image_folder, write_odd_images

PROGRESS = re.compile(r"^tune: #(\d+) workers=(\d+) prefetch=(\S+) pin=(yes|no): ([\d,]+ img/s)")
FAST_PROGRESS = re.compile(r"^tune PackLoader: #(\d+) PackLoader threads=(\d+): ([\d,]+ img/s)")
ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\S+)\s+(yes|no)\s+([\d,]+ img/s|none)\s")


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tune-report")
    make_image_folder(root / "images", classes=("ant", "bee"), per_class=12, seed=7)
    write_odd_images(root / "images" / "bee")  # grey, palette, alpha, tall and wide images among them
    pack(root / "images", root / "p.shards", workers=1, progress=False)
    return root / "p.shards"


def _rows(lines: list[str], start: int) -> dict[int, tuple[str, str, str, str, str]]:
    """The table rows from ``lines[start]`` on, until the first line that is not one."""
    rows = {}
    for line in lines[start:]:
        match = ROW.match(line)
        if not match:
            break
        rows[int(match.group(1))] = (match.group(2), match.group(3), match.group(4), match.group(5), line)
    return rows


def test_progress_table_pick_and_verdict_show_the_same_figures(small_pack: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", str(small_pack), "--step-ms", "1", "--batch-size", "4", "--budget", "4",
                 "--max-workers", "1"]) == 0
    captured = capsys.readouterr()
    out, err = captured.out.splitlines(), captured.err.splitlines()
    head = next(k for k, line in enumerate(out) if line.lstrip().startswith("#  workers"))
    rows = _rows(out, head + 1)
    assert rows and sorted(rows) == list(range(1, len(rows) + 1))
    announced = [PROGRESS.match(line) for line in err if PROGRESS.match(line)]
    assert len(announced) == len(rows), "one progress line per trial"
    for match in announced:  # each progress line shows its row's configuration and figure
        workers, prefetch, pin, figure, _ = rows[int(match.group(1))]
        assert (workers, prefetch, pin, figure) == match.group(2, 3, 4, 5)
    assert not any(re.search(r"\d s/s", line) for line in err), "no rate of seconds per second"
    [pick_line] = [line for line in out if line.lstrip().startswith("pick (#")]
    number, figure = re.search(r"pick \(#(\d+)\): .*?: ([\d,]+ img/s)", pick_line).groups()
    assert rows[int(number)][3] == figure and "<- pick" in rows[int(number)][4], "the pick is its row, its figure"
    assert sum("<- pick" in row[4] for row in rows.values()) == 1
    [verdict] = [line for line in out if line.lstrip().startswith("verdict: ")]
    fast_rows_at = next(k for k, line in enumerate(out) if line.lstrip().startswith("PackLoader, batches built"))
    fast_rows = _rows(out, fast_rows_at + 1)
    fast_announced = [FAST_PROGRESS.match(line) for line in err if FAST_PROGRESS.match(line)]
    assert fast_rows and len(fast_announced) == len(fast_rows)
    for match in fast_announced:
        assert (fast_rows[int(match.group(1))][0], fast_rows[int(match.group(1))][3]) == match.group(2, 3)
    [fast_line] = [line for line in out if line.lstrip().startswith("fast path: PackLoader with")]
    fast_figure = re.search(r": ([\d,]+ img/s), ", fast_line).group(1)
    [fast_pick] = [row for row in fast_rows.values() if "<- its pick" in row[4]]
    assert fast_pick[3] == fast_figure
    assert figure in verdict, "the verdict gives the DataLoader pick's figure"
    if "use PackLoader" in verdict or "use it" in verdict:
        assert fast_figure in verdict
    one_epoch = next(line for line in out if line.lstrip().startswith("one epoch:"))
    assert f"at {figure}" in one_epoch


def test_json_names_the_rows_of_the_pick_and_the_fastest(small_pack: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", str(small_pack), "--step-ms", "1", "--batch-size", "4", "--budget", "3",
                 "--max-workers", "1", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "", "with --json no progress line is written"
    out = json.loads(captured.out)
    assert out["winner"] == out["trials"][out["winner_index"]]
    assert out["fastest"] == out["trials"][out["fastest_index"]]
    fast = out["fast_path"]
    assert fast["pick"] == fast["trials"][fast["pick_index"]] and fast["samples_per_s"] == fast["pick"]["samples_per_s"]
    assert rate_text(out["winner"]["samples_per_s"]) in out["message"]
    assert out["loader"]["num_workers"] == out["winner"]["num_workers"]
    assert out["epoch_s"] == pytest.approx(out["samples_per_epoch"] / out["winner"]["samples_per_s"])


def test_without_a_step_time_the_default_is_used_and_said(small_pack: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`packload tune PACK` runs (no step time required), against doctor's default step, and the
    verdict says it was assumed, how to measure one, and the loop assumed, in the command's words."""
    assert main(["tune", str(small_pack), "--batch-size", "4", "--budget", "2", "--max-workers", "0"]) == 0
    out = capsys.readouterr().out
    assert DEFAULT_STEP_MS == 100
    assert "assumed a GPU step of 100 ms per batch of 4 (the default: measure yours with packload.watch(loader) " \
           "and give it as --step-ms" in out
    assert loop_words(True) in out
    assert not re.search(r"\b(budget_s|step_ms|max_workers|batch_size)\b", out)


# -- the verdict, from figures given ----------------------------------------------------------------
@pytest.fixture(scope="module")
def measured() -> TuneResult:
    return tune(Sleepy(0), 8, step_ms=2, budget_s=2, max_workers=0, progress=False, device="cpu")


def _result(base: TuneResult, rate: float = 500.0, gpu_wait: float = 0.5, cpu: float = 0.2, **changes) -> TuneResult:
    """``base`` with one DataLoader trial of ``rate`` (the pick and the fastest), and ``changes``."""
    trial = Trial(2, 2, False, samples_per_s=rate, batches_per_s=rate / 8, gpu_wait=gpu_wait, startup_s=0.5,
                  worker_rss_mb=0.0, worker_pss_mb=0.0, noise=0.01, cpu_cores=cpu, batches=50, seconds=1.0,
                  phase="coarse")
    fields = {"trials": [trial], "winner": trial, "fastest": trial, "stopped": "plateau", "fast_path": None,
              "cpu_others": 0.0, "page_cache": {"before": None, "after": None}, **changes}
    result = dataclasses.replace(base, **fields)
    result.machine = {**base.machine, "usable_cores": 4}
    result.conclude()
    return result


def _fast(rate: float, gpu_wait: float) -> dict:
    pick = {"num_workers": 2, "samples_per_s": rate, "gpu_wait": gpu_wait}
    return {"trials": [pick], "pick": pick, "pick_index": 0, "threads": 2, "samples_per_s": rate,
            "gpu_wait": gpu_wait, "code": "loader = packload.PackLoader(ds, 8, threads=2)"}


def test_packloader_measured_faster_is_recommended_with_its_figure(measured: TuneResult) -> None:
    faster = _result(measured, fast_path=_fast(800.0, 0.3))
    assert faster.verdict == "input-bound"
    assert "PackLoader with 2 threads delivers 800 img/s, 1.60x the DataLoader pick: use it" in faster.message
    keeps_up = _result(measured, fast_path=_fast(1500.0, 0.02))
    assert keeps_up.verdict == "compute-bound" and "use PackLoader" in keeps_up.message
    assert "1,500 img/s" in keeps_up.message and "500 img/s" in keeps_up.message
    same = _result(measured, fast_path=_fast(510.0, 0.49))  # within the tolerance: the DataLoader pick stays
    assert "use PackLoader" not in same.message and "use it" not in same.message
    assert "PackLoader, also measured: 510 img/s with 2 threads, no faster" in same.message


def test_storage_is_named_only_when_the_page_cache_says_so(measured: TuneResult) -> None:
    cached = _result(measured, page_cache={"before": 1.0, "after": 0.98})
    assert "storage" not in cached.message and "page cache (98% of its pages)" in cached.message
    assert "the limit is the main process" in cached.message
    cold = _result(measured, page_cache={"before": 0.0, "after": 0.2})
    assert "20% of the data's pages were in the page cache: samples wait on storage" in cold.message
    unknown = _result(measured)  # a dataset of no files: not measured, not named
    assert "storage" not in unknown.message
    busy = _result(measured, cpu=3.8)  # the loader kept the cores busy: the CPU, whatever the cache
    assert "the CPU is the limit" in busy.message and "storage" not in busy.message


def test_the_command_lines_verdict_names_flags_not_parameters(measured: TuneResult) -> None:
    """Whatever ended the search, the verdict the command prints names --budget, --max-workers and
    --step-ms, never the library's budget_s, max_workers or step_ms."""
    [tune_parser] = [p for p in subcommand_parsers(build_parser()) if p.prog.endswith(" tune")]
    for stopped in ("budget", "worker bound", "plateau", "cores", "memory", "the cap of 64 workers"):
        for given in (True, False):
            result = _result(measured, stopped=stopped, worker_limit="max_workers 4",
                             step={**measured.step, "given": given})
            text = in_flag_names(result.message, tune_parser)
            assert not re.search(r"\b(budget_s|max_workers|step_ms|batch_size)\b", text), text
            if stopped == "budget":
                assert "a larger --budget" in text
            if stopped == "worker bound":
                assert "--max-workers 4" in text and "a larger --max-workers" in text
            if not given:
                assert "give it as --step-ms" in text


def test_a_configuration_measured_twice_shows_the_rows_its_median_stands_on() -> None:
    """``format_report`` on trials set by hand: the pick's row says which rows its figure is the
    median of, and a trial with no measurement shows none, with why."""
    tuned = hand_built()
    again = dataclasses.replace(tuned.trials[1], samples_per_s=990.0, phase="confirm")
    failed = dataclasses.replace(tuned.trials[2], samples_per_s=0.0, batches=0, note="cut short by the time budget")
    tuned.trials += [again, failed]
    lines = format_report(tuned)
    rows = _rows(lines, lines.index(TABLE_HEAD) + 1)
    assert sorted(rows) == [1, 2, 3, 4, 5]
    assert rows[2][4].endswith("<- pick, median of #2, #4") and rows[3][4].endswith("<- fastest")
    assert rows[5][3] == "none" and rows[5][4].endswith("(cut short by the time budget)")
    assert "  pick (#2): num_workers=2, prefetch_factor=2, pin_memory=False [not measured (no CUDA)], " \
           "persistent_workers=True: 980 img/s, the cheapest within 4% of the fastest (#3: 1,000 img/s)" in lines
