"""One client connection: frames in, routed, replies out.

Invariant: requests on one connection are handled in order, like on mongos; every pass-through
request goes to the upstream connection pinned to this client connection, so SCRAM
conversations, sessions, transactions, cursors and exhaust replies behave exactly as against mongos.
Only requestID/responseTo are rewritten (the proxy numbers its own upstream requests).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import bson
import numpy as np
import trio
from bson import Int64
from bson.raw_bson import RawBSONDocument

from mongoformats import wire
from mongoformats.change_events import RAW
from mongoformats.errors import MongoError, ProtocolError
from mongoformats.oplog_splice import document_parts
from wireproxy.router import PassThrough, Route, classify
from wireproxy.upstream import UpstreamClosed, UpstreamConnection

if TYPE_CHECKING:
    from wireproxy.server import ProxyServer

log = logging.getLogger("wireproxy")

# What a driver may ask in hello that only the upstream can answer (authentication).
_UPSTREAM_HELLO_FIELDS = ("saslSupportedMechs", "speculativeAuthenticate")


_LOGIN_COMMANDS = frozenset({"saslstart", "saslcontinue", "logout"})


def _scram_user(payload: Any) -> str | None:
    """The user named by a SCRAM client-first message, or None for another mechanism."""
    try:
        text = bytes(payload).decode()
    except (TypeError, UnicodeDecodeError):
        return None
    for part in text.split(",")[2:3]:
        if part.startswith("n="):
            return part[2:].replace("=2C", ",").replace("=3D", "=")
    return None


class _CloseConnection(Exception):
    pass


# Pieces one scatter-gather write takes at most (Linux's IOV_MAX is 1024); a message of more
# (a reply of many small events, each its own piece) is joined instead.
_MAX_PIECES = 512
# The buffer a reply's deferred batch is gathered into, a part at a time (wire.DeferredPiece).
# Micro-benchmark of a sender gathering 30k events of ~540 bytes from 4 blocks into loopback TCP,
# CPU an event: the whole batch at once ~310 ns; parts of 256 KiB ~265, 512 KiB ~250, 1 MiB ~260,
# 4 MiB ~260 (each part is still in the cache when the kernel copies it out). In a 4-shard catch-up
# of 1M inserts (readerProcesses 0, 6 runs taking turns), proxy/raw was 0.76 / 0.83 / 0.85 with
# parts of 256 KiB / 512 KiB / 1 MiB (512 KiB and 1 MiB within the machine's noise); in another
# run, 0.81 with parts of 512 KiB against 0.72 with whole batches.
SEND_PART_BYTES = 512 << 10


async def _send_pieces(stream: trio.SocketStream, pieces: list[Any], scratch: Callable[[], Any]) -> None:
    """`stream.send_all(b"".join(pieces))` without the join: `sendmsg` writes from the pieces
    where they lie, and is called again from where a partial write stopped; a deferred piece
    (wire.DeferredPiece) is made part by part into the buffer `scratch()` gives, each part sent
    before the next is made. Errors are SocketStream's (BrokenResourceError), so callers see one
    kind of failure either way. Only one task sends on a client connection (its session's
    loop), so no send can interleave."""
    views: list[memoryview] = []
    try:
        for piece in pieces:
            if isinstance(piece, wire.DeferredPiece):
                for part in piece.pieces(scratch()):
                    views.append(memoryview(part).cast("B"))
                    await _send_views(stream, views)
            elif len(piece):
                views.append(memoryview(piece).cast("B"))
        await _send_views(stream, views)
    except OSError as exc:
        raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc


async def _send_views(stream: trio.SocketStream, views: list[memoryview]) -> None:
    """Send all of `views` with scatter-gather writes, emptying the list."""
    while views:
        sent = await stream.socket.sendmsg(views)
        done = 0
        while done < len(views) and sent >= len(views[done]):
            sent -= len(views[done])
            done += 1
        del views[:done]
        if sent:
            views[0] = views[0][sent:]


class ClientSession:
    def __init__(self, server: ProxyServer, stream: trio.abc.Stream, conn_id: int) -> None:
        self.server = server
        self.stream = stream
        self.conn_id = conn_id
        self.framer = wire.MessageFramer()
        self.upstream: UpstreamConnection | None = None
        self._reply_ids = 0
        # Who this client logged in as on its pinned upstream connection (seen in the SCRAM
        # conversation passing through), for the engine's own commands and cursor ownership.
        self.user: str | None = None
        self._login_as: str | None = None
        self._privileges: list[dict[str, Any]] | None = None  # of `user`, asked once per login
        self._scratch: np.ndarray[Any, np.dtype[np.uint8]] | None = None  # see _send_scratch

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:  # per-connection tasks live and die here
                self.nursery = nursery
                await self._loop()
                nursery.cancel_scope.cancel()
        except* ProtocolError as group:
            self.server.metrics.protocol_errors.inc()
            log.info("conn%d: closing after a bad frame: %s", self.conn_id, group.exceptions[0])
        except* (UpstreamClosed, _CloseConnection) as group:
            log.info("conn%d: closing: %s", self.conn_id, group.exceptions[0])
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            if self.upstream is not None:
                await self.upstream.aclose()
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await self.stream.aclose()

    async def _receive(self) -> wire.Message | None:
        idle = self.server.config.idle_timeout_s
        while True:
            msg = self.framer.next_message()
            if msg is not wire.NEED_DATA:
                return msg  # type: ignore[return-value]
            with trio.move_on_after(idle if idle > 0 else float("inf")) as scope:
                data = await self.stream.receive_some(1 << 18)
            if scope.cancelled_caught:
                raise _CloseConnection("idle timeout")
            self.framer.receive_data(data)
            if not data and not self.framer.trailing_data:
                return None

    async def _send(self, data: bytes | list[bytes | memoryview], compressor: str | None) -> None:
        """Send a message, or its pieces (`wire.op_msg_parts`): on a plain TCP stream they go out
        with scatter-gather writes, unjoined (a reply of megabytes is then copied once, into the
        kernel, not first into one bytes object); compressed or over TLS they are joined."""
        if isinstance(data, list):
            if compressor is None and type(self.stream) is trio.SocketStream and len(data) <= _MAX_PIECES:
                await _send_pieces(self.stream, data, self._send_scratch)
                return
            data = wire.joined(data)
        await self.stream.send_all(wire.compress(data, compressor) if compressor else data)

    def _send_scratch(self) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """The connection's buffer for deferred pieces, made on its first use (most connections
        never send a batch of events)."""
        if self._scratch is None:
            self._scratch = np.empty(SEND_PART_BYTES, np.uint8)
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
        cmd = bson.decode(msg.query)
        cmd = cmd.get("$query", cmd)
        name = next(iter(cmd), "").lower()
        if name in ("ismaster", "hello"):
            reply = await self.hello(cmd)
        else:
            reply = MongoError("UnsupportedOpQueryCommand", f"Unsupported OP_QUERY command: {name}. The client "
                               "driver may require an upgrade.").to_reply()
        out = wire.encode_op_reply(self._next_reply_id(), msg.request_id, (bson.encode(reply),))
        await self._send(out, msg.compressor)

    async def _op_msg(self, msg: wire.OpMsg) -> None:
        cmd = RawBSONDocument(msg.body, RAW)
        try:
            name = next(iter(cmd))
        except StopIteration:
            raise ProtocolError("empty command document") from None
        route, handler = classify(cmd, self.server.table, accelerate=self.server.config.accelerate_change_streams)
        self.server.metrics.commands.labels(command=name, route=route.value).inc()
        if route is Route.PASSTHROUGH:
            reply_body = await self._forward(msg)
            if name.lower() in _LOGIN_COMMANDS and reply_body is not None:
                self._follow_login(name.lower(), cmd, RawBSONDocument(reply_body, RAW))
            elif name.lower() == "configurefailpoint" and reply_body is not None:
                self.server.fail_points.observe(bson.decode(msg.body), bool(bson.decode(reply_body).get("ok")))
            return
        try:
            if route is Route.HELLO:
                reply = await self.hello(bson.decode(msg.body))
            else:
                decoded = bson.decode(msg.body)
                for ident, docs in msg.sequences:
                    decoded[ident] = [bson.decode(d) for d in docs]
                assert handler is not None
                try:
                    reply = await handler(self, decoded.pop("$db", "admin"), decoded)
                except PassThrough:
                    await self._forward(msg)
                    return
                reply.setdefault("ok", 1.0)
        except MongoError as exc:
            self.server.metrics.errors.labels(code=str(exc.code)).inc()
            reply = exc.to_reply()
        except (UpstreamClosed, _CloseConnection, trio.BrokenResourceError, trio.ClosedResourceError):
            raise  # the connection ends, as a pass-through command's would
        except Exception as exc:
            # A bug of ours must cost this one command, not the connection, nor (through the
            # listeners' nursery) every client of the proxy. The server's answer to its own
            # unexpected failures is InternalError.
            log.exception("conn%d: %s failed", self.conn_id, name)
            self.server.metrics.errors.labels(code="1").inc()
            reply = MongoError("InternalError", f"{name} failed in the proxy: {type(exc).__name__}: {exc}").to_reply()
        if not msg.more_to_come:
            parts = wire.op_msg_parts(self._next_reply_id(), msg.request_id, document_parts(reply))
            await self._send(parts, msg.compressor)

    # -- the upstream's fail points on local commands (see wireproxy/failpoints.py) ----------------

    async def fail_point_reply(self, name: str, db: str, cmd: dict[str, Any]) -> dict[str, Any] | None:
        """mongos's answer to the local command `name` if its failCommand fail point fires for it."""
        return await self.server.fail_points.probe(self.get_upstream, name, db, cmd)

    async def fail_after_checkout(self) -> MongoError | None:
        """The failGetMoreAfterCursorCheckout error for a getMore on a cursor of the proxy's own."""
        return await self.server.fail_points.after_checkout(self.get_upstream)

    # -- pass-through ------------------------------------------------------------------------------

    async def get_upstream(self) -> UpstreamConnection:
        if self.upstream is None:
            self.upstream = await self.server.connect_upstream()
        elif self.upstream.closed:
            # The client's login and cursors live on the mongos it was pinned to; another would not
            # know them. The connection ends instead, and the driver starts afresh on a new one.
            raise UpstreamClosed(f"the connection to mongos {self.upstream.address} was lost")
        return self.upstream

    def _follow_login(self, name: str, cmd: Any, reply: Any) -> None:
        """Learn the user from a SCRAM conversation the upstream accepted (the first message names
        it: "n,,n=<user>,r=..."); a logout forgets it."""
        self._privileges = None
        if name == "logout":
            self.user = self._login_as = None
            return
        if not reply.get("ok"):
            self._login_as = None
            return
        if name == "saslstart":
            self._login_as = _scram_user(cmd.get("payload"))
        if reply.get("done") and self._login_as:
            self.user = self._login_as

    async def privileges(self) -> list[dict[str, Any]]:
        """The logged-in user's privileges, as the upstream reports them on this client's own
        connection (connectionStatus with showPrivileges); [] when nobody is logged in."""
        if self._privileges is None:
            up = await self.get_upstream()
            reply = await up.command("admin", {"connectionStatus": 1, "showPrivileges": True})
            info = bson.decode(reply.raw).get("authInfo", {})
            self._privileges = list(info.get("authenticatedUserPrivileges", []))
        return self._privileges

    async def _forward(self, msg: wire.OpMsg) -> bytes | None:
        """Send `msg` upstream and relay the replies; returns the (last) reply's body."""
        up = await self.get_upstream()
        rid = up.next_request_id()
        start = trio.current_time()
        await up.send(wire.encode_op_msg(rid, 0, msg.body, flags=msg.flags & ~wire.FLAG_CHECKSUM_PRESENT,
                                         sequences=msg.sequences))
        if msg.more_to_come:
            return None
        response_to = msg.request_id
        while True:
            reply = await up.receive()
            if not isinstance(reply, wire.OpMsg):
                raise UpstreamClosed("upstream answered with a non-OP_MSG reply")
            self.server.metrics.upstream_latency.observe(trio.current_time() - start)
            reply_id = self._next_reply_id()
            out = wire.encode_op_msg(reply_id, response_to, reply.body, flags=reply.flags & wire.FLAG_MORE_TO_COME,
                                     sequences=reply.sequences)
            await self._send(out, msg.compressor)
            if not reply.more_to_come:  # exhaust: the upstream keeps sending until it clears moreToCome
                return reply.body
            response_to = reply_id

    # -- hello -------------------------------------------------------------------------------------

    async def hello(self, cmd: dict[str, Any]) -> dict[str, Any]:
        server = self.server
        if ("topologyVersion" in cmd) != ("maxAwaitTimeMS" in cmd):
            raise MongoError(51760 if "topologyVersion" in cmd else 51758,
                             "topologyVersion and maxAwaitTimeMS must be given together")
        tv = cmd.get("topologyVersion")
        if tv is not None and tv.get("processId") == server.process_id:
            await trio.sleep(int(cmd["maxAwaitTimeMS"]) / 1000)
        legacy = next(iter(cmd)).lower() == "ismaster"
        reply: dict[str, Any] = {}
        if cmd.get("helloOk"):
            reply["helloOk"] = True
        reply["ismaster" if legacy else "isWritablePrimary"] = True
        reply.update({
            "msg": "isdbgrid",
            "topologyVersion": {"processId": server.process_id, "counter": Int64(0)},
            "maxBsonObjectSize": 16 * 1024 * 1024, "maxMessageSizeBytes": wire.MAX_MESSAGE_SIZE,
            "maxWriteBatchSize": 100_000, "localTime": datetime.datetime.now(datetime.UTC),
            "logicalSessionTimeoutMinutes": 30, "connectionId": self.conn_id,
            "minWireVersion": server.wire_versions[0], "maxWireVersion": server.wire_versions[1],
        })
        if "compression" in cmd:
            chosen = [c for c in cmd["compression"] if c in ("zlib", "snappy", "zstd")]
            if chosen:
                reply["compression"] = chosen
        if any(f in cmd for f in _UPSTREAM_HELLO_FIELDS):
            # Authentication belongs to the upstream: ask it on the pinned connection.
            up = await self.get_upstream()
            sub = {k: v for k, v in cmd.items() if k not in ("compression", "topologyVersion", "maxAwaitTimeMS")}
            got = await up.command(cmd.get("$db", "admin"), {k: v for k, v in sub.items() if k != "$db"}, check=False)
            for f in _UPSTREAM_HELLO_FIELDS:
                if f in got:
                    reply[f] = bson.decode(bson.encode({"v": got[f]}))["v"]
            speculative = cmd.get("speculativeAuthenticate")
            if isinstance(speculative, dict) and "speculativeAuthenticate" in got:
                # The handshake started a login (speculative authentication): follow it too.
                self._follow_login("saslstart", speculative, {"ok": 1, **reply["speculativeAuthenticate"]})
        reply["ok"] = 1.0
        return reply
