"""The proxy with its engine: what `wireproxy` runs and what tests and the demo start in-process."""

from __future__ import annotations

import trio

from buckets.engine import Engine, EngineConfig
from buckets.metrics import EngineCollector
from wireproxy.config import ProxyConfig
from wireproxy.server import ProxyServer


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
