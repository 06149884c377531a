"""The proxy server: accepts client connections (TCP or TLS) and runs one ClientSession each."""

from __future__ import annotations

import contextlib
import itertools
import logging
import ssl
from typing import Any

import trio
from bson import ObjectId

from wireproxy.cluster_time import ClusterTimeGossip
from wireproxy.config import ProxyConfig
from wireproxy.failpoints import UpstreamFailPoints
from wireproxy.host_health import HostHealth, host_address
from wireproxy.members import logged_in
from wireproxy.metrics import ProxyMetrics
from wireproxy.router import CommandTable
from wireproxy.session import ClientSession, FrameBudget
from wireproxy.upstream import UpstreamClosed, UpstreamConnection, open_upstream
from wireproxy.upstream_monitor import UpstreamMonitor
from wireproxy.upstream_target import UpstreamTarget

log = logging.getLogger("wireproxy")

# The kernel's send buffer asked for each client connection (it grants up to net.core.wmem_max,
# doubled). Why not the kernel's own sizing: a connection starts at 16 KiB and grows only as
# data flows, so a bucket's reply of megabytes goes out in dozens of partial writes, each
# waiting for the proxy's loop to come back to it between other work (benchmarks/README.md).
# Memory is only used for bytes actually queued, which the replies' own sizes bound.
CLIENT_SEND_BUFFER_BYTES = 4 << 20


class ProxyServer:
    def __init__(
        self,
        config: ProxyConfig,
        *,
        table: CommandTable | None = None,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.config = config
        self.table = table or CommandTable()
        self.metrics = metrics or ProxyMetrics()
        self.fail_points = UpstreamFailPoints()  # armed on mongos through this proxy (tests only)
        # The newest $clusterTime mongos sent, for the replies the proxy makes itself.
        self.cluster_time = ClusterTimeGossip()
        self.process_id = ObjectId()
        target = UpstreamTarget.from_uri(
            config.upstream,
            tls=config.upstream_tls,
            tls_ca_file=config.upstream_tls_ca_file,
            tls_allow_invalid=config.upstream_tls_allow_invalid,
            reply_timeout_s=config.upstream_timeout_s or None,
        )
        self.hosts = target.hosts
        # Credentials in the upstream URI are the engine's own login (readers, lookups, notes);
        # a client's pinned connection is never logged in with them: each client authenticates
        # itself.
        self.credentials = target.member.credentials
        # What incomplete messages of clients not logged in hold (see ClientSession._receive).
        self.frame_budget = FrameBudget(config.unauthenticated_buffer_bytes)
        self._conn_ids = itertools.count(1)
        self._limiter = trio.CapacityLimiter(config.max_connections)
        # The engine's connections to shard members: same TLS settings, the proxy's own login.
        self.connect_member = target.member
        self._upstream_ssl = target.member.ssl_context()
        # The mongoses seen failing, by the monitor or by any connection to them: tried last.
        self.health = HostHealth()
        self.monitor = UpstreamMonitor(
            self.hosts,
            health=self.health,
            heartbeat_s=target.heartbeat_s,
            connect_timeout_s=target.member.connect_timeout_s,
            ssl_context=self._upstream_ssl,
            cut_clients=self._cut_clients_of,
            up_gauge=self.metrics.upstream_up,
            gossip=self.cluster_time,
        )
        self.sessions: set[ClientSession] = set()
        self.port = config.listen_port
        self.handler_nursery: trio.Nursery | None = None
        self._listener_scope: trio.CancelScope | None = None

    def _client_ssl(self) -> ssl.SSLContext | None:
        if not self.config.tls_cert_file:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.config.tls_cert_file)
        if self.config.tls_ca_file:
            ctx.load_verify_locations(self.config.tls_ca_file)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    @property
    def wire_versions(self) -> tuple[int, int]:
        """The wire versions of the mongos that answered last (the proxy listens only once one
        has)."""
        return self.monitor.wire_versions or (0, 21)

    async def connect_upstream(self, *, engine: bool = False) -> UpstreamConnection:
        """A new connection to the first reachable upstream mongos, those seen failing tried last:
        a client's, or (`engine`) one of the engine's, which gives up on a command after
        upstream_timeout_s and counts its losses against the mongos."""
        reply_timeout_s = self.connect_member.reply_timeout_s if engine else None
        last: Exception | None = None
        # The hosts that take writes first (every mongos; a replica set's primary), then by health.
        writable = self.monitor.writable
        for host, port in sorted(
            self.health.order(self.hosts), key=lambda h: not writable.get(host_address(*h))
        ):
            try:
                # A client's connection may be closed for what the client sent: only the
                # engine's losses count against a mongos.
                conn = await open_upstream(
                    host,
                    port,
                    ssl_context=self._upstream_ssl,
                    reply_timeout_s=reply_timeout_s,
                    health=self.health,
                    connect_timeout_s=self.connect_member.connect_timeout_s,
                    count_losses=engine,
                )
                conn.gossip = self.cluster_time
                return conn
            except UpstreamClosed as exc:
                last = exc
        raise UpstreamClosed(f"no upstream reachable: {last}")

    async def _cut_clients_of(self, address: str) -> None:
        """Close the upstream connections of the clients pinned to a host that hangs or stepped
        down: a command in flight fails, or the next one does, with a network error their drivers
        retry, on a new connection to another host."""
        for session in list(self.sessions):
            if (
                session.upstream is not None
                and session.upstream.address == address
                and not session.upstream.closed
            ):
                log.warning("conn%d: cutting its connection to %s", session.conn_id, address)
                await session.upstream.aclose()

    async def connect_engine_upstream(self) -> UpstreamConnection:
        """A connection to mongos for the engine, logged in with the proxy's credentials."""
        return await logged_in(await self.connect_upstream(engine=True), self.credentials)

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.monitor.run)
            self.handler_nursery = nursery
            ssl_ctx = self._client_ssl()
            listeners: list[Any] = await trio.open_tcp_listeners(
                self.config.listen_port, host=self.config.listen_host
            )
            if ssl_ctx is not None:
                listeners = [
                    trio.SSLListener(lst, ssl_ctx, https_compatible=False) for lst in listeners
                ]
            sock = listeners[0].transport_listener.socket if ssl_ctx else listeners[0].socket
            self.port = sock.getsockname()[1]
            if self.config.metrics_port:
                await nursery.start(self._serve_metrics)
            with trio.CancelScope() as self._listener_scope:
                task_status.started(self.port)
                await trio.serve_listeners(self._handle, listeners, handler_nursery=nursery)

    async def shutdown(self) -> None:
        """Stop accepting, give in-flight requests `shutdown_grace_s`, then close everything."""
        if self._listener_scope is not None:
            self._listener_scope.cancel()
        if self.handler_nursery is not None:
            self.handler_nursery.cancel_scope.deadline = (
                trio.current_time() + self.config.shutdown_grace_s
            )

    @property
    def open_connections(self) -> int:
        return int(self._limiter.borrowed_tokens)  # one token per client connection being served

    async def _handle(self, stream: trio.abc.Stream) -> None:
        try:
            self._limiter.acquire_nowait()
        except trio.WouldBlock:
            log.warning("max_connections reached: refusing a client")
            await stream.aclose()
            return
        self.metrics.connections.inc()
        socket_stream = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        if isinstance(socket_stream, trio.SocketStream):
            with contextlib.suppress(OSError):  # a client gone already: its session finds out
                socket_stream.setsockopt(
                    trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, CLIENT_SEND_BUFFER_BYTES
                )
        conn_id = next(self._conn_ids)
        session = ClientSession(self, stream, conn_id)
        self.sessions.add(session)
        try:
            await session.run()
        except Exception:
            # Left to propagate, one connection's failure would end serve_listeners, and with it
            # every other client. The session has closed its sockets on the way out.
            log.exception("conn%d: closed after an unexpected error", conn_id)
        finally:
            self.sessions.discard(session)
            self.metrics.connections.dec()
            self._limiter.release()

    async def _serve_metrics(
        self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        listeners = await trio.open_tcp_listeners(
            self.config.metrics_port, host=self.config.listen_host
        )
        task_status.started(listeners[0].socket.getsockname()[1])

        async def http(stream: trio.SocketStream) -> None:
            async with stream:
                with trio.move_on_after(5):
                    await stream.receive_some(4096)
                    body = await self.metrics.page()  # formatted off the loop
                    head = (
                        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                        b"Content-Length: "
                        + str(len(body)).encode()
                        + b"\r\nConnection: close\r\n\r\n"
                    )
                    await stream.send_all(head + body)

        await trio.serve_listeners(http, listeners)
