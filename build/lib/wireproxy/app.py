"""The proxy with its engine: what `wireproxy` runs and what tests and the demo start in-process."""

from __future__ import annotations

import trio

from buckets.engine import Engine, EngineConfig
from buckets.metrics import EngineCollector
from wireproxy.config import ProxyConfig
from wireproxy.server import ProxyServer


def tune_gc_for_throughput() -> None:
    """Process-wide garbage-collector settings for a proxy process (called by the entry point).

    The engine holds up to its buffer budgets in small, acyclic event objects; with the default
    thresholds the cyclic collector keeps rescanning them. Freezing what exists at start-up and
    collecting young objects less often measured +55% throughput on a 300k-event catch-up
    (benchmarks/bench_engine.py). Memory stays bounded by the byte budgets either way.

    Full collections still come, after ten of the older-generation ones (about 50M allocations,
    some minutes of full-speed reading): closed streams and connections leave small reference
    cycles (tasks, cancel scopes) that only a full collection frees. Buffered events cost them
    little: the engine keeps them as plain tuples, which the collector stops tracking (as
    ChangeEvents, a tuple subclass, a full collection took 0.17 s per million buffered events).
    With a third threshold of 1000 they never came, and before streams dropped their events on
    close (ParallelStream._release) every closed stream's retention stayed.
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 10)


async def serve_proxy(config: ProxyConfig, *, engine_config: EngineConfig | None = None,
                      task_status: trio.TaskStatus[ProxyServer] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the proxy and its engine until cancelled; `task_status.started(server)` once listening."""
    server = ProxyServer(config)
    engine = Engine(server.connect_engine_upstream,
                    engine_config or EngineConfig(reader_processes=config.reader_processes,
                                                  idle_teardown_s=config.stream_idle_teardown_s,
                                                  reader_idle_s=config.reader_idle_s,
                                                  cursor_timeout_s=config.cursor_timeout_s,
                                                  memory_limit_bytes=config.memory_limit_bytes,
                                                  hang_timeout_s=config.upstream_timeout_s or None),
                    connect_member=server.connect_member, requires_auth=server.credentials is not None)
    engine.register(server.table)
    server.metrics.registry.register(EngineCollector(engine))
    server.engine = engine  # type: ignore[attr-defined]
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        await nursery.start(server.serve)
        task_status.started(server)
