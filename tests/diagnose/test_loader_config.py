"""The DataLoader settings ``packload tune --save`` writes, read back (``packload.diagnose.loader_config``):
what a valid file gives (arguments a DataLoader takes as they are), each field's check, and the warning
for a file measured on another machine. The errors ``tests/diagnose/test_tune.py`` checks on a saved
result are not repeated here."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from packload import PackedImageFolder, pack
from packload.core.cpus import usable_cores
from packload.core.errors import UsageError
from packload.diagnose.loader_config import (
    CONFIG_KEY,
    CONFIG_VERSION,
    LOADER_KEYS,
    LoaderConfigError,
    load_loader_config,
)
from packload.diagnose.measure import machine_info
from packload.loaders.collate import collate_uint8
from packload.loaders.transforms import ResizeCenterCrop
from tests.image_factory import make_image_folder

IN_PROCESS = {"batch_size": 4, "num_workers": 0, "prefetch_factor": None, "pin_memory": False,
              "persistent_workers": False}
WITH_WORKERS = {"batch_size": 8, "num_workers": 2, "prefetch_factor": 4, "pin_memory": True,
                "persistent_workers": True}


def write(tmp_path: Path, loader: Any, machine: Any = None, name: str = "loader.json") -> Path:
    """A config file as ``TuneResult.save`` writes one, with ``loader`` (and ``machine``) given."""
    document: dict[str, Any] = {CONFIG_KEY: CONFIG_VERSION, "loader": loader}
    if machine is not None:
        document["machine"] = machine
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


def here() -> dict[str, Any]:
    return {"usable_cores": usable_cores(), "cuda_device": machine_info()["cuda_device"]}


def error_of(path: Path) -> str:
    with pytest.raises(LoaderConfigError) as info:
        load_loader_config(path)
    return str(info.value)


@pytest.mark.parametrize("loader", [IN_PROCESS, WITH_WORKERS])
def test_a_valid_file_gives_its_loader_arguments_and_nothing_else(tmp_path: Path, loader: dict[str, Any]) -> None:
    path = write(tmp_path, loader, machine=here())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # measured here: no warning
        config = load_loader_config(path)
    assert config == loader and list(config) == list(loader)
    assert set(config) == set(LOADER_KEYS)
    config["batch_size"] = 99  # a copy: the next read is the file's again
    assert load_loader_config(path)["batch_size"] == loader["batch_size"]


def test_the_arguments_build_a_dataloader_over_a_real_pack(tmp_path: Path) -> None:
    """``DataLoader(ds, **config)``, as the module promises: the settings are DataLoader's own names."""
    make_image_folder(tmp_path / "images", classes=("a", "b"), per_class=4, seed=2)
    pack(tmp_path / "images", tmp_path / "p.lmdb", workers=1, progress=False)
    dataset = PackedImageFolder(tmp_path / "p.lmdb", transform=ResizeCenterCrop(16))
    config = load_loader_config(write(tmp_path, IN_PROCESS))
    batches = list(DataLoader(dataset, collate_fn=collate_uint8, **config))
    assert [len(labels) for _, labels in batches] == [4, 4]
    assert batches[0][0].shape == (4, 3, 16, 16) and batches[0][0].dtype == torch.uint8
    assert sorted(torch.cat([labels for _, labels in batches]).tolist()) == [0] * 4 + [1] * 4


def test_the_error_is_a_usage_error_and_a_value_error(tmp_path: Path) -> None:
    path = write(tmp_path, {**IN_PROCESS, "batch_size": 0})
    with pytest.raises(UsageError) as info:
        load_loader_config(path)
    assert isinstance(info.value, ValueError) and isinstance(info.value, LoaderConfigError)


def test_files_that_are_no_config_at_all(tmp_path: Path) -> None:
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert error_of(binary).startswith(f"{binary}: not a JSON file")
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    assert f"{listing}: not a packload loader config (no '{CONFIG_KEY}' key)" in error_of(listing)
    assert error_of(tmp_path).startswith(f"{tmp_path}: cannot read it")  # a folder, not a file


def test_a_loader_that_lacks_fields_and_has_others_names_both(tmp_path: Path) -> None:
    loader = {"batch_size": 8, "num_workers": 0, "shuffle": True, "drop_last": True}
    path = write(tmp_path, loader)
    assert error_of(path) == (f"{path}: 'loader' lacks persistent_workers, pin_memory, prefetch_factor; "
                              "has unknown drop_last, shuffle")


@pytest.mark.parametrize("changes, problems", [
    ({"batch_size": 2.0}, ["batch_size 2.0 must be an integer of at least 1"]),
    ({"batch_size": "8"}, ["batch_size '8' must be an integer of at least 1"]),
    ({"num_workers": "2"}, ["num_workers '2' must be an integer of at least 0"]),
    ({"num_workers": False}, ["num_workers False must be an integer of at least 0"]),  # not taken for 0
    ({"pin_memory": 1}, ["pin_memory 1 must be true or false"]),
    ({"persistent_workers": None}, ["persistent_workers None must be true or false"]),
    ({"prefetch_factor": None}, ["prefetch_factor None must be an integer of at least 1"]),
    ({"prefetch_factor": True}, ["prefetch_factor True must be an integer of at least 1"]),
    ({"batch_size": -1, "pin_memory": "yes", "prefetch_factor": 0},  # every problem, in one message
     ["batch_size -1 must be an integer of at least 1", "pin_memory 'yes' must be true or false",
      "prefetch_factor 0 must be an integer of at least 1"]),
])
def test_each_field_is_checked_and_every_problem_named(tmp_path: Path, changes: dict[str, Any],
                                                       problems: list[str]) -> None:
    path = write(tmp_path, {**WITH_WORKERS, **changes})
    assert error_of(path) == f"{path}: " + "; ".join(problems)


def test_no_workers_means_no_prefetch_and_no_persistent_workers(tmp_path: Path) -> None:
    """DataLoader refuses both without workers: the file is refused on reading, not at DataLoader."""
    for changes in ({"persistent_workers": True}, {"prefetch_factor": 2}):
        path = write(tmp_path, {**IN_PROCESS, **changes})
        assert error_of(path) == f"{path}: with num_workers 0, prefetch_factor must be null and persistent_workers false"


def test_a_file_from_another_machine_warns_naming_what_differs(tmp_path: Path) -> None:
    other = {**here(), "usable_cores": usable_cores() + 7, "cuda_device": "Imaginary GPU 9000"}
    path = write(tmp_path, WITH_WORKERS, machine={**other, "cpu": "some CPU", "date": "2020-01-01"})
    with pytest.warns(UserWarning) as record:
        assert load_loader_config(path) == WITH_WORKERS  # still read: the warning only advises
    [warning] = record
    message = str(warning.message)
    assert message.startswith(f"{path}: measured on another machine (")
    assert f"usable_cores {usable_cores() + 7} there, {usable_cores()} here" in message
    assert f"cuda_device 'Imaginary GPU 9000' there, {here()['cuda_device']!r} here" in message
    assert "run `packload tune` here" in message
    assert warning.filename == __file__, "the warning points at the caller's line, not the library's"


def test_only_what_the_file_says_of_its_machine_is_compared(tmp_path: Path) -> None:
    """No machine, a machine that is not an object, one that names neither field, one that names
    the same cores and GPU, or ``check_machine=False``: no warning."""
    cases = [write(tmp_path, WITH_WORKERS, name="none.json"),
             write(tmp_path, WITH_WORKERS, machine="elsewhere", name="text.json"),
             write(tmp_path, WITH_WORKERS, machine={"cpu": "another CPU", "torch": "0.1"}, name="other.json"),
             write(tmp_path, WITH_WORKERS, machine=here(), name="same.json")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for path in cases:
            assert load_loader_config(path) == WITH_WORKERS
        far = write(tmp_path, WITH_WORKERS, machine={"usable_cores": usable_cores() + 1}, name="far.json")
        assert load_loader_config(far, check_machine=False) == WITH_WORKERS
    with pytest.warns(UserWarning, match="usable_cores"):
        load_loader_config(far)
