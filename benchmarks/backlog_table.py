"""The catch-up backlogs side by side: one Markdown table from bench_engine's JSON files.

    .venv/bin/python -m benchmarks.backlog_table [benchmarks/results]

Reads each backlog's `engine_catchup*.json` in the folder (the insert, update, application-like
and YCSB backlogs, by namespace and by documentKey, and the update and application-like ones
with the proxy on a core of its own) and prints one row each: the proxy's rate,
the raw oplog read's, the native stream's, the proxy's ratios to both, the relay's to the raw
read (benchmarks.relay: the replies forwarded unchanged, a second hop's floor), the proxy's CPU
per event and the command that reproduces the row. benchmarks/README.md's table is this
script's output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.common import COMMITTED_RESULTS

# The files in the order the table lists them.
BACKLOGS = (
    "engine_catchup",
    "engine_catchup_updates",
    "engine_catchup_app",
    "engine_catchup_app_by_documentKey",
    "engine_catchup_ycsb",
    "engine_catchup_ycsb_by_documentKey",
    # The same backlogs with the proxy on a core of its own (bench_engine --proxy-core).
    "engine_catchup_updates_proxy_core",
    "engine_catchup_app_proxy_core",
)
HEADER = (
    "| backlog | proxy | raw oplog read | native stream | proxy / raw | relay / raw "
    "| proxy / native | proxy CPU per event | command |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def describe(figures: dict[str, Any]) -> str:
    """The backlog in words: its size, workload and bucketing."""
    workload = figures.get("workload", "inserts")
    if workload == "inserts":
        share = figures.get("updates") or 0
        kind = f"{share:.0%} `$set`+`$inc` updates" if share else "small inserts"
    else:
        kind = {"app": "application-like writes", "ycsb": "YCSB A updates"}.get(workload, workload)
    by = (
        f", by {figures['bucket_by']}"
        if figures.get("bucket_by", "namespace") != "namespace"
        else ""
    )
    own = ", the proxy on a core of its own" if figures.get("proxy_core") else ""
    return f"{figures['events']:,} {kind}{by}{own} ({figures['when'][:10]})"


def command(figures: dict[str, Any]) -> str:
    """The bench_engine options that reproduce the backlog's figures."""
    parts = ["python -m benchmarks.bench_engine", f"--events {figures['events']}"]
    if figures.get("workload", "inserts") != "inserts":
        parts.append(f"--workload {figures['workload']}")
    if figures.get("updates"):
        parts.append(f"--updates {figures['updates']}")
    if figures.get("bucket_by", "namespace") != "namespace":
        parts.append(f"--bucket-by {figures['bucket_by']}")
    modes = figures["modes"]
    parts.append("--reader-processes " + " ".join(_processes(modes, "proxy rp=")))
    parts.append(" ".join(("--watch-reader-processes", *_processes(modes, "watch() rp="))))
    if figures.get("proxy_core"):
        parts.append("--proxy-core")
    if "pymongo_consumer_cpu_us_per_event" not in figures:
        parts.append("--no-pymongo-consumers")
    if "relay" not in modes:
        parts.append("--no-relay")
    parts.append(f"--repeat {figures.get('repeat', 1)}")
    return "`" + " ".join(parts) + "`"


def _processes(modes: dict[str, Any], prefix: str) -> list[str]:
    """The reader-process counts of the modes named `prefix` + a count."""
    return [name[len(prefix) :] for name in modes if name.startswith(prefix)]


def row(figures: dict[str, Any]) -> str:
    """One backlog's row of the table."""
    modes = figures["modes"]
    proxy, raw = modes[figures["best_proxy_mode"]], modes[figures["raw_mode"]]
    native = modes.get("native", {}).get("events_per_s")
    cells = (
        describe(figures),
        f"{proxy['events_per_s'] / 1000:,.0f}k/s ({figures['best_proxy_mode']})",
        f"{raw['events_per_s'] / 1000:,.0f}k/s",
        f"{native / 1000:,.1f}k/s" if native else "-",
        f"{figures['proxy_over_raw']:.2f}",
        f"{figures['relay_over_raw']:.2f}" if "relay_over_raw" in figures else "-",
        f"{figures['proxy_over_native']:.1f}x" if native else "-",
        f"{proxy['proxy_cpu_us_per_event']:.1f} us",
        command(figures),
    )
    return "| " + " | ".join(cells) + " |"


def table(folder: Path) -> str:
    """The table of every backlog whose JSON file is in `folder`."""
    rows = [
        row(json.loads((folder / f"{name}.json").read_text()))
        for name in BACKLOGS
        if (folder / f"{name}.json").exists()
    ]
    return "\n".join((HEADER, *rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=COMMITTED_RESULTS)
    print(table(parser.parse_args().folder))


if __name__ == "__main__":
    main()
