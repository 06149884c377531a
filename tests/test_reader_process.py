"""The reader processes' message stream, on a real socket pair."""

from __future__ import annotations

import trio

from buckets.reader_process import MessageStream


async def test_a_send_cancelled_midway_still_sends_its_whole_message():
    """A tail stopped while it sends a batch (its stream closed) must not leave half a message on
    the connection its process shares with every other tail: the next message would be read out
    of step, and every stream of the process would fail."""
    left, right = trio.socket.socketpair()
    sender, receiver = MessageStream(trio.SocketStream(left)), MessageStream(trio.SocketStream(right))
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
