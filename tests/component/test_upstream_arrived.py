"""An upstream connection's receives, over a socket pair standing in for a shard member's
connection: whether its next reply has arrived (UpstreamConnection.reply_arrived, a poll that
a shard's reader makes before writing a note, buckets/reader.py), and how a reply taken in
place is received."""

from __future__ import annotations

from typing import Any

import bson
import pytest
import trio
import trio.testing

from mongoformats import wire
from wireproxy.upstream import DIRECT_FRAME_BYTES, UpstreamConnection

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
