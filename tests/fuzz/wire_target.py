"""The fuzz target shared by tests/unit/test_wire_fuzz.py (hypothesis, in CI) and
tests/fuzz/atheris_wire.py (coverage-guided, long runs): bytes a client sends, through the
framer and the command parsing the proxy and simcluster do next.

`consume(data, cuts)` feeds `data` to a `wire.MessageFramer` in the pieces `cuts` makes, takes
every message out, and puts each through what reads it next: the proxy's `read_command`,
`decoded_command` and `legacy_command`, simcluster's BSON decoding, the in-place body span a
reader uses, and the getMore / killCursors field parsers. The only outcomes allowed are
messages, ProtocolError (the connection closes) and MongoError (an error reply); anything else
escapes as a finding. Memory is checked by the callers: nothing may allocate much more than the
framer's `max_size`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Any

import bson

from mongoformats import wire
from mongoformats.errors import MongoError, ProtocolError
from mongoformats.idl import get_more_request, kill_cursors_ids
from simcluster.server import decode_document, decode_sequence
from wireproxy.router import CommandTable
from wireproxy.session import decoded_command, legacy_command, read_command

# The framer's limit in the fuzz: a frame or a compressed payload may claim up to this much.
LIMIT = 1 << 20
_TABLE = CommandTable()


def pieces(data: bytes, cuts: Iterable[int]) -> Iterator[bytes]:
    at = sorted({min(max(c, 0), len(data)) for c in cuts})
    for a, b in zip([0, *at], [*at, len(data)], strict=True):
        if b > a:
            yield data[a:b]


def consume(data: bytes, cuts: Iterable[int] = ()) -> int:
    """Frame and parse `data`; the number of messages taken before the stream ended or a
    ProtocolError closed it."""
    framer = wire.MessageFramer(max_size=LIMIT)
    taken = 0
    try:
        for piece in [*pieces(data, cuts), b""]:  # b"": the client closes
            framer.receive_data(piece)
            while (msg := framer.next_message()) is not wire.NEED_DATA:
                taken += 1
                _parse(msg)  # type: ignore[arg-type]
    except ProtocolError:
        pass
    _frame_in_place(data)
    return taken


def _parse(msg: wire.Message) -> None:
    """What the proxy and simcluster do with a message they took; MongoError is an error reply."""
    if isinstance(msg, wire.OpQuery):
        legacy_command(msg)
        decode_document(msg.query)
        return
    if not isinstance(msg, wire.OpMsg):
        return  # OP_REPLY from a client: both close the connection on it
    cmd, name, _, _ = read_command(msg, _TABLE, accelerate=True)
    assert isinstance(name, str) and cmd is not None
    decoded = decoded_command(msg)
    decode_document(msg.body)
    for _, docs in msg.sequences:
        decode_sequence(docs)
    try:  # command names are case-sensitive on the server
        if name == "getMore":
            get_more_request(decoded)
        elif name == "killCursors":
            kill_cursors_ids(decoded)
    except MongoError:
        pass


def _frame_in_place(data: bytes) -> None:
    """The reader's path: frames taken undecoded, a plain OP_MSG's body found where it lies."""
    framer = wire.MessageFramer(max_size=LIMIT)
    framer.receive_data(data)
    try:
        while (frame := framer.next_frame(8)) is not wire.NEED_DATA:
            if wire.op_msg_body_span(frame) is None:  # type: ignore[arg-type]
                wire.decode_message(frame[: len(frame) - 8], max_size=LIMIT)  # type: ignore[index]
    except ProtocolError:
        pass


# -- seeds: valid frames of every kind, and the hostile ones found so far -------------------------


def _bad_string(length: int) -> bytes:
    """{a: "hello world!"} whose string states `length` bytes."""
    return (
        struct.pack("<i", 25) + b"\x02a\x00" + struct.pack("<i", length) + b"hello world!\x00\x00"
    )


def _compressed(inner: bytes, compressor: str, declared: int | None = None) -> bytes:
    frame = wire.compress(inner, compressor)
    if declared is None:
        return frame
    return frame[:20] + struct.pack("<i", declared) + frame[24:]


def seeds() -> list[bytes]:
    body = bson.encode({"find": "c", "filter": {"x": {"$gt": 1}}, "$db": "test"})
    docs = (bson.encode({"_id": 1}), bson.encode({"_id": 2, "s": "x" * 40}))
    get_more = bson.encode(
        {"getMore": bson.Int64(5), "collection": "c", "batchSize": 2, "$db": "t"}
    )
    kill = bson.encode({"killCursors": "c", "cursors": [bson.Int64(5)], "$db": "t"})
    hello = bson.encode({"hello": 1, "helloOk": True, "compression": ["zlib"], "$db": "admin"})
    insert = wire.encode_op_msg(
        2, 0, bson.encode({"insert": "c", "$db": "t"}), sequences=(("documents", docs),)
    )
    out = [
        wire.encode_op_msg(1, 0, body),
        insert,
        wire.encode_op_msg(3, 0, get_more, flags=wire.FLAG_EXHAUST_ALLOWED),
        wire.encode_op_msg(4, 0, kill, flags=wire.FLAG_CHECKSUM_PRESENT),
        wire.encode_op_msg(5, 0, hello, flags=wire.FLAG_MORE_TO_COME),
        wire.encode_op_query(6, "admin.$cmd", bson.encode({"isMaster": 1})),
        wire.encode_op_reply(7, 6, docs),
        wire.HEADER.pack(46, 8, 0, wire.OP_MSG) + bytes(5) + _bad_string(0x7FFFFFFF),
    ]
    for comp in ("zlib", "snappy", "zstd", "noop"):
        out.append(_compressed(insert, comp))
        out.append(_compressed(insert, comp, declared=len(insert) - 16 + 1))  # a lying size
    # Inflates past the limit.
    bomb = wire.encode_op_msg(9, 0, bson.encode({"pad": bytes(8 * LIMIT)}))
    out.append(_compressed(bomb, "zstd", declared=40))
    out.append(_compressed(bomb, "snappy", declared=40))
    return out


SEEDS = seeds()
# Values that land on a length or size field and make it lie.
INTERESTING_INT32 = [
    0,
    1,
    4,
    5,
    16,
    20,
    21,
    -1,
    -16,
    0x7FFFFFFF,
    -0x80000000,
    LIMIT,
    LIMIT + 1,
    wire.MAX_MESSAGE_SIZE,
    wire.MAX_MESSAGE_SIZE + 1,
]


def mutate(seed: bytes, edits: list[tuple[int, int, Any]]) -> bytes:
    """`seed` with each edit (kind, position, value) applied: 0 flips a byte, 1 writes an
    interesting int32, 2 cuts the frame there, 3 inserts bytes there."""
    data = bytearray(seed)
    for kind, pos, value in edits:
        if not data:
            break
        pos %= len(data)
        if kind == 0:
            data[pos] ^= (value % 255) + 1
        elif kind == 1:
            data[pos : pos + 4] = struct.pack(
                "<i", INTERESTING_INT32[value % len(INTERESTING_INT32)]
            )
        elif kind == 2:
            del data[pos:]
        else:
            data[pos:pos] = bytes([value % 256]) * (value % 7 + 1)
    return bytes(data)
