"""The proxy's watch over the mongoses of its upstream URI, as a driver's server monitor.

Drivers see only the proxy, whose hello the proxy answers itself, so their own monitors cannot
notice a mongos behind it that hangs. The proxy checks each mongos instead: every `heartbeat_s`
(the URI's heartbeatFrequencyMS, 10 s by default) it sends hello on a connection of its own.

- Answered: the mongos is up; the proxy's hello reports its wire versions.
- Not answered, or no connection accepted, within the connect timeout (a hung process, a
  partition that drops packets): new client connections go to another mongos first, and the
  client connections pinned to it are cut, as a driver interrupts its in-use connections when its
  monitor times out. Their drivers see a network error and retry on a new connection, which goes
  to a mongos that answers. Left alone, they would wait on TCP for hours.
- Refused or closed: new connections go elsewhere first, but the pinned ones are left alone: a
  refused connection may only be mongos's connection limit, and a dead process resets its sockets.

Behind a replica set upstream (no mongos) the hosts are its members: new connections go to the
one whose last hello said it is the writable primary, and when the primary steps down its pinned
clients are cut too. A driver connected to the set itself would follow the new primary; these
would otherwise write to a secondary, refused (NotWritablePrimary) until they reconnect.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio
from prometheus_client import Gauge

from mongoformats.errors import MongoError
from wireproxy.cluster_time import ClusterTimeGossip
from wireproxy.host_health import HostHealth, host_address
from wireproxy.upstream import UpstreamClosed, UpstreamConnection, UpstreamTimeout, open_upstream

log = logging.getLogger("wireproxy")

__all__ = ["UpstreamMonitor"]

# How often the proxy says, while it starts, that no mongos has answered yet.
WAITING_LOG_S = 10.0


class UpstreamMonitor:
    def __init__(
        self,
        hosts: list[tuple[str, int]],
        *,
        health: HostHealth,
        heartbeat_s: float,
        connect_timeout_s: float,
        ssl_context: ssl.SSLContext | None,
        cut_clients: Callable[[str], Awaitable[None]],
        up_gauge: Gauge,
        gossip: ClusterTimeGossip | None = None,
    ) -> None:
        self.hosts = hosts
        self.gossip = gossip  # told the cluster time of each hello (the proxy's replies carry it)
        self.health = health
        self.heartbeat_s = heartbeat_s
        self.connect_timeout_s = connect_timeout_s
        self._ssl = ssl_context
        self._cut_clients = cut_clients
        self._up = up_gauge
        self.wire_versions: tuple[int, int] | None = None  # from the latest hello answered
        self.writable: dict[str, bool] = {}  # by address: its last hello said it takes writes
        self._checked: set[str] = set()  # the hosts checked at least once
        self._ready = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check every host until cancelled; started once each has been checked and one has
        answered (the proxy cannot tell its clients what it speaks before, nor which host takes
        writes), saying every WAITING_LOG_S why not yet."""
        async with trio.open_nursery() as nursery:
            for host, port in self.hosts:
                nursery.start_soon(self._watch, host, port)
            while not self._ready.is_set():
                with trio.move_on_after(WAITING_LOG_S):
                    await self._ready.wait()
                if not self._ready.is_set():
                    log.warning("waiting for the upstream to answer (%s)", self._why_waiting())
            task_status.started()

    def _why_waiting(self) -> str:
        """The hosts' last errors, or that they are still being connected to."""
        errors = [
            f"{a}: {f.error}"
            for h in self.hosts
            if (f := self.health.failure(a := host_address(*h))) is not None
        ]
        return "; ".join(errors) or "connecting"

    async def _watch(self, host: str, port: int) -> None:
        address = host_address(host, port)
        conn: UpstreamConnection | None = None
        was_up: bool | None = None
        try:
            while True:
                try:
                    if conn is None:
                        conn = await self._connect(host, port)
                    hello = await conn.command(
                        "admin", {"hello": 1}, timeout_s=self.connect_timeout_s
                    )
                except (UpstreamClosed, MongoError) as exc:
                    await _close(conn)
                    conn = None
                    await self._went_down(address, exc, was_up)
                    was_up = False
                else:
                    await self._answered(address, hello, was_up)
                    was_up = True
                self._note_checked(address)
                await trio.sleep(self.heartbeat_s)
        finally:
            await _close(conn)

    def _note_checked(self, address: str) -> None:
        """`address` has been checked: once every host has been, and one answered, the monitor
        is ready."""
        self._checked.add(address)
        if self.wire_versions is not None and len(self._checked) == len(self.hosts):
            self._ready.set()

    async def _connect(self, host: str, port: int) -> UpstreamConnection:
        conn = await open_upstream(
            host,
            port,
            ssl_context=self._ssl,
            health=self.health,
            connect_timeout_s=self.connect_timeout_s,
        )
        conn.gossip = self.gossip
        return conn

    async def _went_down(
        self, address: str, exc: UpstreamClosed | MongoError, was_up: bool | None
    ) -> None:
        """A check of `address` failed: record and say it, and cut its clients if it hangs."""
        if isinstance(exc, MongoError):  # a lost connection has told the record already
            self.health.failed(address, str(exc))
        if was_up is not False:
            log.warning("upstream %s is down: %s", address, str(exc))
        self.writable[address] = False  # a primary that is down takes no writes either
        self._up.labels(address).set(0)
        if isinstance(exc, UpstreamTimeout):
            await self._cut_clients(address)

    async def _answered(self, address: str, hello: Mapping[str, Any], was_up: bool | None) -> None:
        """A check of `address` answered: note what it speaks and whether it takes writes, and
        cut its clients if it stepped down."""
        self.wire_versions = (
            int(hello.get("minWireVersion", 0)),
            int(hello.get("maxWireVersion", 0)),
        )
        writable = bool(hello.get("isWritablePrimary"))  # a mongos's is always true
        if self.writable.get(address) and not writable:
            log.warning("upstream %s no longer takes writes (stepped down)", address)
            await self._cut_clients(address)
        self.writable[address] = writable
        if was_up is False:
            log.info("upstream %s answers again", address)
        self._up.labels(address).set(1)


async def _close(conn: UpstreamConnection | None) -> None:
    """Close `conn`, if there is one."""
    if conn is not None:
        await conn.aclose()
