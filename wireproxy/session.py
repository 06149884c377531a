"""One client connection: frames in, routed, replies out.

Invariant: requests on one connection are handled in order, like on mongos; every pass-through
request goes to the upstream connection pinned to this client connection, so SCRAM
conversations, sessions, transactions, cursors and exhaust replies behave exactly as against mongos.
Only requestID/responseTo are rewritten (the proxy numbers its own upstream requests).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import bson
import trio
from bson import ObjectId
from bson.errors import InvalidBSON
from bson.raw_bson import RawBSONDocument

from mongoformats import wire
from mongoformats.change_events import RAW
from mongoformats.errors import MongoError, ProtocolError
from mongoformats.oplog_splice import document_parts
from wireproxy.cluster_time import ClusterTimeGossip
from wireproxy.config import ProxyConfig
from wireproxy.failpoints import UpstreamFailPoints
from wireproxy.hello import (
    LOCAL_HELLO_FIELDS,
    UPSTREAM_HELLO_FIELDS,
    await_topology_change,
    hello_reply,
)
from wireproxy.members import Credentials
from wireproxy.metrics import ProxyMetrics, command_label
from wireproxy.router import CommandTable, LocalHandler, PassThrough, Route, classify
from wireproxy.scatter_send import send_pieces
from wireproxy.upstream import UpstreamClosed, UpstreamConnection

log = logging.getLogger("wireproxy")


# Commands that may change who is logged in on the upstream connection: SCRAM and other SASL
# mechanisms (saslStart/saslContinue), MONGODB-X509 (authenticate) and logout.
_LOGIN_COMMANDS = frozenset({"saslstart", "saslcontinue", "authenticate", "logout"})


def identity_of(users: Any) -> str | None:
    """The identity a connection has, from connectionStatus' `authInfo.authenticatedUsers`:
    "user@db" (the server's UserName form, so that users of the same name in two databases stay
    apart); several users (servers before 6.0 let a connection authenticate as more than one)
    are one identity, sorted and comma-separated; None when nobody is logged in."""
    names = sorted(
        f"{u['user']}@{u['db']}"
        for u in users or ()
        if isinstance(u, dict) and isinstance(u.get("user"), str) and isinstance(u.get("db"), str)
    )
    return ",".join(names) if names else None


class _CloseConnection(Exception):
    pass


# Failures that end the client's connection, whatever command they come from.
_CONNECTION_ENDS = (
    UpstreamClosed,
    _CloseConnection,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
)


def read_command(
    msg: wire.OpMsg, table: CommandTable, *, accelerate: bool
) -> tuple[RawBSONDocument, str, Route, LocalHandler | None]:
    """A client's OP_MSG as a command: its body (left undecoded), name, route and handler.
    ProtocolError, closing the connection as mongos does, when the body is empty or not BSON
    (the top level is checked here; mongos checks what lies deeper in a pass-through command)."""
    cmd = RawBSONDocument(msg.body, RAW)
    try:
        name = next(iter(cmd))
        route, handler = classify(cmd, table, accelerate=accelerate)
    except StopIteration:
        raise ProtocolError("empty command document") from None
    except InvalidBSON as exc:
        raise ProtocolError(f"invalid BSON in the command: {exc}") from exc
    return cmd, name, route, handler


def decoded_command(msg: wire.OpMsg) -> dict[str, Any]:
    """A command the proxy runs itself, decoded whole, its document sequences folded in as the
    server does; ProtocolError when any of it is not BSON."""
    try:
        decoded = bson.decode(msg.body)
        for ident, docs in msg.sequences:
            decoded[ident] = [bson.decode(d) for d in docs]
    except InvalidBSON as exc:
        raise ProtocolError(f"invalid BSON in the command: {exc}") from exc
    return decoded


def legacy_command(msg: wire.OpQuery) -> dict[str, Any]:
    """The command of an OP_QUERY (the handshake of old drivers), unwrapped from `$query`; {}
    (an unsupported command) when `$query` is not a document; ProtocolError when the query is
    not BSON."""
    try:
        cmd = bson.decode(msg.query)
    except InvalidBSON as exc:
        raise ProtocolError(f"invalid BSON in the query: {exc}") from exc
    inner = cmd.get("$query", cmd)
    return inner if isinstance(inner, dict) else {}


class FrameBudget:
    """The bytes the incomplete messages of clients that have not logged in hold, in all, against
    `limit` (0: none), so that many connections each sending most of a large message and then
    stalling cannot exhaust the proxy's memory. One per proxy; sessions report what they hold."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[object, int] = {}
        self._total = 0

    @property
    def total(self) -> int:
        return self._total

    def hold(self, holder: object, nbytes: int) -> bool:
        """Record that `holder` now holds `nbytes` (0: nothing); False, recording nothing, if
        that takes the total past the limit."""
        before = self._held.get(holder, 0)
        total = self._total - before + nbytes
        if self.limit and nbytes > before and total > self.limit:
            return False
        self._total = total
        if nbytes:
            self._held[holder] = nbytes
        else:
            self._held.pop(holder, None)
        return True


# The buffer a reply's deferred batch is gathered into, a part at a time (wire.DeferredPiece):
# small enough that each part is still in the CPU's cache when the kernel copies it out, large
# enough that the sends stay few (the sizes compared: benchmarks/README.md).
SEND_PART_BYTES = 512 << 10


class SessionHost(Protocol):
    """What a session uses of the server that accepted it (wireproxy.server.ProxyServer): stated
    here, so that the session does not import the server that imports it."""

    config: ProxyConfig
    table: CommandTable
    metrics: ProxyMetrics
    fail_points: UpstreamFailPoints
    cluster_time: ClusterTimeGossip
    credentials: Credentials | None
    frame_budget: FrameBudget
    process_id: ObjectId

    @property
    def wire_versions(self) -> tuple[int, int]: ...

    async def connect_upstream(self, *, engine: bool = False) -> UpstreamConnection: ...


class ClientSession:
    def __init__(self, server: SessionHost, stream: trio.abc.Stream, conn_id: int) -> None:
        self.server = server
        self.stream = stream
        self.conn_id = conn_id
        self.framer = wire.MessageFramer()
        self.upstream: UpstreamConnection | None = None
        self._reply_ids = 0
        # Who is logged in on this client's pinned upstream connection, as mongos says
        # (connectionStatus, see _verify_login): identity_of's "user@db", None for nobody. The
        # engine's commands and cursor ownership go by it. Never taken from the client's own
        # login messages: they name whom the client claims to be, not whom mongos accepted.
        self.user: str | None = None
        self._privileges: list[dict[str, Any]] | None = None  # of `user`, asked with it
        self._scratch: bytearray | None = None  # see _send_scratch

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:  # per-connection tasks live and die here
                await self._loop()
                nursery.cancel_scope.cancel()
        except* ProtocolError as group:
            self.server.metrics.protocol_errors.inc()
            self.server.metrics.client_log.info(
                "bad frame",
                "conn%d: closing after a bad frame: %s",
                self.conn_id,
                group.exceptions[0],
            )
        except* (UpstreamClosed, _CloseConnection) as group:
            self.server.metrics.client_log.info(
                "closing", "conn%d: closing: %s", self.conn_id, group.exceptions[0]
            )
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            if self.upstream is not None:
                await self.upstream.aclose()
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await self.stream.aclose()

    async def _receive(self) -> wire.Message | None:
        """The client's next message; None when it has closed the connection on a message
        boundary. Closes the connection (_CloseConnection, ProtocolError) when the client is idle
        past idle_timeout_s, when a message it has begun is not whole within frame_timeout_s,
        and, before it has logged in, when a message is larger than
        unauthenticated_max_message_bytes (the cluster requiring authentication) or would take
        the incomplete messages of such clients past unauthenticated_buffer_bytes."""
        budget = self.server.frame_budget
        started: float | None = None  # when the first bytes of the message being received came
        try:
            while True:
                logged_in = self.user is not None
                self.framer.max_size = self._max_message_bytes(logged_in)
                msg = self.framer.next_message()
                if msg is not wire.NEED_DATA:
                    return msg  # type: ignore[return-value]
                now = trio.current_time()
                started = self._held_since(budget, logged_in, started, now)
                data = await self._receive_some(now, started)
                self.framer.receive_data(data)
                if not data and not self.framer.trailing_data:
                    return None
        finally:
            budget.hold(self, 0)

    def _held_since(
        self, budget: FrameBudget, logged_in: bool, started: float | None, now: float
    ) -> float | None:
        """When the message being received began (`now` if its first bytes are held and it had
        not begun before); its held bytes count against `budget` if the client is not logged
        in."""
        held = self.framer.buffered
        if held and not logged_in:
            self._hold(budget, held)
        if held and started is None:
            return now
        return started

    def _max_message_bytes(self, logged_in: bool) -> int:
        """The largest message the client may send now: bounded before it has logged in, when
        the cluster requires authentication."""
        if not logged_in and self.server.credentials is not None:
            return self.server.config.unauthenticated_max_message_bytes
        return wire.MAX_MESSAGE_SIZE

    def _hold(self, budget: FrameBudget, held: int) -> None:
        """Count the incomplete message of a client not logged in against `budget`, or close
        the connection."""
        if not budget.hold(self, held):
            raise _CloseConnection(
                "incomplete messages of clients not logged in hold more "
                f"than unauthenticated_buffer_bytes ({budget.limit})"
            )

    async def _receive_some(self, now: float, started: float | None) -> bytes | bytearray:
        """The next bytes from the client, within idle_timeout_s and, for a message begun at
        `started`, frame_timeout_s after that."""
        config = self.server.config
        deadline = now + config.idle_timeout_s if config.idle_timeout_s > 0 else float("inf")
        frame_deadline = float("inf")
        if started is not None and config.frame_timeout_s > 0:
            frame_deadline = started + config.frame_timeout_s
        with trio.move_on_at(min(deadline, frame_deadline)):
            return await self.stream.receive_some(1 << 18)
        if deadline <= frame_deadline:
            raise _CloseConnection("idle timeout")
        raise _CloseConnection(
            f"a message was not whole within frame_timeout_s ({config.frame_timeout_s} s)"
        )

    async def _send(self, data: bytes | list[bytes | memoryview], compressor: str | None) -> None:
        """Send a message, or its pieces (`wire.op_msg_parts`): on a plain TCP stream they go out
        with scatter-gather writes, unjoined (a reply of megabytes is then copied once, into the
        kernel, not first into one bytes object); compressed or over TLS they are joined."""
        if isinstance(data, list):
            if compressor is None and type(self.stream) is trio.SocketStream:
                await send_pieces(self.stream, data, self._send_scratch)
                return
            data = wire.joined(data)
        await self.stream.send_all(wire.compress(data, compressor) if compressor else data)

    def _send_scratch(self) -> bytearray:
        """The connection's buffer for deferred pieces, made on its first use (most connections
        never send a batch of events)."""
        if self._scratch is None:
            self._scratch = bytearray(SEND_PART_BYTES)
        return self._scratch

    def _next_reply_id(self) -> int:
        self._reply_ids += 1
        return self._reply_ids

    async def _loop(self) -> None:
        while (msg := await self._receive()) is not None:
            if isinstance(msg, wire.OpQuery):
                await self._legacy_query(msg)
            elif isinstance(msg, wire.OpMsg):
                await self._op_msg(msg)
            else:
                raise ProtocolError("clients may only send OP_MSG or OP_QUERY")

    async def _legacy_query(self, msg: wire.OpQuery) -> None:
        cmd = legacy_command(msg)
        name = next(iter(cmd), "").lower()
        if name in ("ismaster", "hello"):
            reply = await self.hello(cmd)
        else:
            reply = MongoError(
                "UnsupportedOpQueryCommand",
                f"Unsupported OP_QUERY command: {name}. The client driver may require an upgrade.",
            ).to_reply()
        self.server.cluster_time.stamp(reply)
        out = wire.encode_op_reply(self._next_reply_id(), msg.request_id, (bson.encode(reply),))
        await self._send(out, msg.compressor)

    async def _op_msg(self, msg: wire.OpMsg) -> None:
        accelerate = self.server.config.accelerate_change_streams
        cmd, name, route, handler = read_command(msg, self.server.table, accelerate=accelerate)
        self.server.metrics.count_command(name, route.value)
        if route is Route.PASSTHROUGH:
            await self._pass_through(msg, name)
            return
        reply = await self._run_local(msg, name, route, handler)
        if reply is not None and not msg.more_to_come:
            # As every mongos reply: the newest cluster time, as mongos signed it.
            self.server.cluster_time.stamp(reply)
            parts = wire.op_msg_parts(self._next_reply_id(), msg.request_id, document_parts(reply))
            await self._send(parts, msg.compressor)

    async def _pass_through(self, msg: wire.OpMsg, name: str) -> None:
        """Forward `msg`, and learn from it what a login or configureFailPoint changed."""
        reply_body = await self._forward(msg)
        if name.lower() in _LOGIN_COMMANDS:
            # Whatever the step's outcome (done, failed, or sent with moreToCome and no reply),
            # ask mongos who is logged in now: the next request is read only after the answer.
            await self._verify_login()
        elif name.lower() == "configurefailpoint" and reply_body is not None:
            self.server.fail_points.observe(
                bson.decode(msg.body), bool(bson.decode(reply_body).get("ok"))
            )

    async def _run_local(
        self, msg: wire.OpMsg, name: str, route: Route, handler: LocalHandler | None
    ) -> dict[str, Any] | None:
        """The reply to a command the proxy runs itself, errors included; None when its handler
        passed it through to mongos, which has answered."""
        decoded = decoded_command(msg)
        try:
            if route is Route.HELLO:
                return await self.hello(decoded)
            assert handler is not None
            return await self._handled(msg, decoded, handler)
        except MongoError as exc:
            self.server.metrics.errors.labels(code=str(exc.code)).inc()
            return exc.to_reply()
        except _CONNECTION_ENDS:
            raise  # the connection ends, as a pass-through command's would
        except Exception as exc:
            return self._internal_error(exc, name)

    async def _handled(
        self, msg: wire.OpMsg, decoded: dict[str, Any], handler: LocalHandler
    ) -> dict[str, Any] | None:
        """The reply of the local `handler` to the command `decoded`; None when it passed the
        command through to mongos, which has answered."""
        try:
            reply = await handler(self, decoded.pop("$db", "admin"), decoded)
        except PassThrough:
            await self._forward(msg)
            return None
        reply.setdefault("ok", 1.0)
        return reply

    def _internal_error(self, exc: Exception, name: str) -> dict[str, Any]:
        """A bug of ours must cost this one command, not the connection, nor (through the
        listeners' nursery) every client of the proxy. The server's answer to its own unexpected
        failures is InternalError. The reply names the failure only by its error id, which the
        (rate-limited) log holds with the traceback: no Python text reaches a client."""
        what = f"conn{self.conn_id}: {command_label(name)}"
        error_id = self.server.metrics.failures.record(exc, what)
        self.server.metrics.errors.labels(code="1").inc()
        return MongoError(
            "InternalError",
            f"the proxy failed to run the command (error id {error_id}; see the proxy's log)",
        ).to_reply()

    # -- the upstream's fail points on local commands (see wireproxy/failpoints.py) ----------------

    async def fail_point_reply(
        self, name: str, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any] | None:
        """mongos's answer to the local command `name` if its failCommand fail point fires for
        it."""
        return await self.server.fail_points.probe(self.get_upstream, name, db, cmd)

    async def fail_after_checkout(self) -> MongoError | None:
        """The failGetMoreAfterCursorCheckout error for a getMore on a cursor of the proxy's own."""
        return await self.server.fail_points.after_checkout(self.get_upstream)

    async def forward_command(self, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """`cmd` run on this client's upstream connection, as mongos answers it (errors
        included)."""
        up = await self.get_upstream()
        return dict(bson.decode((await up.command(db, cmd, check=False)).raw))

    # -- pass-through ------------------------------------------------------------------------------

    async def get_upstream(self) -> UpstreamConnection:
        if self.upstream is None:
            self.upstream = await self.server.connect_upstream()
        elif self.upstream.closed:
            # The client's login and cursors live on the mongos it was pinned to; another would not
            # know them. The connection ends instead, and the driver starts afresh on a new one.
            raise UpstreamClosed(f"the connection to mongos {self.upstream.address} was lost")
        return self.upstream

    async def _verify_login(self) -> None:
        """Learn who is logged in on the pinned upstream connection, and their privileges, from
        mongos itself (connectionStatus with showPrivileges), after any login command or logout.
        Unverifiable (an error reply) counts as nobody: the engine then refuses what needs a
        user."""
        self.user, self._privileges = None, []
        up = await self.get_upstream()
        reply = bson.decode(
            (
                await up.command(
                    "admin", {"connectionStatus": 1, "showPrivileges": True}, check=False
                )
            ).raw
        )
        info = reply.get("authInfo") if reply.get("ok") else None
        if not isinstance(info, dict):
            log.info(
                "conn%d: connectionStatus failed, taking the connection as logged out: %s",
                self.conn_id,
                reply.get("errmsg"),
            )
            return
        self.user = identity_of(info.get("authenticatedUsers"))
        privileges = info.get("authenticatedUserPrivileges")
        self._privileges = list(privileges) if self.user and isinstance(privileges, list) else []

    async def privileges(self) -> list[dict[str, Any]]:
        """The logged-in user's privileges, as the upstream reports them on this client's own
        connection (connectionStatus with showPrivileges); [] when nobody is logged in."""
        if self._privileges is None:
            await self._verify_login()
        assert self._privileges is not None
        return self._privileges

    async def _forward(self, msg: wire.OpMsg) -> bytes | None:
        """Send `msg` upstream and relay the replies; returns the (last) reply's body."""
        up = await self.get_upstream()
        rid = up.next_request_id()
        start = trio.current_time()
        await up.send(
            wire.encode_op_msg(
                rid,
                0,
                msg.body,
                flags=msg.flags & ~wire.FLAG_CHECKSUM_PRESENT,
                sequences=msg.sequences,
            )
        )
        if msg.more_to_come:
            return None
        response_to = msg.request_id
        while True:
            reply = await up.receive()
            if not isinstance(reply, wire.OpMsg):
                raise UpstreamClosed("upstream answered with a non-OP_MSG reply")
            self.server.metrics.upstream_latency.observe(trio.current_time() - start)
            self.server.cluster_time.observe(reply.body)
            reply_id = self._next_reply_id()
            out = wire.encode_op_msg(
                reply_id,
                response_to,
                reply.body,
                flags=reply.flags & wire.FLAG_MORE_TO_COME,
                sequences=reply.sequences,
            )
            await self._send(out, msg.compressor)
            if (
                not reply.more_to_come
            ):  # exhaust: the upstream keeps sending until it clears moreToCome
                return reply.body
            response_to = reply_id

    # -- hello -------------------------------------------------------------------------------------

    async def hello(self, cmd: dict[str, Any]) -> dict[str, Any]:
        server = self.server
        await await_topology_change(cmd, server.process_id)
        reply = hello_reply(cmd, server.process_id, server.wire_versions, self.conn_id)
        if any(f in cmd for f in UPSTREAM_HELLO_FIELDS):
            reply.update(await self._upstream_hello_fields(cmd))
        reply["ok"] = 1.0
        return reply

    async def _upstream_hello_fields(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Authentication belongs to the upstream: the hello fields only it can answer, asked on
        the pinned connection."""
        up = await self.get_upstream()
        sub = {k: v for k, v in cmd.items() if k not in LOCAL_HELLO_FIELDS}
        got = await up.command(cmd.get("$db", "admin"), sub, check=False)
        fields = {
            f: bson.decode(bson.encode({"v": got[f]}))["v"]
            for f in UPSTREAM_HELLO_FIELDS
            if f in got
        }
        if "speculativeAuthenticate" in cmd:
            # The handshake may have logged in (speculative authentication completes in hello
            # for some mechanisms, X.509's): mongos says whether it did, and as whom.
            await self._verify_login()
        return fields
