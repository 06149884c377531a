"""The reader processes' message stream, on a real socket pair."""

from __future__ import annotations

import pytest
import trio
from bson import Timestamp

from buckets import reader_channel
from buckets._columnar.items import as_fields
from buckets.reader_channel import MessageStream
from tests.unit.test_event_block import block_of_inserts


def _connected_pair() -> tuple[MessageStream, MessageStream]:
    """Two ends of one message stream, on a real socket pair."""
    left, right = trio.socket.socketpair()
    return MessageStream(trio.SocketStream(left)), MessageStream(trio.SocketStream(right))


async def test_a_send_cancelled_midway_still_sends_its_whole_message():
    """A tail stopped while it sends a batch (its stream closed) must not leave half a message on
    the connection its process shares with every other tail: the next message would be read out
    of step, and every stream of the process would fail."""
    sender, receiver = _connected_pair()
    big = b"x" * (64 << 20)  # far more than the socket buffers hold: the send blocks part-way
    got = []

    async def receive_later() -> None:
        await trio.sleep(0.5)  # the send is cancelled meanwhile
        with trio.fail_after(20):
            got.append(await receiver.receive())
            got.append(await receiver.receive())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive_later)
        with trio.move_on_after(0.2):
            await sender.send(("batch", 1, big))
        await sender.send(("idle", 2))
    assert got == [("batch", 1, big), ("idle", 2)]
    await sender.stream.aclose()
    await receiver.stream.aclose()


async def test_a_send_the_other_process_never_takes_breaks_the_connection(monkeypatch):
    """A process that stops reading is hung: after SEND_TIMEOUT_S the connection is closed (its
    tails fail and resume from their tokens) instead of waiting forever or leaving half a
    message."""
    monkeypatch.setattr(reader_channel, "SEND_TIMEOUT_S", 0.3)
    sender, receiver = _connected_pair()  # the receiver never reads
    with pytest.raises(trio.BrokenResourceError), trio.fail_after(5):
        await sender.send(("batch", 1, b"x" * (64 << 20)))
    with pytest.raises(trio.ClosedResourceError):
        await sender.send(("idle", 2))
    await receiver.stream.aclose()


async def test_batches_go_as_marshal_and_other_messages_as_pickles():
    """Spliced events (tuples of bytes and str) take the fast format; a message holding another
    type (a transaction's event keeps a Timestamp) falls back to pickle; both arrive equal."""
    spliced = (b"\x82sort", b"", "insert", "db", "c", b"\x05\x00\x00\x00\x00", ("db.c",), "", None)
    in_txn = (*spliced[:8], (Timestamp(5, 1), 0))
    batch = ("batch", 1, [spliced], 5, 1, (5, 1))
    assert reader_channel.encode_message(batch)[0] == reader_channel._MARSHAL
    assert (
        reader_channel.encode_message(("batch", 1, [in_txn], 5, 1, (5, 1)))[0]
        == reader_channel._PICKLE
    )
    sender, receiver = _connected_pair()
    for message in (batch, ("batch", 1, [spliced, in_txn], 10, 2, (5, 1)), ("credit", {1: 5})):
        await sender.send(message)
        assert await receiver.receive() == message
    # A block's columns go out of band, after the pickle: the same events arrive.
    block = block_of_inserts([(7, i) for i in range(1, 201)], [i % 3 for i in range(200)])
    await sender.send(("batch", 1, [block.sliced(5, 150), spliced], 10, 2, (5, 1)))
    got = await receiver.receive()
    assert as_fields(got[2]) == [*block.sliced(5, 150).fields(), spliced]
    await sender.stream.aclose()
    await receiver.stream.aclose()
