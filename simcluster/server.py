"""What every simulated process shares: the wire front-end, hello, sessions, cursors, fail points.

Strategy: one trio task per client connection runs a framer loop; each OP_MSG is decoded with
pymongo's C codec, document sequences are folded into the body as the server does, and the
command runs through a table `{name: handler}`. Any `MongoError` becomes an `{ok: 0}` reply; any
other exception becomes InternalError (1): bad input never kills a node or another connection.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import bson
import trio
from bson import ObjectId
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.errors import InvalidBSON

from mongoformats import wire
from mongoformats.errors import MongoError, ProtocolError, has_category, with_change_stream_label
from mongoformats.oplog_splice import document_parts
from mongoformats.privileges import allows, privileges_of_roles
from mongoformats.scram import ScramCredential
from mongoformats.sessions import session_id
from simcluster.authz import required_privileges
from simcluster.cluster_time import DUMMY_SIGNATURE, ClusterTimeKey, gossip_in
from simcluster.cursors import CursorManager
from simcluster.oplog import ClusterClock
from simcluster.server_commands import GenericCommands, Request

log = logging.getLogger("simcluster")

MAX_WIRE_VERSION = {"7.0": 21, "8.0": 25, "6.0": 17, "5.0": 13}
# Decoded commands are dicts; UUIDs stay Binary subtype 4 (no representation chosen).
# Dates beyond Python's datetime (years 1-9999; BSON spans ±292 million years) decode as DatetimeMS,
# as a server takes them (pymongo's default would refuse the command).
DECODE: CodecOptions[Any] = CodecOptions(
    tz_aware=True, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)


# What an unauthenticated connection may run when auth is on (the server's requiresAuth() false).
_NO_AUTH = frozenset(
    {
        "hello",
        "ismaster",
        "ping",
        "buildinfo",
        "saslstart",
        "saslcontinue",
        "connectionstatus",
        "logout",
        "getnonce",
        "endsessions",
        "whatsmyuri",
    }
)


class CommandServer(GenericCommands):
    """Base of mongod and mongos: subclasses add commands to `self.commands`."""

    process_kind = "mongod"
    # The server parameters getParameter reports and setParameter changes at run time, each with
    # the attribute that holds it.
    runtime_parameters: dict[str, str] = {"cursorTimeoutMillis": "cursor_timeout_ms"}
    CURSOR_MONITOR_S = 4.0  # clientCursorMonitorFrequencySecs: how often idle cursors are timed out

    def __init__(self, clock: ClusterClock, host: str, port: int, *, version: str = "7.0") -> None:
        self.clock = clock
        self.host = host
        self.port = port
        self.version = version
        self.max_wire_version = MAX_WIRE_VERSION[version]
        self.cursors = CursorManager()
        self.cursor_timeout_ms = 600_000  # cursorTimeoutMillis (see simcluster.cursors)
        self.process_id = ObjectId()
        self._conn_ids = itertools.count(1)
        self._message_ids = itertools.count(1)  # the requestId of each message this process sends
        self.fail_points: dict[str, dict[str, Any]] = {}
        # net.tls.mode requireTLS when set: every connection is TLS (the cluster sets one context).
        self.ssl_context: ssl.SSLContext | None = None
        # security.authorization enabled when set: admin-database users and their SCRAM credentials.
        self.users: dict[str, ScramCredential] | None = None
        # Each user's built-in roles, (role, db); a user not listed has root (the cluster's
        # default).
        self.user_roles: dict[str, list[tuple[str, str]]] = {}
        # With authorization: the cluster's key signing $clusterTime (simcluster.cluster_time).
        self.time_key: ClusterTimeKey | None = None
        self._cancel = trio.CancelScope()
        # Cleared while the process is paused (a SIGSTOPped mongod, or one cut off by a partition
        # that drops its packets): its sockets stay open and nothing on them is answered until it
        # resumes.
        self._running = trio.Event()
        self._running.set()
        # topologyVersion: the counter moves on every role change, and wakes awaitable hellos.
        self.topology_counter = 0
        self._topology_changed = trio.Event()
        self.commands: dict[
            str, Callable[[str, dict[str, Any], Request], Awaitable[dict[str, Any]]]
        ] = {
            "hello": self.cmd_hello,
            "ismaster": self.cmd_hello,
            "ping": self.cmd_ping,
            "buildinfo": self.cmd_build_info,
            "getparameter": self.cmd_get_parameter,
            "setparameter": self.cmd_set_parameter,
            "endsessions": self.cmd_ok,
            "killallsessions": self.cmd_kill_sessions,
            "killallsessionsbypattern": self.cmd_kill_sessions,
            "killsessions": self.cmd_kill_sessions,
            "startsession": self.cmd_start_session,
            "refreshsessions": self.cmd_ok,
            "getmore": self.cmd_get_more,
            "killcursors": self.cmd_kill_cursors,
            "serverstatus": self.cmd_server_status,
            "configurefailpoint": self.cmd_configure_fail_point,
            "getcmdlineopts": self.cmd_cmdline,
            "hostinfo": self.cmd_host_info,
            "getlog": self.cmd_get_log,
            "whatsmyuri": self.cmd_whatsmyuri,
            "connectionstatus": self.cmd_connection_status,
            "getfreemonitoringstatus": self.cmd_ok,
            "atlasversion": self.cmd_not_found,
            "saslstart": self.cmd_sasl_start,
            "saslcontinue": self.cmd_sasl_continue,
            "logout": self.cmd_logout,
        }

    @property
    def serves_exhaust(self) -> bool:
        """Whether a getMore with exhaustAllowed streams its batches: mongod's since 4.2, mongos's
        since 7.1 (SERVER-57297; before, it answered such a getMore plainly, without moreToCome)."""
        return self.process_kind == "mongod" or self.max_wire_version >= 22

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        self._cancel = (
            trio.CancelScope()
        )  # a fresh scope, so a stopped process can be started again
        with self._cancel:
            tcp = await trio.open_tcp_listeners(self.port, host=self.host)
            self.port = tcp[0].socket.getsockname()[1]
            listeners: list[Any] = list(tcp)
            if self.ssl_context is not None:
                listeners = [
                    trio.SSLListener(t, self.ssl_context, https_compatible=False) for t in tcp
                ]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.background)
                nursery.start_soon(self._time_out_cursors)
                task_status.started(self.port)
                await trio.serve_listeners(
                    self._handle_connection, listeners, handler_nursery=nursery
                )

    async def background(self) -> None:
        """Work a process does on its own (periodic noops, replication); stops with the process."""

    async def _time_out_cursors(self) -> None:
        """The server's cursor monitor: every CURSOR_MONITOR_S, kill the cursors idle for longer
        than cursorTimeoutMillis (CursorManager.time_out says which may time out)."""
        while True:
            await trio.sleep(self.CURSOR_MONITOR_S)
            await self.wait_running()
            self.cursors.time_out(self.cursor_timeout_ms / 1000)

    def stop(self) -> None:
        """Stop listening and drop every connection (a crashed or stopped process)."""
        self._cancel.cancel()

    def pause(self) -> None:
        """Stop answering and working, sockets left open (see `_running`)."""
        if self._running.is_set():
            self._running = trio.Event()

    def resume(self) -> None:
        self._running.set()

    async def wait_running(self) -> None:
        if not self._running.is_set():
            await self._running.wait()

    def bump_topology(self) -> None:
        self.topology_counter += 1
        self._topology_changed.set()
        self._topology_changed = trio.Event()

    async def _handle_connection(
        self, stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]
    ) -> None:
        conn_id = next(self._conn_ids)
        sock = (
            stream.transport_stream.socket if isinstance(stream, trio.SSLStream) else stream.socket
        )
        req = Request(conn_id, str(sock.getpeername()))
        try:
            async with stream:
                await self._converse(stream, req)
        except ProtocolError as exc:
            log.info("closing connection %s: %s", conn_id, exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:
            # Left to propagate, it would end serve_listeners' nursery: this process, and with
            # it (one trio run) the whole cluster. A server closes the one connection.
            log.exception("closing connection %s after an unexpected error", conn_id)

    async def _converse(
        self, stream: trio.SocketStream | trio.SSLStream[trio.SocketStream], req: Request
    ) -> None:
        """Answer the connection's messages until the client closes it or a reply drops it."""
        framer = wire.MessageFramer()
        while True:
            msg = framer.next_message()
            if msg is wire.NEED_DATA:
                data = await stream.receive_some(1 << 16)
                framer.receive_data(data)
                if not data and not framer.trailing_data:
                    return
                continue
            if not await self._answer(stream, msg, req):
                return

    async def _answer(
        self,
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
        msg: object,
        req: Request,
    ) -> bool:
        """Send the replies to one message; False when the connection is to be dropped."""
        request: object | None = msg
        while request is not None:  # an exhaust getMore runs again after each reply
            await self.wait_running()
            reply, request = await self._dispatch(request, req)
            if reply is None:
                continue
            if reply is _CLOSE:
                return False
            assert isinstance(reply, bytes)
            await self.wait_running()  # a reply made as the process paused is not sent either
            await stream.send_all(reply)
        return True

    async def _dispatch(
        self, msg: Any, req: Request
    ) -> tuple[bytes | None | object, wire.OpMsg | None]:
        """The reply to `msg` (None: none is due; _CLOSE: drop the connection), and the request to
        run next without reading one: an exhaust getMore's own again, as the reply said
        moreToCome."""
        if isinstance(msg, wire.OpQuery):
            return await self._answer_op_query(msg, req), None
        if not isinstance(msg, wire.OpMsg):
            raise ProtocolError("only OP_MSG and OP_QUERY are accepted from clients")
        return await self._answer_op_msg(msg, req)

    async def _answer_op_query(self, msg: wire.OpQuery, req: Request) -> bytes | object:
        cmd = decode_document(msg.query)
        if "$query" in cmd:
            cmd = cmd["$query"]
        db = msg.full_collection_name.split(".", 1)[0]
        body = await self._run(db, cmd, req)
        if body is _CLOSE:
            return _CLOSE
        reply = wire.encode_op_reply(next(self._message_ids), msg.request_id, (bson.encode(body),))
        return wire.compress(reply, msg.compressor) if msg.compressor else reply

    async def _answer_op_msg(
        self, msg: wire.OpMsg, req: Request
    ) -> tuple[bytes | None | object, wire.OpMsg | None]:
        cmd = _op_msg_command(msg)
        db = cmd.pop("$db", "admin")
        exhaust = self._exhaust_requested(msg, cmd)
        body = await self._run(db, cmd, req)
        if body is _CLOSE:
            return _CLOSE, None
        if msg.more_to_come:
            return None, None
        # An exhaust getMore (see serves_exhaust): while its cursor lives, the reply says
        # moreToCome and the server runs the same getMore again, unasked, its next reply answering
        # this one; an error or a closed cursor ends the stream. Replication's oplog fetcher reads
        # so, a batch on its way while the last one is applied.
        # (Whether the cursor lives is asked of the cursors, not of the reply: reading a reply's
        # cursor id inflates its batch, thousands of entries.)
        again = exhaust and bool(body.get("ok")) and cmd.get("getMore") in self.cursors
        reply_id = next(self._message_ids)
        reply = wire.encode_op_msg(
            reply_id,
            msg.request_id,
            document_parts(body),
            flags=wire.FLAG_MORE_TO_COME if again else 0,
        )
        follow = dataclasses.replace(msg, request_id=reply_id) if again else None
        return (wire.compress(reply, msg.compressor) if msg.compressor else reply), follow

    def _exhaust_requested(self, msg: wire.OpMsg, cmd: dict[str, Any]) -> bool:
        """Whether the message is a getMore that may stream its batches (exhaustAllowed)."""
        return (
            msg.exhaust_allowed and self.serves_exhaust and next(iter(cmd), "").lower() == "getmore"
        )

    async def _run(self, db: str, cmd: dict[str, Any], req: Request) -> Any:
        name = next(iter(cmd), "")
        try:
            self._gossip_in(cmd, req)
            fp = await self._fail_point(name)
            if fp is _CLOSE:
                return _CLOSE
            reply = await self._handle(name, db, cmd, req)
        except MongoError as exc:
            reply = _labelled(exc, name, cmd).to_reply()
        except Exception as exc:  # a bug or unexpected input must not take the node down
            log.exception("command %s failed", name)
            reply = MongoError("InternalError", f"{type(exc).__name__}: {exc}").to_reply()
        return self.decorate(reply)

    def _gossip_in(self, cmd: dict[str, Any], req: Request) -> None:
        """Advance the clock to a command's $clusterTime (checked as simcluster.cluster_time
        says)."""
        if "$clusterTime" not in cmd:
            return
        gossiped = gossip_in(
            cmd["$clusterTime"],
            key=self.time_key if self.users is not None else None,
            authenticated=req.user is not None,
            newest=self.clock.now(),
            missing_signature_parses=self.max_wire_version >= MAX_WIRE_VERSION["8.0"],
        )
        if gossiped is not None:
            self.clock.advance(gossiped)

    async def _handle(
        self, name: str, db: str, cmd: dict[str, Any], req: Request
    ) -> dict[str, Any]:
        """Check, run and settle one command; its reply."""
        handler = self.commands.get(name.lower())
        if handler is None:
            raise MongoError("CommandNotFound", f"no such command: '{name}'")
        if self.users is not None and name.lower() not in _NO_AUTH:
            if req.user is None:
                raise MongoError("Unauthorized", f"Command {name} requires authentication")
            self._authorize(name, db, cmd, req.user)
        await self.check_command(name, db, cmd)
        reply = await handler(db, cmd, req)
        reply.setdefault("ok", 1.0)
        self._note_cursor(name, cmd, reply, req)
        await self.settle(name, cmd, reply)
        return reply

    def _note_cursor(
        self, name: str, cmd: dict[str, Any], reply: dict[str, Any], req: Request
    ) -> None:
        """A cursor opened: its session, user and noCursorTimeout (a getMore's reply names the
        cursor it used). The command is looked at first: a reply's cursor may hold megabytes."""
        if not ("lsid" in cmd or cmd.get("noCursorTimeout")) or name.lower() == "getmore":
            return
        cursor = reply.get("cursor")
        if not isinstance(cursor, Mapping) or not cursor.get("id"):
            return
        in_session = "lsid" in cmd
        self.cursors.opened_in(
            int(cursor["id"]),
            session_id(cmd["lsid"]["id"]) if in_session else None,
            req.user if in_session else None,
            no_timeout=bool(cmd.get("noCursorTimeout")),
        )

    def _authorize(self, name: str, db: str, cmd: dict[str, Any], user: str) -> None:
        privileges = privileges_of_roles(self.roles_of(user))
        for actions, resource in required_privileges(name, db, cmd):
            if not allows(privileges, actions, resource):
                target = cmd.get(name)
                shown = f'"{target}"' if isinstance(target, str) else target
                raise MongoError(
                    "Unauthorized",
                    f"not authorized on {db} to execute command {{ {name}: {shown} }}",
                )

    async def check_command(self, name: str, db: str, cmd: dict[str, Any]) -> None:
        """Hook: reject a command this process may not run now (a write on a secondary, a statement
        of an unknown transaction)."""

    async def settle(self, name: str, cmd: dict[str, Any], reply: dict[str, Any]) -> None:
        """Hook: what a succeeded command waits for before its reply (its write concern)."""

    def decorate(self, reply: dict[str, Any]) -> dict[str, Any]:
        now = self.clock.now()
        # Signed with the cluster's key under authorization; else the dummy signature, as a
        # server gives clients that may advance the clock (simcluster.cluster_time).
        key = self.time_key if self.users is not None else None
        reply["$clusterTime"] = {
            "clusterTime": now,
            "signature": key.sign(now) if key is not None else dict(DUMMY_SIGNATURE),
        }
        reply["operationTime"] = now
        return reply

    async def _fail_point(self, name: str) -> object | None:
        fp = self.fail_points.get("failCommand")
        if not fp or name not in fp["data"].get("failCommands", ()):
            return None
        if not self._fail_point_fires(fp):
            self.fail_points.pop("failCommand", None)
            return None
        data = fp["data"]
        if data.get("blockConnection"):
            await trio.sleep(data.get("blockTimeMS", 0) / 1000)
        if data.get("closeConnection"):
            return _CLOSE
        if "errorCode" in data:
            raise MongoError(
                int(data["errorCode"]),
                "Failing command via 'failCommand' failpoint",
                labels=tuple(data.get("errorLabels", ())),
            )
        return None

    async def hang_while(self, name: str) -> None:
        """A hang fail point (e.g. hangBeforeWritingDecision): wait while it is configured on."""
        while name in self.fail_points:
            await trio.sleep(0.01)


_CLOSE = object()


def _op_msg_command(msg: wire.OpMsg) -> dict[str, Any]:
    """An OP_MSG's command: its body with each document sequence as the field it names."""
    cmd = decode_document(msg.body)
    for ident, docs in msg.sequences:
        cmd[ident] = decode_sequence(docs)
        if ident == "documents":
            # Inserts keep the client's exact bytes, so the oplog's `o` (and every event's
            # fullDocument) is byte-identical to what was sent, as on the server.
            cmd["$raw_documents"] = docs
    return cmd


def decode_document(raw: bytes) -> dict[str, Any]:
    """A message's BSON document; ProtocolError (the connection closes) when it is not valid
    BSON, as a server's message parsing fails the connection (service_entry_point_common.cpp:
    parse errors in the ConnectionFatalMessageParseError category)."""
    try:
        return bson.decode(raw, DECODE)
    except (InvalidBSON, ValueError, OverflowError) as exc:
        raise ProtocolError(f"invalid BSON in the message: {exc}") from exc


def decode_sequence(docs: tuple[bytes, ...]) -> list[dict[str, Any]]:
    """A document sequence's documents (one C loop for the whole batch), as `decode_document`."""
    try:
        return bson.decode_all(b"".join(docs), DECODE)
    except (InvalidBSON, ValueError, OverflowError) as exc:
        raise ProtocolError(f"invalid BSON in the message: {exc}") from exc


def _labelled(exc: MongoError, name: str, cmd: dict[str, Any]) -> MongoError:
    """The error with the labels a server adds to it."""
    if _retryable_write(name, cmd) and has_category(exc.code, "RetriableError"):
        # 4.4+ servers label the errors a driver may retry a write on (error_labels.cpp);
        # drivers no longer decide that themselves.
        exc = exc.with_labels("RetryableWriteError")
    if name in ("getMore", "aggregate") and getattr(exc, "change_stream", False):
        return with_change_stream_label(exc)
    if has_category(exc.code, "NonResumableChangeStreamError") and not exc.has_label(
        "NonResumableChangeStreamError"
    ):
        # ErrorLabelBuilder::build labels these codes whatever the command and whenever
        # it fails, a change stream's opening aggregate included (error_labels.cpp).
        return exc.with_labels("NonResumableChangeStreamError")
    return exc


def _retryable_write(name: str, cmd: dict[str, Any]) -> bool:
    """A write sent with a txnNumber outside a transaction, or a transaction's commit/abort."""
    lname = name.lower()
    if lname in ("committransaction", "aborttransaction"):
        return True
    return (
        "txnNumber" in cmd
        and "autocommit" not in cmd
        and lname in ("insert", "update", "delete", "findandmodify")
    )
