"""A message sent from its pieces where they lie: scatter-gather writes straight to the socket,
small pieces joined first, a deferred piece (a reply's batch of events) made a part at a time."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import trio

from mongoformats import wire

__all__ = ["send_pieces"]

# Pieces one scatter-gather write takes at most (Linux's IOV_MAX is 1024); a message of more is
# written a group of pieces at a time.
_MAX_PIECES = 512
# Pieces smaller than this are joined before they are sent: a reply's envelope is a dozen pieces
# of a few bytes each (its header, names, lengths), each costing a buffer view and an entry of
# the write more than its copy.
_JOIN_BELOW = 4096
# Bytes of a reply written without a wait before the sender lets other tasks run. A reply of
# megabytes is made a part at a time (session.SEND_PART_BYTES); other tasks once ran between any
# two parts, and while a catch-up's shards' batches are spliced on the loop a round of it lasts
# milliseconds: consumers got their replies a part per round, at a fraction of what the socket
# takes, and most events reached them only at the end of a backlog. A write that has to wait for
# the socket lets them run anyway; this bounds how long a consumer that keeps up holds the loop
# (about a millisecond: writes to a local socket go at gigabytes a second).
YIELD_AFTER_BYTES = 2 << 20


async def send_pieces(
    stream: trio.SocketStream, pieces: list[Any], scratch: Callable[[], Any]
) -> None:
    """`stream.send_all(b"".join(pieces))` without the join: scatter-gather writes from the
    pieces where they lie (small ones joined first), again from where a partial write stopped; a
    deferred piece (wire.DeferredPiece) is made part by part into the buffer `scratch()` gives,
    each part sent before the next is made. Errors are SocketStream's (BrokenResourceError), so
    callers see one kind of failure either way. Only one task sends on a client connection (its
    session's loop), so no send can interleave."""
    views: list[memoryview] = []
    small: list[Any] = []
    try:
        await trio.lowlevel.checkpoint_if_cancelled()
        joined = _joined_if_small(pieces)
        if joined is not None:  # a small reply (a live tail's getMore): one write of one join
            await _send_views(stream, [memoryview(joined)])
            return
        unyielded = 0  # bytes written since this task last let others run
        for piece in pieces:
            if isinstance(piece, wire.DeferredPiece):
                _add_joined(views, small)
                for part in piece.pieces(scratch()):
                    if unyielded >= YIELD_AFTER_BYTES:
                        await trio.lowlevel.checkpoint()
                        unyielded = 0
                    views.append(memoryview(part).cast("B"))
                    size = sum(map(len, views))
                    unyielded = 0 if await _send_views(stream, views) else unyielded + size
            elif len(piece) < _JOIN_BELOW:
                small.append(piece)
            else:
                _add_joined(views, small)
                views.append(memoryview(piece).cast("B"))
        _add_joined(views, small)
        await _send_views(stream, views)
    except OSError as exc:
        raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc


def _joined_if_small(pieces: list[Any]) -> bytes | None:
    """The pieces joined, if they are all small and none is deferred (a join refuses one)."""
    if sum(map(len, pieces)) >= _JOIN_BELOW:
        return None
    try:
        return b"".join(pieces)
    except TypeError:
        return None


def _add_joined(views: list[memoryview], small: list[Any]) -> None:
    """The small pieces gathered so far as one view, emptying the list."""
    if small:
        views.append(memoryview(small[0] if len(small) == 1 else b"".join(small)).cast("B"))
        small.clear()


async def _send_views(stream: trio.SocketStream, views: list[memoryview]) -> bool:
    """Send all of `views` with scatter-gather writes, emptying the list; whether it had to wait
    (other tasks ran meanwhile). The writes go to the socket's descriptor itself, waiting only
    when its buffer is full: trio's sendmsg yields to the scheduler after every write, a round of
    the event loop per write of a reply."""
    fd = stream.socket.fileno()
    waited = False
    while views:
        try:
            sent = os.writev(fd, views[:_MAX_PIECES] if len(views) > _MAX_PIECES else views)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(stream.socket)
            waited = True
            continue
        done = 0
        while done < len(views) and sent >= len(views[done]):
            sent -= len(views[done])
            done += 1
        del views[:done]
        if sent:
            views[0] = views[0][sent:]
    return waited
