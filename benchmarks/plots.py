"""Optional PNG charts of the results (only when matplotlib is importable)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def available() -> bool:
    """True when matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _bars(ax: Any, labels: list[str], values: list[float], errors: list[tuple[float, float]], title: str,
          unit: str) -> None:
    colours = ["tab:blue" if lab.startswith("packload") else "tab:gray" for lab in labels]
    lower = [max(0.0, v - lo) for v, (lo, _) in zip(values, errors, strict=True)]
    upper = [max(0.0, hi - v) for v, (_, hi) in zip(values, errors, strict=True)]
    y = list(range(len(labels)))
    ax.barh(y, values, xerr=[lower, upper], color=colours, capsize=2)
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(unit, fontsize=8)
    ax.tick_params(axis="x", labelsize=7)


def _collect(results: list[dict[str, Any]]) -> tuple[list[str], list[float], list[tuple[float, float]]]:
    ran = [r for r in results if r.get("stats")]
    return ([r["name"] for r in ran], [r["stats"]["median"] for r in ran],
            [(r["stats"]["min"], r["stats"]["max"]) for r in ran])


def write_charts(results: dict[str, Any], out: Path) -> list[Path]:
    """pack.png and read.png (medians with min–max whiskers) in ``out``; returns the files written.

    ``results`` is results.json's content: ``{"pack": {"data": ...}, "read": {"data": ...}, ...}``.
    """
    if not available():
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    pack = (results.get("pack") or {}).get("data")
    if pack and pack.get("datasets"):
        names = list(pack["datasets"])
        fig, axes = plt.subplots(len(names), 1, figsize=(7, 2.2 * len(names) + 0.5), squeeze=False)
        for ax, name in zip(axes[:, 0], names, strict=True):
            _bars(ax, *_collect(pack["datasets"][name]["results"]), f"pack {name}", "files/s")
        fig.tight_layout()
        path = out / "pack.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    read = (results.get("read") or {}).get("data")
    if read and read.get("datasets"):
        panels = [(name, mode, state, m[state]["results"]) for name, d in read["datasets"].items()
                  for mode, m in d["modes"].items() for state in ("warm", "cold") if state in m]
        if panels:
            cols = 2
            rows = (len(panels) + cols - 1) // cols
            fig, axes = plt.subplots(rows, cols, figsize=(12, 2.6 * rows + 0.5), squeeze=False)
            for ax, (name, mode, state, res) in zip(axes.flat, panels, strict=False):
                _bars(ax, *_collect(res), f"{name} · {mode} · {state}", "samples/s")
            for ax in list(axes.flat)[len(panels):]:
                ax.axis("off")
            fig.tight_layout()
            path = out / "read.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written
