"""``packload tune PATH`` up to the search (``packload.diagnose.tune_inputs``): the user's transform
found by name, a pack or a folder opened as training reads it, broken files left out, and how the
budget, the step and the result pass between the DataLoader's search and PackLoader's. The searches
themselves are stand-ins here that record what they were given (a real search is in
``tests/diagnose/test_tune.py``); the clock is virtual."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packload import PackedImageFolder, pack
from packload.core.errors import PackFormatError, UsageError
from packload.diagnose import tune_inputs
from packload.diagnose.training_loop import DEFAULT_STEP_MS
from packload.diagnose.tune_inputs import (
    FAST_PATH_SHARE,
    load_transform,
    open_dataset,
    tune_path,
    tune_with_fast_path,
    without_broken,
)
from packload.loaders.collate import collate_uint8
from packload.loaders.folder import FolderImages
from packload.loaders.transforms import ResizeCenterCrop
from tests.image_factory import make_image_folder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Images (two classes of four) and their packs as LMDB and as shards."""
    root = tmp_path_factory.mktemp("tune_inputs")
    make_image_folder(root / "images", classes=("a", "b"), per_class=4, seed=9)
    for name in ("p.lmdb", "p.shards"):
        pack(root / "images", root / name, workers=1, progress=False)
    return root


# -- the user's transform ---------------------------------------------------------------------------
def test_a_transform_is_the_named_callable_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_transform("os.path:join") is os.path.join
    (tmp_path / "crop_for_test.py").write_text("def crop(image):\n    return image\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "crop_for_test", raising=False)
    loaded = load_transform("crop_for_test:crop")
    assert loaded is sys.modules["crop_for_test"].crop


def test_a_transform_spec_needs_both_its_parts() -> None:
    for spec in (":crop", "crop_module:", ":", "no_colon"):
        with pytest.raises(UsageError, match="give it as package.module:callable"):
            load_transform(spec)


def test_a_module_whose_own_imports_fail_is_named_with_the_reason(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "needs_missing_dep.py").write_text("import a_module_nobody_installed\ndef t(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError) as info:
        load_transform("needs_missing_dep:t")
    assert str(info.value) == ("--transform 'needs_missing_dep:t': cannot import needs_missing_dep (No module named "
                               "'a_module_nobody_installed'); run from the folder that holds it, or install it")


# -- opening the data -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["p.lmdb", "p.shards"])
def test_a_pack_opens_centre_cropped_to_the_image_size(data: Path, name: str) -> None:
    dataset = open_dataset(data / name, image_size=24)
    assert isinstance(dataset, PackedImageFolder) and len(dataset) == 8
    image, label = dataset[0]
    assert image.shape == (24, 24, 3) and image.dtype == np.uint8 and label in (0, 1)
    own = ResizeCenterCrop(12)
    assert open_dataset(data / name, image_size=24, transform=own).transform is own  # the user's, not the crop


def test_a_folder_opens_as_its_images_with_nothing_left_out(data: Path) -> None:
    dataset = open_dataset(data / "images", image_size=20)
    assert isinstance(dataset, FolderImages) and len(dataset) == 8 and dataset.broken == []
    assert dataset[3][0].shape == (20, 20, 3)


def test_a_shards_folder_without_its_manifest_is_still_taken_for_a_pack(data: Path, tmp_path: Path) -> None:
    """Shard files make it a pack (whose missing manifest is the error), not an empty image folder."""
    broken = tmp_path / "copy.shards"
    broken.mkdir()
    for f in (data / "p.shards").iterdir():
        if f.name != "manifest.json":
            (broken / f.name).write_bytes(f.read_bytes())
    with pytest.raises(PackFormatError, match="manifest.json is missing"):
        open_dataset(broken)


def test_a_folder_with_no_images_is_neither_images_nor_a_pack(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("no images here")
    with pytest.raises(UsageError) as info:
        open_dataset(tmp_path)
    assert str(info.value).startswith(f"{tmp_path}: no images found")  # one clear error, no traceback


def test_broken_files_leave_with_their_labels_and_are_listed(tmp_path: Path) -> None:
    """The kept samples and targets stay paired; the broken files are named with pack's reasons."""
    make_image_folder(tmp_path, classes=("a", "b", "c"), per_class=2, seed=1)
    (tmp_path / "a" / "z_cut.jpg").write_bytes(b"\xff\xd8\xff\xe0" + b"\0" * 40)
    (tmp_path / "b" / "a_text.png").write_bytes(b"plain text")
    folder = FolderImages(tmp_path)
    assert len(folder) == 8
    same = without_broken(folder)
    assert same is folder and len(folder) == 6
    assert folder.targets == [label for _, label in folder.samples] == [0, 0, 1, 1, 2, 2]
    assert all("z_cut" not in path and "a_text" not in path for path, _ in folder.samples)
    assert [b["path"] for b in folder.broken] == ["a/z_cut.jpg", "b/a_text.png"]
    assert all(b["reason"] for b in folder.broken)


def test_a_folder_of_broken_files_only_names_the_first(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.jpg").write_bytes(b"x")
    (tmp_path / "a" / "two.png").write_bytes(b"y")
    with pytest.raises(UsageError, match=r"every image is broken \(first: a/one.jpg: "):
        without_broken(FolderImages(tmp_path))


# -- the two searches -------------------------------------------------------------------------------
class Clock:
    """``time`` for tune_inputs: moved on by the stand-in searches only."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


class Result:
    """What the searches fill in of a ``TuneResult``, and when it was concluded."""

    def __init__(self, elapsed_s: float) -> None:
        self.tolerance, self.elapsed_s, self.budget_s = 0.07, elapsed_s, 0.0
        self.fast_path: dict[str, Any] | None = None
        self.concluded: list[Any] = []  # the fast path as it stood at each conclude()

    def conclude(self) -> None:
        self.concluded.append(self.fast_path)


class Searches:
    """Stand-ins for ``tune`` and ``tune_fast_path``: each records its arguments; the fast path takes
    ``fast_s`` of the virtual clock; ``fail`` makes the DataLoader's search raise it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fast_s: float = 2.5, fail: Exception | None = None) -> None:
        self.clock, self.fast_s, self.fail = Clock(), fast_s, fail
        self.tune_calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.fast_calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.result = Result(elapsed_s=40.0)
        monkeypatch.setattr(tune_inputs, "time", self.clock)
        monkeypatch.setattr(tune_inputs, "tune", self.tune)
        monkeypatch.setattr(tune_inputs, "tune_fast_path", self.fast)

    def tune(self, *args: Any, **kwargs: Any) -> Result:
        self.tune_calls.append((args, kwargs))
        if self.fail is not None:
            raise self.fail
        return self.result

    def fast(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.fast_calls.append((args, kwargs))
        self.clock.now += self.fast_s
        return {"pick": {"num_workers": 2}, "threads": 2}


def test_the_fast_path_gets_a_quarter_of_the_budget_and_the_same_step(data: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    searches = Searches(monkeypatch)
    dataset = open_dataset(data / "p.lmdb", image_size=32)
    result = tune_with_fast_path(dataset, 16, 32, step_ms=25.0, budget_s=80.0, max_workers=3, progress=False,
                                 device="cpu", sync=False)
    [(args, kwargs)] = searches.tune_calls
    assert args == (dataset, 16)
    assert kwargs == {"step_ms": 25.0, "model": None, "budget_s": 80.0 * (1 - FAST_PATH_SHARE), "max_workers": 3,
                      "collate_fn": collate_uint8, "progress": False, "device": "cpu", "sync": False}
    [(args, kwargs)] = searches.fast_calls
    fresh, batch, size, step, budget, tolerance = args
    assert isinstance(fresh, PackedImageFolder) and fresh is not dataset and fresh.root == dataset.root
    assert fresh.transform is None  # PackLoader crops for itself: the DataLoader's crop is not used
    assert (batch, size, budget, tolerance) == (16, 32, 80.0 * FAST_PATH_SHARE, 0.07)
    assert step.step_ms == 25.0 and step.sync is False and not step.on_gpu
    assert kwargs == {"progress": False}
    # the result: both searches' time and the whole budget, concluded once the fast path is in
    assert result is searches.result and result.budget_s == 80.0
    assert result.elapsed_s == 40.0 + 2.5
    assert result.fast_path == {"pick": {"num_workers": 2}, "threads": 2}
    assert result.concluded == [result.fast_path]


def test_without_a_step_the_fast_path_is_measured_against_the_default(data: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    searches = Searches(monkeypatch)
    tune_with_fast_path(open_dataset(data / "p.shards"), 8, 224, progress=False, device="cpu")
    step = searches.fast_calls[0][0][3]
    assert step.step_ms == DEFAULT_STEP_MS and step.sync is True
    assert searches.tune_calls[0][1]["step_ms"] is None  # tune resolves the default itself, and says so


@pytest.mark.parametrize("name", ["p.lmdb", "p.shards"])
def test_a_pack_read_through_the_built_in_crop_is_tuned_both_ways(data: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  name: str) -> None:
    searches = Searches(monkeypatch)
    result = tune_path(data / name, batch_size=4, step_ms=5, budget_s=8, progress=False, device="cpu", image_size=28)
    [(args, kwargs)] = searches.tune_calls
    assert isinstance(args[0], PackedImageFolder) and isinstance(args[0].transform, ResizeCenterCrop)
    assert args[0].transform.size == 28 and kwargs["budget_s"] == 6.0
    assert len(searches.fast_calls) == 1 and searches.fast_calls[0][0][2] == 28
    assert result.fast_path is not None and result.fast_path["threads"] == 2


def test_a_folder_is_tuned_with_the_dataloader_alone(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    searches = Searches(monkeypatch)
    result = tune_path(data / "images", batch_size=4, step_ms=5, budget_s=8, progress=False, device="cpu")
    [(args, kwargs)] = searches.tune_calls
    assert isinstance(args[0], FolderImages) and kwargs["budget_s"] == 8  # the whole budget
    assert kwargs["collate_fn"] is collate_uint8
    assert searches.fast_calls == [] and result.fast_path is None and result.concluded == []


@pytest.mark.parametrize("name", ["p.lmdb", "images"])
def test_the_users_transform_is_timed_and_packloader_is_not(data: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    (tmp_path / "user_transform.py").write_text("def t(image):\n    return image\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    searches = Searches(monkeypatch)
    result = tune_path(data / name, batch_size=4, step_ms=5, budget_s=8, progress=False, device="cpu",
                       transform="user_transform:t")
    [(args, kwargs)] = searches.tune_calls
    assert args[0].transform is sys.modules["user_transform"].t and kwargs["budget_s"] == 8
    assert searches.fast_calls == []
    note = {"pick": None, "code": None, "note": "not measured: PackLoader crops with CenterCrop, not your transform"}
    assert result.fast_path == note and result.concluded == [note]


@pytest.mark.parametrize("budget", [0, -1.0, float("nan")])
def test_a_budget_that_is_no_positive_number_is_refused_first(data: Path, monkeypatch: pytest.MonkeyPatch,
                                                             budget: float) -> None:
    searches = Searches(monkeypatch)
    with pytest.raises(UsageError, match="must be a positive number of seconds"):
        tune_path(data / "p.lmdb", step_ms=5, budget_s=budget, progress=False, transform="no_such_module:t")
    assert searches.tune_calls == []  # refused before the transform is even looked up


def test_a_value_error_from_the_search_is_a_usage_error(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Searches(monkeypatch, fail=ValueError("batch_size 0 must be at least 1"))
    with pytest.raises(UsageError) as info:
        tune_path(data / "images", batch_size=0, step_ms=5, budget_s=8, progress=False)
    assert str(info.value) == "batch_size 0 must be at least 1" and type(info.value) is UsageError
    usage = UsageError("the search's own usage error")
    Searches(monkeypatch, fail=usage)
    with pytest.raises(UsageError) as info:
        tune_path(data / "images", step_ms=5, budget_s=8, progress=False)
    assert info.value is usage  # passed on as it is
    Searches(monkeypatch, fail=RuntimeError("not a usage problem"))
    with pytest.raises(RuntimeError, match="not a usage problem"):
        tune_path(data / "images", step_ms=5, budget_s=8, progress=False)
