"""One spare connection to mongos for the engine's short reads (hello, the shard list at a
stream's open), kept between them.

Every stream's open reads the shard list; on a connection of its own that read paid a TCP connect
and, with credentials, a SCRAM login (two round trips more) before its one command. The engine's
connections to mongos are all logged in as the proxy (buckets/ports.ConnectUpstream), never as a
client, so one of them may serve any open: a client's identity and privileges are checked on the
client's own connection (buckets/engine_open.py), never on this one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from buckets.ports import Connection, ConnectUpstream
from mongoformats.errors import ConnectionLost

T = TypeVar("T")


class SpareUpstream:
    """Runs reads on the engine's spare connection to mongos, or on a new one when it is in use
    (opens at once), gone, or lost."""

    def __init__(self, connect: ConnectUpstream) -> None:
        self._connect = connect
        self._idle: Connection | None = None

    async def run(self, read: Callable[[Connection], Awaitable[T]]) -> T:
        """`read` (idempotent reads only: it may run twice) on a spare connection. A spare that
        mongos closed while it was idle (a restart, a failover of the host) fails with
        ConnectionLost: `read` runs again on a new connection, whose failure is the caller's."""
        spare, self._idle = self._idle, None
        if spare is not None:
            try:
                return await self._use(spare, read)
            except ConnectionLost:
                pass  # (closed by _use)
        return await self._use(await self._connect(), read)

    async def _use(self, conn: Connection, read: Callable[[Connection], Awaitable[T]]) -> T:
        """`read` on `conn`, kept as the spare after it (closed if it failed or was cancelled: a
        reply may still be on its way, and the connection is out of step)."""
        try:
            result = await read(conn)
        except BaseException:
            await conn.aclose()
            raise
        if self._idle is None:
            self._idle = conn
        else:  # another read kept its connection first: one spare is enough
            await conn.aclose()
        return result

    async def aclose(self) -> None:
        spare, self._idle = self._idle, None
        if spare is not None:
            await spare.aclose()
