"""An upstream connection's receives, over a socket pair standing in for a shard member's
connection: whether its next reply has arrived (UpstreamConnection.reply_arrived, a poll that
a shard's reader makes before writing a note, buckets/reader.py), and how a reply taken in
place is received."""

from __future__ import annotations

import socket
from typing import Any

import bson
import pytest
import trio
import trio.testing

from mongoformats import wire
from wireproxy.upstream import DIRECT_FRAME_BYTES, UpstreamClosed, UpstreamConnection

FRAME = wire.encode_op_msg(7, 1, bson.encode({"ok": 1.0}))


async def test_a_reply_counts_as_arrived_from_its_first_byte_until_it_is_taken() -> None:
    ours, theirs = trio.socket.socketpair()
    conn = UpstreamConnection(trio.SocketStream(ours), "member:27018")
    member = trio.SocketStream(theirs)
    assert not conn.reply_arrived()
    await member.send_all(FRAME[:3])
    assert conn.reply_arrived()  # in the socket
    await member.send_all(FRAME[3:] + FRAME[:10])
    assert isinstance(await conn.receive(), wire.OpMsg)
    assert conn.reply_arrived()  # the next one's first bytes, taken from the socket already
    await member.send_all(FRAME[10:])
    assert isinstance(await conn.receive(), wire.OpMsg)
    assert not conn.reply_arrived()
    await conn.aclose()
    await member.aclose()


async def test_a_stream_that_is_not_a_socket_never_says_a_reply_arrived() -> None:
    """(TLS: its bytes may be buffered inside the TLS object; no note is held back then.)"""
    ours, theirs = trio.testing.memory_stream_pair()
    conn = UpstreamConnection(ours, "member:27018")
    await theirs.send_all(FRAME)
    assert not conn.reply_arrived()


def _counting_receives(sock: Any) -> list[int]:
    """Count the receives made on the trio socket `sock` (their sizes asked)."""
    asked: list[int] = []
    recv, recv_into = sock.recv, sock.recv_into

    async def counted_recv(size: int, *args: Any) -> bytes:
        asked.append(size)
        return await recv(size, *args)

    async def counted_recv_into(buffer: Any, *args: Any) -> int:
        asked.append(len(buffer))
        return await recv_into(buffer, *args)

    sock.recv, sock.recv_into = counted_recv, counted_recv_into
    return asked


@pytest.mark.parametrize("entries", [1, 30_000])
async def test_a_batch_taken_in_place_costs_one_receive_if_small(entries: int) -> None:
    """A live tail's replies hold a few entries: one comes whole in one receive of a buffer kept
    for it (no allocation of a large buffer a reply), and its bytes are those sent, followed by
    the room asked for. A reply of megabytes still gets a buffer of its own."""
    reply = bson.encode({"cursor": {"nextBatch": [{"i": i} for i in range(entries)]}, "ok": 1.0})
    ours, theirs = trio.socket.socketpair()
    conn = UpstreamConnection(trio.SocketStream(ours), "member:27018")
    member = trio.SocketStream(theirs)
    asked = _counting_receives(ours)

    async def answer() -> None:
        framer = wire.MessageFramer()
        while (msg := framer.next_message()) is wire.NEED_DATA:
            framer.receive_data(await member.receive_some())
        await member.send_all(wire.encode_op_msg(2, msg.request_id, reply))  # type: ignore[union-attr]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        data, at = await conn.command_in_place("local", {"getMore": 1}, pad=16)
    assert bytes(data[at : at + len(reply) + 16]) == reply + bytes(16)
    if entries == 1:
        assert asked == [DIRECT_FRAME_BYTES]
    else:
        assert len(reply) > DIRECT_FRAME_BYTES and isinstance(data, bytearray)
    await conn.aclose()
    await member.aclose()


def _low_water(sock: Any) -> int:
    return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))


def _large_reply(entries: int = 3000) -> bytes:
    """A getMore's reply of some 700 KB, ok: 1."""
    batch = [{"i": i, "s": "x" * 200} for i in range(entries)]
    return bson.encode({"cursor": {"nextBatch": batch}, "ok": 1.0})


async def _answer_getmore(member: trio.SocketStream, reply: bytes, pieces: int) -> None:
    """Answer the next request with `reply` (ok: 1 after it), sent in `pieces` parts with a
    pause between them, so that the reader waits for the rest of it several times."""
    framer = wire.MessageFramer()
    while (msg := framer.next_message()) is wire.NEED_DATA:
        framer.receive_data(await member.receive_some())
    frame = wire.encode_op_msg(2, msg.request_id, reply)  # type: ignore[union-attr]
    step = -(-len(frame) // pieces)
    for at in range(0, len(frame), step):
        await member.send_all(frame[at : at + step])
        await trio.sleep(0.01)


@pytest.mark.skipif(not hasattr(socket, "SO_RCVLOWAT"), reason="no SO_RCVLOWAT here")
async def test_a_large_reply_in_parts_is_whole_and_the_low_water_mark_set_back() -> None:
    """A reply of megabytes is received from the socket's descriptor, the socket waited on with
    its receive low-water mark raised to what is left of the reply (the reply counts as arrived
    meanwhile); once the reply is whole the mark is one byte again, so the socket polls readable
    at the next reply's first byte."""
    body = _large_reply()
    ours, theirs = trio.socket.socketpair()
    conn = UpstreamConnection(trio.SocketStream(ours), "member:27018")
    member = trio.SocketStream(theirs)
    marks: list[int] = []

    seen: list[bool] = []  # reply_arrived() while the mark is raised

    async def watch_mark() -> None:
        while True:
            marks.append(_low_water(ours))
            if marks[-1] > 1:
                seen.append(conn.reply_arrived())
            await trio.sleep(0.002)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_answer_getmore, member, body, 20)
        nursery.start_soon(watch_mark)
        data, at = await conn.command_in_place("local", {"getMore": 1}, pad=16)
        nursery.cancel_scope.cancel()
    assert bytes(data[at : at + len(body) + 16]) == body + bytes(16)
    assert max(marks) > 1  # raised while the rest was awaited
    assert seen and all(seen)  # the reply has begun to arrive, whatever the socket polls
    assert _low_water(ours) == 1
    await member.send_all(FRAME[:1])
    assert conn.reply_arrived()
    await conn.aclose()
    await member.aclose()


async def test_a_reply_cut_short_closes_the_connection_a_cancelled_wait_resets_the_mark() -> None:
    frame = wire.encode_op_msg(2, 1, _large_reply())

    async def send_a_third(member: trio.SocketStream, then_close: bool) -> None:
        await member.send_all(frame[: len(frame) // 3])
        if then_close:
            await trio.sleep(0.05)
            await member.aclose()

    for then_close in (False, True):
        ours, theirs = trio.socket.socketpair()
        conn = UpstreamConnection(trio.SocketStream(ours), "member:27018")
        member = trio.SocketStream(theirs)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_a_third, member, then_close)
            if then_close:  # the member closes the connection in the middle of a reply
                with trio.fail_after(5), pytest.raises(UpstreamClosed):
                    await conn.command_in_place("local", {"getMore": 1}, pad=16)
                assert conn.closed
            else:  # cancelled while the rest of the reply is awaited: the mark is set back
                with trio.move_on_after(0.2) as waited:
                    await conn.command_in_place("local", {"getMore": 1}, pad=16)
                assert waited.cancelled_caught
                if hasattr(socket, "SO_RCVLOWAT"):
                    assert _low_water(ours) == 1
        await conn.aclose()
        await member.aclose()
