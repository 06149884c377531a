"""Shared by the benchmarks: where results go, result files (JSON + PNG) and a tiny bar plot.

A run writes into a folder of its own, `benchmarks/runs/<UTC time>/` unless `--out` names
another, so that no run overwrites the committed figures in `benchmarks/results/` by accident:
refreshing those is a deliberate `--out benchmarks/results`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
COMMITTED_RESULTS = HERE / "results"


def add_out_option(parser: argparse.ArgumentParser) -> None:
    """`--out DIR`: where this run's JSON and PNG files go (default: a new folder under
    benchmarks/runs/)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    parser.add_argument(
        "--out",
        type=Path,
        default=HERE / "runs" / stamp,
        help="folder for this run's JSON and PNG files (default: benchmarks/runs/<time>/; "
        "--out benchmarks/results refreshes the committed figures)",
    )


def write_results(
    out: Path,
    name: str,
    figures: dict[str, Any],
    bars: dict[str, float],
    *,
    ylabel: str,
    title: str,
) -> Path:
    path = write_json(out, name, figures)
    plot_bars(out, name, bars, ylabel=ylabel, title=title)
    return path


def write_json(out: Path, name: str, figures: dict[str, Any]) -> Path:
    """`<out>/<name>.json`: the figures, stamped with when and on what they were measured."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        **figures,
    }
    path = out / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    return path


def pyplot() -> Any:
    """matplotlib's pyplot drawing to files, or None without matplotlib (no plot is made)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_series(
    out: Path,
    name: str,
    series: dict[str, list[tuple[float, float]]],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
) -> None:
    """`<out>/<name>.png`: one line per series of (x, y) points."""
    if (plt := pyplot()) is None:
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
    fig.savefig(out / f"{name}.png", dpi=100)
    plt.close(fig)


def plot_bars(out: Path, name: str, bars: dict[str, float], *, ylabel: str, title: str) -> None:
    """`<out>/<name>.png`: one labelled bar per figure (nothing without matplotlib)."""
    if (plt := pyplot()) is None:
        return
    # Wider with more bars, and slanted labels, so that names like "watch() rp=2" stay apart.
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(bars)), 3.8))
    ax.bar(
        list(bars),
        list(bars.values()),
        color=["#4c72b0", "#dd8452", "#55a868", "#c44e52"][: len(bars)],
    )
    for i, v in enumerate(bars.values()):
        ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(bars) > 5:
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=100)
    plt.close(fig)
