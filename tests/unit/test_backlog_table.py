"""benchmarks/backlog_table.py: the README's backlog table is made from bench_engine's JSON."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.backlog_table import table


def _figures(workload: str, **extra: object) -> dict[str, object]:
    mode = {"events_per_s": 50_000.0, "proxy_cpu_us_per_event": 12.5}
    return {
        "when": "2026-11-27T05:00:00Z",
        "events": 250_000,
        "workload": workload,
        "updates": 0.0,
        "bucket_by": "namespace",
        "repeat": 3,
        "best_proxy_mode": "proxy rp=2",
        "raw_mode": "raw",
        "proxy_over_raw": 0.1,
        "proxy_over_native": 5.0,
        "modes": {
            "raw": {"events_per_s": 500_000.0},
            "proxy rp=0": mode,
            "proxy rp=2": mode,
            "watch() rp=0": {"events_per_s": 1.0},
            "native": {"events_per_s": 10_000.0},
        },
        **extra,
    }


def test_each_backlog_is_one_row_with_the_command_that_reproduces_it(tmp_path: Path) -> None:
    (tmp_path / "engine_catchup_app.json").write_text(json.dumps(_figures("app")))
    ycsb_figures = _figures(
        "ycsb", bucket_by="documentKey", pymongo_consumer_cpu_us_per_event=1, relay_over_raw=0.85
    )
    ycsb_figures["modes"]["relay"] = {"events_per_s": 450_000.0}  # type: ignore[index]
    (tmp_path / "engine_catchup_ycsb_by_documentKey.json").write_text(json.dumps(ycsb_figures))
    rows = table(tmp_path).splitlines()[2:]
    assert len(rows) == 2
    app, ycsb = rows
    assert "250,000 application-like writes (2026-11-27)" in app
    assert "| 50k/s (proxy rp=2) | 500k/s | 10.0k/s | 0.10 | - | 5.0x | 12.5 us |" in app
    assert (
        "`python -m benchmarks.bench_engine --events 250000 --workload app --reader-processes 0 2"
        " --watch-reader-processes 0 --no-pymongo-consumers --no-relay --repeat 3`" in app
    )
    assert "YCSB A updates, by documentKey" in ycsb
    assert "--bucket-by documentKey" in ycsb and "--no-pymongo-consumers" not in ycsb
    assert "| 0.10 | 0.85 | 5.0x |" in ycsb and "--no-relay" not in ycsb


def test_a_backlog_measured_with_the_proxy_on_its_own_core_is_a_row_of_its_own(
    tmp_path: Path,
) -> None:
    (tmp_path / "engine_catchup_app.json").write_text(json.dumps(_figures("app")))
    (tmp_path / "engine_catchup_app_proxy_core.json").write_text(
        json.dumps(_figures("app", proxy_core=True))
    )
    shared, own = table(tmp_path).splitlines()[2:]
    assert "core of its own" not in shared and "--proxy-core" not in shared
    assert "250,000 application-like writes, the proxy on a core of its own (2026-11-27)" in own
    assert " --watch-reader-processes 0 --proxy-core --no-pymongo-consumers" in own
