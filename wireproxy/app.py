"""The proxy with its engine: what `wireproxy` runs and what tests and the demo start in-process.

The one place (with the entry point, __main__) where the proxy meets the engine: the engine
states what it needs from the proxy (buckets.ports) and what it serves (Engine.commands), and
this module connects the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio

from buckets.engine import Engine, EngineCommands, EngineConfig
from buckets.metrics import EngineCollector
from buckets.ports import Decline, Handler
from wireproxy.config import ProxyConfig
from wireproxy.router import CommandTable, LocalHandler, PassThrough
from wireproxy.server import ProxyServer
from wireproxy.session import ClientSession


@dataclass(frozen=True)
class RunningProxy:
    """A proxy serve_proxy started: its server and its engine (for the entry point and tests)."""

    server: ProxyServer
    engine: Engine

    @property
    def port(self) -> int:
        """The port the proxy listens on."""
        return self.server.port


def _engine_config(config: ProxyConfig) -> EngineConfig:
    """The engine's settings that the proxy's configuration holds."""
    return EngineConfig(
        reader_processes=config.reader_processes,
        splice_threads=config.splice_threads,
        idle_teardown_s=config.stream_idle_teardown_s,
        reader_idle_s=config.reader_idle_s,
        cursor_timeout_s=config.cursor_timeout_s,
        memory_limit_bytes=config.memory_limit_bytes,
        hang_timeout_s=config.upstream_timeout_s or None,
    )


def _passing_through(handler: Handler) -> LocalHandler:
    """`handler` as the router calls it: the engine's Decline (the request is left to mongos)
    becomes the router's PassThrough."""

    # Typed ClientSession, so that mypy checks the session is the engine's ClientContext.
    async def run(session: ClientSession, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        try:
            return await handler(session, db, cmd)
        except Decline:
            raise PassThrough() from None

    return run


def route_to(table: CommandTable, commands: EngineCommands) -> None:
    """Route the engine's commands, and getMore / killCursors on its cursors, to it."""
    for name, handler in commands.named.items():
        table.register(name, _passing_through(handler))
    table.change_stream_handler = _passing_through(commands.change_stream)
    table.get_more = _passing_through(commands.get_more)
    table.kill_cursors = _passing_through(commands.kill_cursors)
    table.owned_cursors = commands.cursors


async def serve_proxy(
    config: ProxyConfig,
    *,
    engine_config: EngineConfig | None = None,
    task_status: trio.TaskStatus[RunningProxy] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the proxy and its engine until cancelled; `task_status.started(RunningProxy)` once
    listening."""
    server = ProxyServer(config)
    engine = Engine(
        server.connect_engine_upstream,
        engine_config or _engine_config(config),
        connect_member=server.connect_member,
        requires_auth=server.credentials is not None,
    )
    route_to(server.table, engine.commands())
    server.metrics.registry.register(EngineCollector(engine))
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        await nursery.start(server.serve)
        task_status.started(RunningProxy(server, engine))
