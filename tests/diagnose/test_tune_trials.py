"""A tuner's trial and how trials are compared (``packload.diagnose.tune_trials``): what a trial is
keyed and judged by, the settings it hands a DataLoader, and which trial stands for a configuration
and wins."""

from __future__ import annotations

from typing import Any

from packload.diagnose.tune_trials import FAST_PATH, Trial, aggregate, median_trial, select, trial_label


def measured(workers: int, prefetch: int | None, rate: float, batches: int = 40, **fields: Any) -> Trial:
    values: dict[str, Any] = {"pin_memory": False, "batches_per_s": rate / 8, "gpu_wait": 0.5, "startup_s": 0.5,
                              "worker_rss_mb": 80.0, "worker_pss_mb": 20.0, "noise": 0.01, "cpu_cores": 0.5,
                              "seconds": 1.0, "phase": "coarse"}
    values.update(fields)
    return Trial(workers, prefetch, samples_per_s=rate, batches=batches, **values)


def test_a_trial_is_keyed_by_its_settings_and_gives_them_to_a_dataloader() -> None:
    trial = measured(3, 4, 600.0, pin_memory=True)
    assert trial.key == (3, 4, True)
    assert trial.settings() == {"num_workers": 3, "prefetch_factor": 4, "pin_memory": True}
    assert Trial(**trial.as_dict()) == trial, "its dict holds every field, for --json and back"


def test_only_a_trial_with_batches_and_a_rate_counts() -> None:
    assert measured(1, 2, 100.0).valid
    assert not measured(1, 2, 100.0, batches=0).valid  # cut short before its first window
    assert not measured(1, 2, 0.0).valid
    assert aggregate([measured(1, 2, 0.0), measured(2, 2, 0.0, batches=0)]) == {}


def test_the_median_of_an_even_group_is_its_lower_middle_trial() -> None:
    group = [measured(2, 2, rate) for rate in (400.0, 100.0, 300.0, 200.0)]
    assert median_trial(group) is group[3]  # 100, 200, 300, 400: the lower middle, 200
    assert aggregate(group)[(2, 2, False)] is group[3]


def test_a_failed_trial_is_never_the_fastest_nor_the_pick() -> None:
    lucky = measured(8, 2, 5000.0, batches=0)  # a rate from no whole window: not a measurement
    steady = [measured(2, 2, 900.0), measured(4, 2, 1000.0)]
    pick, fastest = select([lucky, *steady], tolerance=0.04)
    assert fastest is steady[1] and pick is steady[1]


def test_the_progress_lines_name_packloaders_threads_as_threads() -> None:
    assert trial_label((2, None, False), fast_path=True) == "PackLoader threads=2"
    assert trial_label(measured(2, None, 10.0, phase=FAST_PATH)) == "PackLoader threads=2"
    assert trial_label(measured(2, None, 10.0)) == "workers=2 prefetch=- pin=no"
