"""Whether an upstream connection's next reply has arrived (UpstreamConnection.reply_arrived):
a poll, no wait, which a shard's reader asks before writing a note (buckets/reader.py). Over a
socket pair standing in for the member's connection."""

from __future__ import annotations

import bson
import trio
import trio.testing

from mongoformats import wire
from wireproxy.upstream import UpstreamConnection

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
