"""The DataLoader settings ``packload tune --save`` writes, read back: ``DataLoader(ds, **config)``.

The file is checked field by field (one clear error naming the file), and a file measured on a
machine with other cores or another GPU is warned about.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from packload.core.cpus import usable_cores
from packload.core.errors import UsageError
from packload.diagnose.measure import machine_info

CONFIG_KEY, CONFIG_VERSION = "packload_loader_config", 1
LOADER_KEYS = ("batch_size", "num_workers", "prefetch_factor", "pin_memory", "persistent_workers")


class LoaderConfigError(UsageError):
    """A loader config file that cannot be used; the message names the file and the problem."""


def load_loader_config(path: str | os.PathLike[str], check_machine: bool = True) -> dict[str, Any]:
    """The DataLoader arguments a ``TuneResult.save`` file holds: ``DataLoader(ds, **config)``.

    Raises ``LoaderConfigError`` (a ``ValueError``) naming the file and the problem; warns when the
    file was measured on a machine with other cores or another GPU.
    """
    try:
        document = json.loads(Path(path).read_text())
    except OSError as exc:
        raise LoaderConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise LoaderConfigError(f"{path}: not a JSON file ({exc}); write one with `packload tune --save` "
                                "or TuneResult.save") from None
    if not isinstance(document, dict) or CONFIG_KEY not in document:
        raise LoaderConfigError(f"{path}: not a packload loader config (no {CONFIG_KEY!r} key); write one with "
                                "`packload tune --save` or TuneResult.save")
    if document[CONFIG_KEY] != CONFIG_VERSION:
        raise LoaderConfigError(f"{path}: loader config version {document[CONFIG_KEY]!r}; this packload reads "
                                f"version {CONFIG_VERSION}")
    loader = document.get("loader")
    if not isinstance(loader, dict):
        raise LoaderConfigError(f"{path}: 'loader' must be an object with {', '.join(LOADER_KEYS)}")
    missing, unknown = set(LOADER_KEYS) - set(loader), set(loader) - set(LOADER_KEYS)
    if missing or unknown:
        raise LoaderConfigError(f"{path}: 'loader' " + "; ".join(
            part for part in (f"lacks {', '.join(sorted(missing))}" if missing else "",
                              f"has unknown {', '.join(sorted(unknown))}" if unknown else "") if part))
    _check_loader(path, loader)
    if check_machine and isinstance(document.get("machine"), dict):
        _warn_other_machine(path, document["machine"])
    return dict(loader)


def _check_loader(path: str | os.PathLike[str], loader: dict[str, Any]) -> None:
    def is_int(value: Any, minimum: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= minimum

    problems = []
    if not is_int(loader["batch_size"], 1):
        problems.append(f"batch_size {loader['batch_size']!r} must be an integer of at least 1")
    if not is_int(loader["num_workers"], 0):
        problems.append(f"num_workers {loader['num_workers']!r} must be an integer of at least 0")
    for name in ("pin_memory", "persistent_workers"):
        if not isinstance(loader[name], bool):
            problems.append(f"{name} {loader[name]!r} must be true or false")
    prefetch, workers = loader["prefetch_factor"], loader["num_workers"]
    if is_int(workers, 0) and workers == 0 and (prefetch is not None or loader["persistent_workers"] is True):
        problems.append("with num_workers 0, prefetch_factor must be null and persistent_workers false")
    elif is_int(workers, 1) and not is_int(prefetch, 1):
        problems.append(f"prefetch_factor {prefetch!r} must be an integer of at least 1")
    if problems:
        raise LoaderConfigError(f"{path}: " + "; ".join(problems))


def _warn_other_machine(path: str | os.PathLike[str], saved: dict[str, Any]) -> None:
    here = {"usable_cores": usable_cores(), "cuda_device": machine_info()["cuda_device"]}
    differs = [f"{name} {saved.get(name)!r} there, {value!r} here" for name, value in here.items()
               if name in saved and saved.get(name) != value]
    if differs:
        warnings.warn(f"{path}: measured on another machine ({'; '.join(differs)}); run `packload tune` here "
                      "for settings that fit this one", stacklevel=3)
