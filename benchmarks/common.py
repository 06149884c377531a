"""Shared by the benchmarks: result files (JSON + PNG) and a tiny bar plot."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(name: str, figures: dict[str, Any], bars: dict[str, float], *, ylabel: str, title: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
               **figures}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    plot_bars(name, bars, ylabel=ylabel, title=title)
    return path


def plot_bars(name: str, bars: dict[str, float], *, ylabel: str, title: str) -> None:
    """`results/<name>.png`: one labelled bar per figure (nothing without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
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
