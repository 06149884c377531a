"""Shared by the benchmarks: result files (JSON + PNG) and a tiny bar plot."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(name: str, figures: dict[str, Any], bars: dict[str, float], *, ylabel: str, title: str) -> Path:
    path = write_json(name, figures)
    plot_bars(name, bars, ylabel=ylabel, title=title)
    return path


def write_json(name: str, figures: dict[str, Any]) -> Path:
    """`results/<name>.json`: the figures, stamped with when and on what they were measured."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
               **figures}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    return path


def _pyplot() -> Any:
    """matplotlib's pyplot drawing to files, or None without matplotlib (no plot is made)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_series(name: str, series: dict[str, list[tuple[float, float]]], *, xlabel: str, ylabel: str,
                title: str) -> None:
    """`results/<name>.png`: one line per series of (x, y) points."""
    if (plt := _pyplot()) is None:
        return
    fig, ax = plt.subplots(figsize=(7.0, 3.8))
    for label, points in series.items():
        ax.plot([x for x, _ in points], [y for _, y in points], marker=".", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=100)
    plt.close(fig)


def plot_bars(name: str, bars: dict[str, float], *, ylabel: str, title: str) -> None:
    """`results/<name>.png`: one labelled bar per figure (nothing without matplotlib)."""
    if (plt := _pyplot()) is None:
        return
    # Wider with more bars, and slanted labels, so that names like "watch() rp=2" stay apart.
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(bars)), 3.8))
    ax.bar(list(bars), list(bars.values()), color=["#4c72b0", "#dd8452", "#55a868", "#c44e52"][: len(bars)])
    for i, v in enumerate(bars.values()):
        ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(bars) > 5:
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=100)
    plt.close(fig)
