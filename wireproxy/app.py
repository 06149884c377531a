"""The proxy with its engine: what `wireproxy` runs and what tests and the demo start in-process."""

from __future__ import annotations

import trio

from buckets.engine import Engine, EngineConfig
from wireproxy.config import ProxyConfig
from wireproxy.server import ProxyServer


async def serve_proxy(config: ProxyConfig, *, engine_config: EngineConfig | None = None,
                      task_status: trio.TaskStatus[ProxyServer] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the proxy and its engine until cancelled; `task_status.started(server)` once listening."""
    server = ProxyServer(config)
    engine = Engine(server.connect_upstream, engine_config)
    engine.register(server.table)
    server.engine = engine  # type: ignore[attr-defined]
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        await nursery.start(server.serve)
        task_status.started(server)
