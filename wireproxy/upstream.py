"""A trio connection to a MongoDB server (mongos or a shard member) over the sans-IO codec.

Two uses: the proxy pins one per client connection and forwards frames verbatim apart from
requestID/responseTo; the engine's shard readers run commands on it. Replies are returned as
`RawBSONDocument`, so callers decode only the fields they need.

The engine's connections give up on a command that has no answer after `reply_timeout_s` beyond
its own maxTimeMS (the proxy's `upstream_timeout_s`, a driver's socketTimeoutMS): a member that
hangs (a stopped process, a partition that drops packets rather than resetting connections) keeps
its sockets open, and TCP would wait hours. The connection is closed then, and a shard's reader
resumes on another member. A client's pinned connection has no such limit: its driver keeps its
own timeouts, and its commands may rightly run for hours.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import select
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import bson
import trio
from bson.raw_bson import RawBSONDocument
from pymongo.uri_parser import split_hosts

from mongoformats import wire
from mongoformats.change_events import RAW
from mongoformats.errors import ConnectionLost, MongoError, ProtocolError
from mongoformats.oplog_splice import first_element
from wireproxy.cluster_time import ClusterTimeGossip
from wireproxy.host_health import HostHealth, host_address

__all__ = [
    "CONNECT_TIMEOUT_S",
    "UpstreamConnection",
    "UpstreamClosed",
    "UpstreamTimeout",
    "host_address",
    "open_upstream",
    "parse_hosts",
]


CONNECT_TIMEOUT_S = 10.0  # to connect, and for a hello (a driver's connectTimeoutMS default)
# A larger reply to an in-place command is received into its own buffer.
DIRECT_FRAME_BYTES = 1 << 16
# Makes the buffer such a reply is received into (its bytes are all overwritten).
Allocate = Callable[[int], bytearray]
# While a large reply's rest is awaited, the socket wakes its reader once this much of it (or
# all that is left) has arrived (see UpstreamConnection._receive_rest). Linux caps it at half
# the most the receive buffer may grow to (tcp_rmem), growing the buffer to hold it.
RECEIVE_LOW_WATER_BYTES = 1 << 20


class UpstreamClosed(ConnectionLost):
    """The upstream server closed the connection, could not be reached or did not answer in time."""


class UpstreamTimeout(UpstreamClosed):
    """The upstream server did not answer, or accept a connection, in time: it may hang."""


def parse_hosts(uri: str) -> list[tuple[str, int]]:
    """`mongodb://h1:p1,[::1]:p2,h3/...` -> [(h1, p1), ("::1", p2), (h3, 27017)]: the host list of a
    URI (credentials and options are ignored), split by pymongo's parser (bracketed IPv6 too)."""
    rest = uri.split("://", 1)[-1]
    rest = rest.split("/", 1)[0].split("?", 1)[0]
    return [(host, port or 27017) for host, port in split_hosts(rest.rsplit("@", 1)[-1])]


class UpstreamConnection:
    def __init__(
        self,
        stream: trio.abc.Stream,
        address: str,
        *,
        reply_timeout_s: float | None = None,
        health: HostHealth | None = None,
    ) -> None:
        self._stream = stream
        self.address = address
        # None: wait as long as it takes (a client's connection).
        self.reply_timeout_s = reply_timeout_s
        self._health = health  # told when the host fails this connection, so others are tried first
        self._framer = wire.MessageFramer()
        # Told of each reply of `command` (wireproxy/cluster_time.py), on the connections to mongos.
        self.gossip: ClusterTimeGossip | None = None
        self._ids = itertools.count(1)
        self._lock = trio.Lock()
        self.closed = False
        # While an exhaust getMore streams (its last reply said moreToCome): the requestId the next
        # reply answers, and how long it may take. Nothing else can run on the connection then.
        self._streaming: tuple[int, float] | None = None
        self._piece: bytearray | None = None  # receives in-place replies' pieces (_receive_piece)
        # A reply has begun to arrive and its rest is being received (_receive_rest): the socket
        # may then poll unreadable while some of the rest is in (its low-water mark).
        self._arriving = False

    @property
    def streaming(self) -> bool:
        """An exhaust cursor's batches are still coming: take them with `more_in_place`."""
        return self._streaming is not None

    async def aclose(self) -> None:
        self.closed = True
        await self._close_stream()

    async def _close_stream(self) -> None:
        with trio.move_on_after(1) as scope:
            scope.shield = True
            await self._stream.aclose()

    def _lost(self, error: str, kind: type[UpstreamClosed] = UpstreamClosed) -> UpstreamClosed:
        """The host failed this connection: it is closed for good, and the host's health says so
        (unless the connection was closed on our side first, which says nothing of the host)."""
        if not self.closed and self._health is not None:
            self._health.failed(self.address, error)
        self.closed = True
        return kind(error)

    async def _out_of_step(
        self, error: str, kind: type[UpstreamClosed] = UpstreamClosed
    ) -> UpstreamClosed:
        """`_lost`, for a connection whose socket still works but whose replies no longer match
        its requests (a late answer may still come): the socket is closed too."""
        lost = self._lost(error, kind)
        await self._close_stream()
        return lost

    async def send(self, data: bytes) -> None:
        try:
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise self._lost(f"upstream {self.address}: {exc}") from exc

    async def receive(self) -> wire.Message:
        return await self._receive(self._framer.next_message)

    async def _receive_frame(self, pad: int, allocate: Allocate) -> bytes | bytearray:
        """The next frame, undecoded, and `pad` zero bytes (see MessageFramer.next_frame)."""
        return await self._receive(
            functools.partial(self._framer.next_frame, pad), direct_pad=pad, allocate=allocate
        )

    async def _receive(
        self,
        pull: Callable[[], Any],
        *,
        direct_pad: int | None = None,
        allocate: Allocate = bytearray,
    ) -> Any:
        """What `pull` takes from the framer (a message, or a frame), once it has all it needs.
        With `direct_pad` (`pull` takes frames padded by that much), a large frame (an oplog
        batch) is received over plain TCP into a buffer of its own: one copy of its bytes, where
        receiving chunks and joining them made two; `allocate` makes that buffer."""
        direct = direct_pad is not None and isinstance(self._stream, trio.SocketStream)
        try:
            while True:
                got = pull()
                if got is not wire.NEED_DATA:
                    return got
                if direct and (
                    part := self._framer.frame_buffer(direct_pad or 0, DIRECT_FRAME_BYTES, allocate)
                ):
                    return await self._receive_rest(*part)
                data = await (
                    self._receive_piece() if direct else self._stream.receive_some(1 << 18)
                )
                if not data:
                    raise self._lost(f"upstream {self.address} closed the connection")
                self._framer.receive_data(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ProtocolError) as exc:
            raise self._lost(f"upstream {self.address}: {exc}") from exc

    async def _receive_piece(self) -> bytes:
        """Up to DIRECT_FRAME_BYTES received into a buffer kept for it, and copied out. A small
        frame (a live tail's batch of a few entries) comes whole in one receive; a larger one's
        first piece gives its length, and the rest is received into a buffer of its own
        (`_receive_rest`). Why not pieces of 256 KB: each receive would allocate that much for
        a frame of a few hundred bytes, and a large frame's first piece be copied once more."""
        if self._piece is None:
            self._piece = bytearray(DIRECT_FRAME_BYTES)
        sock = self._stream.socket  # type: ignore[attr-defined]  # (a SocketStream: see _receive)
        n = await sock.recv_into(self._piece)
        return bytes(memoryview(self._piece)[:n])

    async def _receive_rest(self, buffer: bytearray, filled: int, length: int) -> bytearray:
        """A frame received into a buffer of its own (MessageFramer.frame_buffer), which holds
        its first `filled` bytes.

        Reads go to the socket's descriptor itself, waiting only when it has nothing: trio's
        recv_into lets the scheduler run after every read. While the frame's rest has not
        arrived, the socket is woken only once RECEIVE_LOW_WATER_BYTES of it (or all that is
        left) are in (SO_RCVLOWAT): a reply of megabytes arrives in skbs of 64 KB, and a wake-up
        and a read for each cost more than the copy they made. The mark is set back to one byte
        before this returns, so the socket polls readable again at a next reply's first byte
        (`reply_arrived`)."""
        sock = self._stream.socket  # type: ignore[attr-defined]  # (a SocketStream: see _receive)
        fd = sock.fileno()
        view = memoryview(buffer)
        low_water = 1
        self._arriving = True
        try:
            while filled < length:
                try:
                    n = os.readv(fd, (view[filled:length],))
                except BlockingIOError:
                    want = min(length - filled, RECEIVE_LOW_WATER_BYTES)
                    if want != low_water:
                        low_water = _set_low_water(sock, want)
                    await trio.lowlevel.wait_readable(sock)
                    continue
                if not n:
                    raise self._lost(f"upstream {self.address} closed the connection")
                filled += n
        finally:
            self._arriving = False
            if low_water != 1:
                _set_low_water(sock, 1)
        return buffer

    def reply_arrived(self) -> bool:
        """Whether bytes of the next reply have arrived and are not taken yet (or the member
        closed the connection): a poll of the socket, no wait (False where the stream is not a
        plain socket)."""
        if self._framer.buffered or self._arriving:
            return True
        # (poll, not select: select refuses descriptors past FD_SETSIZE, which a busy proxy
        # reaches; Windows has no poll, and no note is held back there.)
        if not isinstance(self._stream, trio.SocketStream) or not hasattr(select, "poll"):
            return False
        poller = select.poll()
        poller.register(self._stream.socket.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    def next_request_id(self) -> int:
        return next(self._ids)

    async def command(
        self,
        db: str,
        cmd: dict[str, Any] | bytes,
        *,
        check: bool = True,
        timeout_s: float = math.inf,
    ) -> RawBSONDocument:
        """Run one command and return its reply; `check` raises MongoError on `{ok: 0}`, and no
        answer within `reply_timeout_s` past the command's maxTimeMS (or within `timeout_s`, if
        sooner) closes the connection and raises UpstreamClosed."""
        msg = await self._exchange(db, cmd, self._limit(cmd, timeout_s), self.receive)
        if not isinstance(msg, wire.OpMsg):
            raise await self._out_of_step(f"upstream {self.address} answered out of turn")
        reply = RawBSONDocument(msg.body, RAW)
        if self.gossip is not None:
            self.gossip.observe(reply)
        if check and not reply.get("ok"):
            raise MongoError.from_reply(bson.decode(msg.body))
        return reply

    async def command_in_place(
        self,
        db: str,
        cmd: dict[str, Any],
        *,
        pad: int,
        exhaust: bool = False,
        allocate: Allocate = bytearray,
    ) -> tuple[bytes | bytearray, int]:
        """`command` for a reply of megabytes (an oplog batch) that the caller reads where it lies:
        (bytes holding the reply document, where it starts in them), going on for `pad` zero bytes
        past the message's end. One copy of the reply, where decoding it and padding it made three.
        A large reply is received into a buffer that `allocate` makes (MessageFramer.frame_buffer).

        With `exhaust` (a getMore) the server may stream the cursor's next batches unasked: while
        `streaming`, `more_in_place` takes each. A server that streams nothing (a mongos before
        7.1) answers once, as to any getMore."""
        limit = self._limit(cmd, math.inf)
        receive = functools.partial(self._receive_frame, pad, allocate)
        frame = await self._exchange(
            db, cmd, limit, receive, flags=wire.FLAG_EXHAUST_ALLOWED if exhaust else 0
        )
        return await self._in_place(frame, pad, limit)

    async def command_in_place_after(
        self,
        before: tuple[str, dict[str, Any]],
        vet: Callable[[RawBSONDocument], Awaitable[None]],
        db: str,
        cmd: dict[str, Any],
        *,
        pad: int,
        allocate: Allocate = bytearray,
    ) -> tuple[bytes | bytearray, int]:
        """`command_in_place` for `cmd`, sent with the command `before` (a database, a command)
        in one round trip: a server answers a connection's messages one at a time, in the order
        they came (its session reads the next message only once it has answered one:
        src/mongo/transport/README.md in mongodb/mongo), so `cmd` runs after `before` as if it
        had been sent once `before` was answered. `before`'s reply, checked as `command`'s, is
        handed to `vet` before `cmd`'s is taken; if either fails (or the wait is cancelled), the
        connection is closed: `cmd`'s answer may still be on its way."""
        limit = self._limit(cmd, math.inf)
        first = bson.encode({**before[1], "$db": before[0]})
        second = bson.encode({**cmd, "$db": db})
        if self._streaming is not None:
            raise RuntimeError("an exhaust cursor streams on this connection: it runs nothing else")
        async with self._lock:
            rids = self.next_request_id(), self.next_request_id()
            try:
                with trio.fail_after(limit):
                    await self.send(
                        wire.encode_op_msg(rids[0], 0, first)
                        + wire.encode_op_msg(rids[1], 0, second)
                    )
                    try:
                        await vet(await self._reply_to(rids[0]))
                    except MongoError:
                        # (best effort: the connection is closed after it either way)
                        with contextlib.suppress(
                            MongoError, ConnectionLost, ProtocolError, trio.BrokenResourceError
                        ):
                            await self._kill_cursor_of(rids[1], db)
                        raise
                    frame = await self._receive_frame(pad, allocate)
            except trio.TooSlowError:
                raise await self._out_of_step(
                    f"upstream {self.address} did not answer {next(iter(cmd))} within {limit:g} s",
                    UpstreamTimeout,
                ) from None
            except BaseException:  # (not the host's failure: its health is not told)
                await self.aclose()
                raise
        await self._answered(frame, rids[1])
        return await self._in_place(frame, pad, limit)

    async def _kill_cursor_of(self, request_id: int, db: str) -> None:
        """Kill the cursor the answer to `request_id` opened, if it opened one: a command sent
        behind one that then failed (`command_in_place_after`) still ran, and what it opened (a
        tailable find's cursor) would otherwise live on the server until its cursor timeout."""
        cursor = (await self._reply_to(request_id)).get("cursor")
        if not cursor or not cursor.get("id"):
            return
        kill = {"killCursors": cursor["ns"].partition(".")[2], "cursors": [cursor["id"]], "$db": db}
        request = self.next_request_id()
        await self.send(wire.encode_op_msg(request, 0, bson.encode(kill)))
        await self._reply_to(request)

    async def _reply_to(self, request_id: int) -> RawBSONDocument:
        """The next message, as `command` returns it: the reply to `request_id`."""
        msg = await self.receive()
        await self._answered(msg, request_id)
        if not isinstance(msg, wire.OpMsg):
            raise await self._out_of_step(f"upstream {self.address} answered out of turn")
        reply = RawBSONDocument(msg.body, RAW)
        if self.gossip is not None:
            self.gossip.observe(reply)
        if not reply.get("ok"):
            raise MongoError.from_reply(bson.decode(msg.body))
        return reply

    async def more_in_place(
        self, *, pad: int, allocate: Allocate = bytearray
    ) -> tuple[bytes | bytearray, int]:
        """The next batch of an exhaust cursor (see `command_in_place`), no request sent."""
        if self._streaming is None:
            raise RuntimeError("no exhaust cursor is streaming on this connection")
        answers, limit = self._streaming
        # Nothing else runs on a streaming connection (`_exchange` refuses): the lock is free,
        # and taken without the scheduler pass `acquire` makes (the receive makes one) for each
        # of a live tail's batches.
        if self._lock.locked():
            await self._lock.acquire()
        else:
            self._lock.acquire_nowait()
        try:
            with trio.move_on_after(limit) as waited:
                frame = await self._receive_frame(pad, allocate)
        finally:
            self._lock.release()
        if waited.cancelled_caught:
            raise await self._out_of_step(
                f"upstream {self.address} sent no batch within {limit:g} s", UpstreamTimeout
            )
        await self._answered(frame, answers)
        return await self._in_place(frame, pad, limit)

    async def _in_place(
        self, frame: bytes | bytearray, pad: int, limit: float
    ) -> tuple[bytes | bytearray, int]:
        """The reply document's place in `frame` (see `command_in_place`); notes whether more
        come."""
        try:
            span = wire.op_msg_body_span(frame)
            if span is None:  # compressed, or in another shape: decoded, then padded
                msg = wire.decode_message(bytes(frame[: len(frame) - pad]))
                if not isinstance(msg, wire.OpMsg):
                    raise await self._out_of_step(f"upstream {self.address} answered out of turn")
                flags, request_id = msg.flags, msg.request_id
                frame, span = msg.body + bytes(pad), (0, len(msg.body))
            else:
                flags, request_id = wire.op_msg_flags(frame), wire.HEADER.unpack_from(frame, 0)[1]
        except ProtocolError as exc:
            raise self._lost(f"upstream {self.address}: {exc}") from exc
        self._streaming = (request_id, limit) if flags & wire.FLAG_MORE_TO_COME else None
        start, end = span
        ok = first_element(frame, b"ok", start)
        # ok is 0 (a double, an int) or false: zero bytes
        if ok is None or not any(frame[ok[1] : ok[2]]):
            raise MongoError.from_reply(bson.decode(frame[start:end]))
        return frame, start

    def _limit(self, cmd: dict[str, Any] | bytes, timeout_s: float) -> float:
        """How long `cmd`'s answer may take: `timeout_s`, or `reply_timeout_s` past its
        maxTimeMS."""
        if self.reply_timeout_s is None:
            return timeout_s
        waits = cmd.get("maxTimeMS", 0) / 1000 if isinstance(cmd, dict) else 0
        return min(timeout_s, self.reply_timeout_s + waits)

    async def _exchange(
        self,
        db: str,
        cmd: dict[str, Any] | bytes,
        limit: float,
        receive: Callable[[], Awaitable[Any]],
        *,
        flags: int = 0,
    ) -> Any:
        """Send the command, and take its answer with `receive` within `limit` seconds (see
        `_limit`): a message or a frame, checked to answer this request."""
        if self._streaming is not None:
            raise RuntimeError("an exhaust cursor streams on this connection: it runs nothing else")
        body = cmd if isinstance(cmd, bytes) else bson.encode({**cmd, "$db": db})
        async with self._lock:
            with trio.move_on_after(limit) as waited:
                rid = self.next_request_id()
                await self.send(wire.encode_op_msg(rid, 0, body, flags=flags))
                got = await receive()
            if waited.cancelled_caught:
                # Its answer may still come: the connection is out of step for good.
                name = next(iter(cmd), "command") if isinstance(cmd, dict) else "command"
                raise await self._out_of_step(
                    f"upstream {self.address} did not answer {name} within {limit:g} s",
                    UpstreamTimeout,
                )
        await self._answered(got, rid)
        return got

    async def _answered(self, got: wire.Message | bytes | bytearray, answers: int) -> None:
        """Check that `got` (a message, or a frame) answers the message `answers`, and note the
        host answered; a connection answered out of turn is closed."""
        response_to = (
            wire.HEADER.unpack_from(got, 0)[2]
            if isinstance(got, bytes | bytearray)
            else got.response_to
        )
        if response_to != answers:
            raise await self._out_of_step(f"upstream {self.address} answered out of turn")
        if self._health is not None:
            self._health.answered(self.address)


def _set_low_water(sock: Any, nbytes: int) -> int:
    """Set the socket's receive low-water mark (SO_RCVLOWAT); the mark it has then (1 where the
    platform refuses it, or the socket is closed: reads then wake at every byte, as before)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
    except (OSError, AttributeError):
        return 1
    return nbytes


async def open_upstream(
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None = None,
    reply_timeout_s: float | None = None,
    health: HostHealth | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    count_losses: bool = True,
) -> UpstreamConnection:
    """A connection to `host`; with `health`, a failure to connect is recorded there, and so are
    the connection's own losses unless `count_losses` is off (a client's connection: mongos may
    close it for what the client sent, which says nothing of mongos)."""
    address = host_address(host, port)
    try:
        with trio.fail_after(connect_timeout_s):
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
            if ssl_context is not None:
                stream = trio.SSLStream(stream, ssl_context, server_hostname=host)
                await stream.do_handshake()
    except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
        timed_out = isinstance(exc, trio.TooSlowError)
        why = f"no answer within {connect_timeout_s:g} s" if timed_out else str(exc)
        error = f"cannot connect to {address}: {why}"
        if health is not None:
            health.failed(address, error)
        raise (UpstreamTimeout if timed_out else UpstreamClosed)(error) from exc
    return UpstreamConnection(
        stream, address, reply_timeout_s=reply_timeout_s, health=health if count_losses else None
    )
