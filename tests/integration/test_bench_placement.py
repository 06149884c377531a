"""benchmarks/bench_engine.py --proxy-core: a proxy process started on the cores it is given."""

from __future__ import annotations

import os

import pytest

from benchmarks.bench_engine import ProxyProcess

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux's CPU affinity and two cores",
)


def test_a_proxy_process_runs_on_the_cores_it_is_given() -> None:
    core = max(os.sched_getaffinity(0))
    # The relay: a server with the proxy's options that reaches its upstream only when asked.
    relay = ProxyProcess("mongodb://127.0.0.1:9/", module="benchmarks.relay", cores={core})
    try:
        assert os.sched_getaffinity(relay.process.pid) == {core}
        assert os.sched_getaffinity(0) != {core}  # the test's own process is left as it was
    finally:
        relay.close()
