"""The channel between the proxy and a reader process: length-prefixed messages on a socket."""

from __future__ import annotations

import marshal
import pickle
import struct
from typing import Any

import trio

from buckets._columnar.allocator import unfilled_bytearray

_HEADER = struct.Struct("<IB")  # body length, body format (_MARSHAL or _PICKLE)


_MARSHAL, _PICKLE = 0, 1


SOCKET_BUFFER_BYTES = 4 << 20  # asked of the kernel; it may grant less (net.core.wmem_max)


SEND_TIMEOUT_S = 60.0  # a message not taken this long means the other process hangs


def encode_message(message: Any) -> tuple[int, list[Any]]:
    """(format, the pieces of the body) of a message: marshal when it holds only builtin values,
    else pickle, whose out-of-band buffers (an EventBlock's columns) follow the pickle as they are.

    Why marshal first: a batch of spliced events as tuples (the general path's) is tuples of
    bytes and str, and marshal writes it in two thirds of pickle's time. Both ends are the same
    interpreter (trio_parallel starts this one), the one condition marshal sets. A message with
    another type in it (an EventBlock, a tail to add, a transaction's event with its Timestamp)
    makes marshal raise at once and goes as a pickle. One difference remains: marshal reads any
    bytes-like value back as plain bytes (a bson.Binary too); no message holds one where its type
    matters.

    Why out of band: a block's columns (hundreds of KB) copied into the pickle cost a fresh
    reply-sized allocation that faults in page by page; sent as they are, the socket copies
    them once. Layout of a pickle's body: the count of buffers and each one's size
    (u32, then u64 each), the pickle, the buffers.
    """
    try:
        return _MARSHAL, [marshal.dumps(message)]
    except ValueError:
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
        views = [b.raw() for b in buffers]
        table = struct.pack(f"<I{len(views)}Q", len(views), *(v.nbytes for v in views))
        return _PICKLE, [table, data, *views]


def decode_message(fmt: int, body: bytes | bytearray | memoryview) -> Any:
    if fmt == _MARSHAL:
        return marshal.loads(body)
    view = memoryview(body)
    (count,) = struct.unpack_from("<I", view)
    sizes = struct.unpack_from(f"<{count}Q", view, 4)
    at = len(view) - sum(sizes)
    data = view[4 + 8 * count : at]
    buffers = []
    for size in sizes:
        buffers.append(view[at : at + size])
        at += size
    return pickle.loads(data, buffers=buffers)


class MessageStream:
    """Length-prefixed messages over a connected socket; sends are serialized, receives are one
    reader's. A message is received straight into a buffer of its size (`recv_into`): a batch of
    events is large, and reading it in pieces and joining them cost a copy per piece."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self._send_lock = trio.StrictFIFOLock()
        for option in (trio.socket.SO_SNDBUF, trio.socket.SO_RCVBUF):  # fewer wake-ups per batch
            stream.setsockopt(trio.socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)

    async def send(self, message: Any) -> None:
        """Send one message whole, even if the caller is cancelled meanwhile.

        Why shielded: a send cancelled part-way leaves half a message on the socket, and the other
        side then reads the rest of the stream out of step. That broke every stream of the
        process, not just the one whose tail was stopped (a stream closing while its tail was
        sending a batch). The other side is our own process, which always reads on, so the send
        ends soon; if that process is gone, the socket is broken and the send fails at once. One
        that stops reading for SEND_TIMEOUT_S is taken for hung: the connection is closed (which
        fails that process's tails) rather than left with half a message.
        """
        fmt, pieces = encode_message(message)
        async with self._send_lock:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(SEND_TIMEOUT_S):
                    await self.stream.send_all(
                        _HEADER.pack(sum(memoryview(p).nbytes for p in pieces), fmt)
                    )
                    for piece in pieces:
                        await self.stream.send_all(piece)
                    return
                await self.stream.aclose()
        raise trio.BrokenResourceError(f"the other process read nothing for {SEND_TIMEOUT_S:.0f} s")

    async def receive(self) -> Any:
        """The next message, or None once the other side has closed."""
        header = await self._exactly(_HEADER.size)
        if header is None:
            return None
        size, fmt = _HEADER.unpack(header)
        body = await self._exactly(size)
        return None if body is None else decode_message(fmt, body)

    async def _exactly(self, n: int) -> memoryview | None:
        # Unzeroed memory: zeroing it first would be a pass over every batch's bytes that the
        # receive then overwrites.
        view, got = memoryview(unfilled_bytearray(n)), 0
        while got < n:
            k = await self.stream.socket.recv_into(view[got:], n - got)
            if not k:
                return None
            got += k
        return view
