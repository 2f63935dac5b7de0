"""Formatting shared by the benchmark tables: numbers, ratios, spreads and Markdown tables."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def num(value: float | int | None, digits: int = 0) -> str:
    """A number with thousands separators, or an em dash when missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if digits == 0 and abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:,.{digits}f}"
    if abs(value) >= 10:
        return f"{value:.{max(digits, 1)}f}"
    return f"{value:.{max(digits, 2)}f}"


def times(value: float | None) -> str:
    """A ratio as ``1.23×``, bold when the contender wins (> 1.05) and marked when it loses (< 0.95)."""
    if value is None:
        return "—"
    text = f"{value:.2f}×"
    if value >= 1.05:
        return f"**{text}**"
    if value <= 0.95:
        return f"{text} ▼"
    return text


def spread(stats: dict[str, Any] | None) -> str:
    """``median [min–max]`` of a summarize() dict."""
    if not stats:
        return "—"
    if stats["n"] == 1:
        return num(stats["median"])
    return f"{num(stats['median'])} [{num(stats['min'])}–{num(stats['max'])}]"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    """A Markdown table (cells converted with str; '|' escaped); the first ``left`` columns aligned
    left, the others right."""
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, headers)) + " |",
             "|" + "|".join("---" if i < left else "--:" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def status(result: dict[str, Any]) -> str:
    """Why a case has no figures: skipped (unavailable) or failed, shortened for a table cell."""
    if result.get("skipped"):
        return f"not run: {short(result['skipped'])}"
    if result.get("error"):
        return f"FAILED: {short(result['error'])}"
    return ""


def short(text: str, limit: int = 90) -> str:
    """The first line of ``text``, cut to ``limit`` characters."""
    first = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


def dir_bytes(path: Path, exclude: Sequence[str] = ()) -> int:
    """Apparent size of a file, or of every file under a folder (skipping parts named in ``exclude``)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if d not in exclude]
        total += sum((Path(root) / n).stat().st_size for n in names if not (Path(root) / n).is_symlink())
    return total


def write_json(data: Any, path: Path) -> None:
    """Write ``data`` as indented JSON (non-JSON values via str)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


def load_range(results: Sequence[dict[str, Any]]) -> str:
    """``min–max`` of the 1-minute load average at the start of every run (other work on the machine)."""
    loads = [run["loadavg_1m"] for r in results for run in r.get("runs", []) if "loadavg_1m" in run]
    return f"{min(loads):.1f}–{max(loads):.1f}" if loads else "?"
