"""The proxy's scatter-gather send (wireproxy.scatter_send.send_pieces) over an in-process socket
pair with small buffers and a slow reader: partial writes, and a closed peer."""

from __future__ import annotations

import socket
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import trio

from mongoformats import wire
from tests.unit.test_event_block import block_of_inserts
from wireproxy.scatter_send import send_pieces as _send_pieces


async def test_a_reply_in_pieces_arrives_whole_through_partial_writes_and_a_closed_peer_breaks():
    """Scatter-gather sends (a reply's pieces, unjoined) over a socket whose buffers are small and
    whose reader is slow: every write is partial, often in the middle of a piece. A batch of
    events (a deferred piece) is gathered into the connection's buffer a part at a time, here a
    buffer smaller than one event, and one that holds a few."""
    events = block_of_inserts([(7, i) for i in range(1, 301)], [i % 3 for i in range(300)])
    pieces = [
        b"head",
        b"",
        events.array_body(0),
        memoryview(bytes(range(256)) * 3000),
        pa.py_buffer(b"x" * 1_000_001),
        events.sliced(5, 300).array_body(12),
        memoryview(np.arange(50_000, dtype=np.int64)),
        memoryview(np.arange(7, dtype=np.int64)),  # small pieces of any kind are joined
        pa.py_buffer(b"small"),
        b"tail",
    ]
    want = wire.joined(pieces)
    assert want.count(bytes(events.array_body(0))) == 1
    scratch = np.empty(300, np.uint8)
    a, b = trio.socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sender, receiver = trio.SocketStream(a), trio.SocketStream(b)
    got = bytearray()

    async def read_slowly() -> None:
        while len(got) < len(want):
            got.extend(await receiver.receive_some(50_000))
            await trio.sleep(0.001)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_slowly)
        await _send_pieces(sender, pieces, lambda: scratch)
    assert bytes(got) == want
    got.clear()
    scratch = np.empty(4000, np.uint8)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_slowly)
        await _send_pieces(sender, pieces, lambda: scratch)
    assert bytes(got) == want
    await receiver.aclose()
    with pytest.raises(trio.BrokenResourceError):
        for _ in range(100):
            await _send_pieces(sender, pieces, lambda: scratch)
    await sender.aclose()


async def test_a_reply_of_more_pieces_than_one_write_takes_arrives_whole() -> None:
    """A message of more pieces than a scatter-gather write takes (IOV_MAX, 1024 on Linux) is
    written a group of pieces at a time, unjoined: it arrives whole and in order."""
    pieces = [b"%05d;" % i for i in range(3000)]
    want = b"".join(pieces)
    a, b = trio.socket.socketpair()
    sender, receiver = trio.SocketStream(a), trio.SocketStream(b)
    got = bytearray()

    async def read_all() -> None:
        while len(got) < len(want):
            got.extend(await receiver.receive_some(50_000))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_all)
        await _send_pieces(sender, pieces, lambda: np.empty(16, np.uint8))
    assert bytes(got) == want
    await sender.aclose()
    await receiver.aclose()


async def test_a_small_reply_arrives_whole_joined_or_with_a_deferred_batch() -> None:
    """A reply of small pieces goes in one write of their join; one with a deferred piece (a
    batch of events, which a join refuses) the piece-by-piece way: both arrive as the joined
    pieces."""
    events = block_of_inserts([(7, i) for i in range(1, 3)], [0, 1])
    plain = [b"head", memoryview(b"ab"), pa.py_buffer(b"cd"), bytearray(b"ef"), b"", b"tail"]
    deferred = [b"head", events.array_body(0), b"tail"]
    a, b = trio.socket.socketpair()
    sender, receiver = trio.SocketStream(a), trio.SocketStream(b)
    for pieces in (plain, deferred, plain):
        want = wire.joined(pieces)
        assert len(want) < 4096
        await _send_pieces(sender, pieces, lambda: np.empty(1 << 16, np.uint8))
        got = bytearray()
        while len(got) < len(want):
            got.extend(await receiver.receive_some(50_000))
        assert bytes(got) == want
    await sender.aclose()
    await receiver.aclose()


@pytest.mark.parametrize("waits", [False, True])
async def test_a_large_reply_lets_other_tasks_run_once_per_yield_budget(
    monkeypatch: pytest.MonkeyPatch, waits: bool
) -> None:
    """A reply's deferred batch is sent a part at a time; other tasks run once the sender has
    written YIELD_AFTER_BYTES without a wait (not between every two parts: a consumer that keeps
    up got a part per round of a busy loop), and not at all more when every write waited for the
    socket (they ran then)."""
    from wireproxy import scatter_send

    events = block_of_inserts([(7, i) for i in range(1, 301)], [i % 3 for i in range(300)])
    pieces = [b"head", events.array_body(0), b"tail"]
    total = len(wire.joined(pieces))
    monkeypatch.setattr(scatter_send, "YIELD_AFTER_BYTES", 2000)
    writes: list[int] = []

    async def written(stream: Any, views: list[memoryview]) -> bool:
        writes.append(sum(map(len, views)))
        views.clear()
        return waits

    monkeypatch.setattr(scatter_send, "_send_views", written)
    ticks = 0

    async def other_task() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        await trio.lowlevel.checkpoint()  # (it has started)
        before = ticks
        await _send_pieces(None, pieces, lambda: np.empty(300, np.uint8))  # type: ignore[arg-type]
        ran = ticks - before
        nursery.cancel_scope.cancel()
    assert sum(writes) == total and len(writes) > 100  # a part (an event) a write, and the tail
    budget_spent = 0
    yields = 0
    for size in writes[:-1]:  # (the tail's write follows the batch's parts)
        if budget_spent >= 2000:
            yields, budget_spent = yields + 1, 0
        budget_spent += size
    assert 0 < yields < len(writes) // 4  # (events of ~400 bytes: a yield per six)
    # (±1: trio runs a round's tasks in either order, so the other task's last turn may fall on
    # either side of the send's end)
    assert abs(ran - (0 if waits else yields)) <= 1
