"""The demo's workload, without a cluster: the operations `run_workload` issues, in order, recorded
by a stand-in client, are the same for a given seed (so the demo replicates the same history)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

pytest.importorskip("rich")

from demo.demo import run_workload  # noqa: E402


class _Recorder:
    """Any attribute, item or call of a pymongo client: each call is logged with its arguments."""

    def __init__(self, log: list[Any], path: str = "client") -> None:
        self._log, self._path = log, path

    def __getattr__(self, name: str) -> Any:
        if name == "with_transaction":
            return lambda run: run(self)
        return _Recorder(self._log, f"{self._path}.{name}")

    def __getitem__(self, name: str) -> _Recorder:
        return _Recorder(self._log, f"{self._path}[{name!r}]")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._log.append([self._path, args, kwargs])
        if args == ("listShards",):
            return {"shards": [{"_id": "shard-b"}, {"_id": "shard-a"}]}
        return _Recorder(self._log, f"{self._path}()")

    def __enter__(self) -> _Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __str__(self) -> str:
        return self._path


def _trace(ops: int, seed: int) -> tuple[int, int, str]:
    log: list[Any] = []
    issued = run_workload(_Recorder(log), ops, seed)  # type: ignore[arg-type]
    text = json.dumps(log, default=str, sort_keys=True)
    return issued, len(log), hashlib.sha256(text.encode()).hexdigest()[:16]


def test_the_workload_issues_the_same_operations_for_a_seed():
    """Digests of the operation logs for two seeds, recorded once; inserts, the four update
    kinds, deletes, transactions, new items, and the closing DDL and chunk move all count."""
    assert _trace(3000, 7) == (3070, 469, "64a70129d83e54e8")
    assert _trace(1500, 11) == (1570, 139, "7c13958407bc2463")


def test_the_report_writes_the_figures_per_bucket(tmp_path):
    from demo.demo import _report

    rows = [("shop.orders", ((3, "ab12"), ["_id_"]), ((3, "ab12"), ["_id_"]), True)]
    per_batch = [
        {"t": 10.0, "epoch": 0, "counts": {0: 2, 1: 1}},
        {"t": 12.0, "epoch": 1, "counts": {1: 4}},
    ]
    _report(rows, per_batch, 3, 1.5, True, tmp_path)
    figures = json.loads((tmp_path / "demo.json").read_text())
    assert figures["buckets"] == {"0": 2, "1": 5, "2": 0}
    assert (figures["lag_s"], figures["ok"], len(figures["batches"])) == (1.5, True, 2)
