"""benchmarks/bench_engine.py --proxy-core: the proxies on the last core, the rest elsewhere."""

from __future__ import annotations

import os

import pytest

from benchmarks import bench_engine

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's"
)


def test_the_proxies_get_the_last_core_and_the_cluster_and_consumers_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 0, 2})
    assert bench_engine._placement() == ({0, 2}, {3})
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    with pytest.raises(SystemExit, match="at least two cores"):
        bench_engine._placement()
