"""MongoDB wire messages: OP_MSG, the legacy OP_QUERY/OP_REPLY handshake pair, OP_COMPRESSED.

Strategy: sans-IO. `MessageFramer.receive_data(bytes)` buffers; `next_message()` returns one
decoded message or `NEED_DATA`; `next_frame(pad)` and `op_msg_body_span` leave a large reply
undecoded, its body read where it lies. Encoders are plain functions returning bytes. BSON
payloads are never decoded here: they stay `bytes` (the caller wraps them in `RawBSONDocument` when
it needs a field), so a pass-through proxy copies bytes and nothing else.

Spec: https://github.com/mongodb/specifications/blob/master/source/message/OP_MSG.md and
https://www.mongodb.com/docs/manual/reference/mongodb-wire-protocol/ (header, OP_QUERY, OP_REPLY,
OP_COMPRESSED). Limits follow pymongo's receive_message: 16 < length <= maxMessageSizeBytes.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import crc32c

from mongoformats.compression import COMPRESSOR_IDS, COMPRESSOR_NAMES, compressed, decompress
from mongoformats.errors import ProtocolError
from mongoformats.wire_pieces import ArrayRun, DeferredPiece, joined

__all__ = [
    "NEED_DATA",
    "OP_MSG",
    "OP_QUERY",
    "OP_REPLY",
    "OP_COMPRESSED",
    "FLAG_CHECKSUM_PRESENT",
    "FLAG_MORE_TO_COME",
    "FLAG_EXHAUST_ALLOWED",
    "MAX_MESSAGE_SIZE",
    "MAX_BSON_SIZE",
    "MAX_INTERNAL_BSON_SIZE",
    "COMPRESSOR_IDS",
    "OpMsg",
    "OpQuery",
    "OpReply",
    "Message",
    "MessageFramer",
    "encode_op_msg",
    "op_msg_parts",
    "encode_op_reply",
    "encode_op_query",
    "compress",
    "decode_message",
    "op_msg_body_span",
    "op_msg_flags",
    "ArrayRun",
    "DeferredPiece",
    "joined",
]

OP_REPLY: Final = 1
OP_QUERY: Final = 2004
OP_COMPRESSED: Final = 2012
OP_MSG: Final = 2013

FLAG_CHECKSUM_PRESENT: Final = 1 << 0
FLAG_MORE_TO_COME: Final = 1 << 1
FLAG_EXHAUST_ALLOWED: Final = 1 << 16
# Bits 0-15 are "required": a receiver must reject unknown ones (OP_MSG.md, flagBits).
_KNOWN_REQUIRED_FLAGS: Final = FLAG_CHECKSUM_PRESENT | FLAG_MORE_TO_COME

MAX_MESSAGE_SIZE: Final = 48_000_000
MAX_BSON_SIZE: Final = 16 * 1024 * 1024
# BSONObjMaxInternalSize: what the server lets a document it builds or reads reach (a command
# sent with its payload, a change event), the user limit plus room for its own fields.
MAX_INTERNAL_BSON_SIZE: Final = MAX_BSON_SIZE + 16 * 1024
# A cursor batch must leave room for its reply envelope, and every array element costs a type
# byte and its index key on top of the document: batches are cut with this rule.
BATCH_BYTES_LIMIT: Final = MAX_BSON_SIZE - 16 * 1024
BATCH_ELEMENT_OVERHEAD: Final = 9
HEADER = struct.Struct("<iiii")  # messageLength, requestID, responseTo, opCode
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


@dataclass(frozen=True, slots=True)
class OpMsg:
    """OP_MSG. `body` is the raw kind-0 BSON document; `sequences` maps identifier -> raw
    documents."""

    request_id: int
    response_to: int
    flags: int
    body: bytes
    sequences: tuple[tuple[str, tuple[bytes, ...]], ...] = ()
    # The compressor the message arrived with ("zlib", ...), so a reply can use the same one.
    compressor: str | None = None

    @property
    def more_to_come(self) -> bool:
        return bool(self.flags & FLAG_MORE_TO_COME)

    @property
    def exhaust_allowed(self) -> bool:
        return bool(self.flags & FLAG_EXHAUST_ALLOWED)


@dataclass(frozen=True, slots=True)
class OpQuery:
    """Legacy OP_QUERY: accepted only for the first `isMaster`/`hello` of old drivers and
    mongosh."""

    request_id: int
    response_to: int
    flags: int
    full_collection_name: str
    number_to_skip: int
    number_to_return: int
    query: bytes
    fields: bytes | None = None
    compressor: str | None = None


@dataclass(frozen=True, slots=True)
class OpReply:
    request_id: int
    response_to: int
    response_flags: int
    cursor_id: int
    starting_from: int
    documents: tuple[bytes, ...] = field(default=())
    compressor: str | None = None


Message = OpMsg | OpQuery | OpReply


# ---------------------------------------------------------------------------------------------
# decoding (pure functions over one complete message)


def _bson_at(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[bytes, int]:
    """The BSON document starting at `pos`, checked against the frame end; returns (doc,
    next_pos)."""
    stop = _bson_end(buf, pos, end)
    return bytes(buf[pos:stop]), stop


def _bson_end(buf: bytes | bytearray | memoryview, pos: int, end: int) -> int:
    """Where the BSON document starting at `pos` ends, checked against the frame end."""
    if end - pos < 5:
        raise ProtocolError("truncated BSON document")
    (size,) = _I32.unpack_from(buf, pos)
    if size < 5 or pos + size > end or size > MAX_INTERNAL_BSON_SIZE:
        raise ProtocolError(f"invalid BSON document length {size}")
    if buf[pos + size - 1] != 0:
        raise ProtocolError("BSON document is not NUL-terminated")
    return pos + size


def _cstring_at(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[str, int]:
    raw = bytes(buf[pos:end])
    nul = raw.find(b"\x00")
    if nul < 0:
        raise ProtocolError("unterminated C string")
    try:
        return raw[:nul].decode(), pos + nul + 1
    except UnicodeDecodeError as exc:
        raise ProtocolError("C string is not valid UTF-8") from exc


def _decode_op_msg(request_id: int, response_to: int, data: bytes, compressor: str | None) -> OpMsg:
    flags, (start, stop), sequences = _op_msg_sections(data, len(data))
    return OpMsg(request_id, response_to, flags, data[start:stop], sequences, compressor)


_Sequences = tuple[tuple[str, tuple[bytes, ...]], ...]  # (identifier, its documents) each


def _op_msg_sections(data: bytes | bytearray, end: int) -> tuple[int, tuple[int, int], _Sequences]:
    """(flags, where the body document lies, the document sequences) of the OP_MSG in data[:end],
    header included; checksums cover header..sections."""
    if end < HEADER.size + 4 + 1:
        raise ProtocolError("OP_MSG too short")
    (flags,) = _U32.unpack_from(data, HEADER.size)
    if flags & 0xFFFF & ~_KNOWN_REQUIRED_FLAGS:
        raise ProtocolError(f"OP_MSG has unknown required flag bits {flags & 0xFFFF:#x}")
    if flags & FLAG_CHECKSUM_PRESENT:
        end = _checked_sections_end(data, end)
    body, sequences = _sections(data, HEADER.size + 4, end)
    return flags, body, sequences


def _sections(data: bytes | bytearray, pos: int, end: int) -> tuple[tuple[int, int], _Sequences]:
    """(where the body document lies, the document sequences) of the OP_MSG sections in
    data[pos:end]."""
    body: tuple[int, int] | None = None
    sequences: list[tuple[str, tuple[bytes, ...]]] = []
    while pos < end:
        kind = data[pos]
        pos += 1
        if kind == 0:
            if body is not None:
                raise ProtocolError("OP_MSG has more than one kind-0 section")
            body = (pos, pos := _bson_end(data, pos, end))
        elif kind == 1:
            ident, docs, pos = _document_sequence(data, pos, end)
            sequences.append((ident, docs))
        else:
            raise ProtocolError(f"unknown OP_MSG section kind {kind}")
    if body is None:
        raise ProtocolError("OP_MSG has no kind-0 section")
    return body, tuple(sequences)


def _checked_sections_end(data: bytes | bytearray, end: int) -> int:
    """Where the sections of an OP_MSG with a checksum end, the checksum verified."""
    if end < HEADER.size + 4 + 4 + 1:
        raise ProtocolError("OP_MSG too short for its checksum")
    end -= 4
    (expected,) = _U32.unpack_from(data, end)
    if crc32c.crc32c(data[:end]) != expected:
        raise ProtocolError("OP_MSG checksum mismatch")
    return end


def _document_sequence(
    data: bytes | bytearray, pos: int, end: int
) -> tuple[str, tuple[bytes, ...], int]:
    """The kind-1 section at data[pos:end]: (its identifier, its documents, where it ends)."""
    if end - pos < 4:
        raise ProtocolError("truncated document sequence")
    (size,) = _I32.unpack_from(data, pos)
    seq_end = pos + size
    if size < 5 or seq_end > end:
        raise ProtocolError(f"invalid document sequence length {size}")
    ident, p = _cstring_at(data, pos + 4, seq_end)
    docs = []
    while p < seq_end:
        doc, p = _bson_at(data, p, seq_end)
        docs.append(doc)
    return ident, tuple(docs), seq_end


def op_msg_flags(frame: bytes | bytearray) -> int:
    """The flag bits of the OP_MSG at the start of `frame` (one `op_msg_body_span` accepted)."""
    return int(_U32.unpack_from(frame, HEADER.size)[0])


def op_msg_body_span(frame: bytes | bytearray) -> tuple[int, int] | None:
    """Where the body document of the OP_MSG at the start of `frame` lies in it, the frame checked
    as `decode_message` checks it; None for a message that is not a plain OP_MSG (compressed,
    another opcode, with document sequences), for `decode_message`. `frame` may go on past the
    message's end (see `MessageFramer.next_frame`).

    For a reader that takes a reply of megabytes in place: decoding cuts the body out, a copy."""
    length, _, _, op_code = HEADER.unpack_from(frame, 0)
    if op_code != OP_MSG:
        return None
    _, body, sequences = _op_msg_sections(frame, length)
    return None if sequences else body


def _decode_op_query(
    request_id: int, response_to: int, data: bytes, compressor: str | None
) -> OpQuery:
    end = len(data)
    pos = HEADER.size
    if end - pos < 4:
        raise ProtocolError("OP_QUERY too short")
    (flags,) = _I32.unpack_from(data, pos)
    name, pos = _cstring_at(data, pos + 4, end)
    if end - pos < 8:
        raise ProtocolError("OP_QUERY too short")
    skip, nret = struct.unpack_from("<ii", data, pos)
    query, pos = _bson_at(data, pos + 8, end)
    fields = None
    if pos < end:
        fields, pos = _bson_at(data, pos, end)
    if pos != end:
        raise ProtocolError("trailing bytes after OP_QUERY")
    return OpQuery(request_id, response_to, flags, name, skip, nret, query, fields, compressor)


def _decode_op_reply(
    request_id: int, response_to: int, data: bytes, compressor: str | None
) -> OpReply:
    end = len(data)
    pos = HEADER.size
    if end - pos < 20:
        raise ProtocolError("OP_REPLY too short")
    rflags, cursor_id, start, nret = struct.unpack_from("<iqii", data, pos)
    pos += 20
    docs = []
    for _ in range(max(nret, 0)):
        doc, pos = _bson_at(data, pos, end)
        docs.append(doc)
    if pos != end:
        raise ProtocolError("OP_REPLY numberReturned does not match its documents")
    return OpReply(request_id, response_to, rflags, cursor_id, start, tuple(docs), compressor)


_Decoder = Callable[[int, int, bytes, "str | None"], "Message"]
_DECODERS: Final[dict[int, _Decoder]] = {
    OP_MSG: _decode_op_msg,
    OP_QUERY: _decode_op_query,
    OP_REPLY: _decode_op_reply,
}


def decode_message(data: bytes, *, max_size: int = MAX_MESSAGE_SIZE) -> Message:
    """Decode one complete message (`data` is exactly one frame, header included)."""
    if len(data) < HEADER.size:
        raise ProtocolError("message shorter than its header")
    length, request_id, response_to, op_code = HEADER.unpack_from(data, 0)
    if length != len(data):
        raise ProtocolError("message length does not match its frame")
    compressor = None
    if op_code == OP_COMPRESSED:
        data, op_code, compressor = _decompressed(data, max_size)
    decoder = _DECODERS.get(op_code)
    if decoder is None:
        raise ProtocolError(f"unsupported opCode {op_code}")
    return decoder(request_id, response_to, data, compressor)


def _decompressed(data: bytes, max_size: int) -> tuple[bytes, int, str]:
    """The OP_COMPRESSED message `data` (checked to be one whole frame) as the message it wraps:
    (its frame, its opCode, the compressor's name)."""
    length, request_id, response_to, _ = HEADER.unpack_from(data, 0)
    if length < HEADER.size + 9:
        raise ProtocolError("OP_COMPRESSED too short")
    original, size, cid = struct.unpack_from("<iiB", data, HEADER.size)
    if size < 0 or size + HEADER.size > max_size:
        raise ProtocolError(f"OP_COMPRESSED uncompressedSize {size} out of range")
    if original == OP_COMPRESSED:
        raise ProtocolError("OP_COMPRESSED cannot wrap OP_COMPRESSED")
    inner = decompress(cid, data[HEADER.size + 9 :], size)
    header = HEADER.pack(HEADER.size + size, request_id, response_to, original)
    return header + inner, original, COMPRESSOR_NAMES[cid]


class MessageFramer:
    """Incremental framer: feed bytes, pull whole messages.

    `receive_data(b"")` marks EOF; after it, `next_message()` raises ProtocolError if a partial
    frame is left (the peer closed mid-message) and returns NEED_DATA on a clean boundary.
    """

    def __init__(self, *, max_size: int = MAX_MESSAGE_SIZE) -> None:
        # Received data is kept as the chunks it came in, and a frame is cut from them with one
        # copy. Why not one growing bytearray: an oplog getMore reply is up to 16 MB in 256 KB
        # receives, and growing a buffer that size, then copying the frame out of it twice
        # (slice, bytes), cost a reader a seventh of its time.
        self._chunks: deque[bytes] = deque()
        self._start = 0  # where the unread data begins in the first chunk
        self._size = 0  # unread bytes in all
        self.max_size = max_size  # the largest frame taken; a caller may lower it as it goes
        self._eof = False

    def receive_data(self, data: bytes | bytearray) -> None:
        if not data:
            self._eof = True
            return
        self._chunks.append(bytes(data))
        self._size += len(data)

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken."""
        return self._size

    @property
    def trailing_data(self) -> bytes:
        return b"".join(self._chunks)[self._start :]

    def next_message(self) -> Message | _NeedData:
        frame = self.next_frame()
        if frame is NEED_DATA:
            return frame
        return decode_message(frame, max_size=self.max_size)  # type: ignore[arg-type]

    def next_frame(self, pad: int = 0) -> bytes | _NeedData:
        """The next whole message's bytes, undecoded, followed by `pad` zero bytes, or NEED_DATA.
        One copy makes both: a reader that scans a reply of megabytes with word-wide loads needs
        room past its end, and adding that room afterwards copied the reply again."""
        if self._size >= 4:
            length = self._checked_length()
            if self._size >= length:
                return self._take(length, pad)
        if self._eof and self._size:
            raise ProtocolError("connection closed in the middle of a message")
        return NEED_DATA

    def frame_buffer(
        self, pad: int, at_least: int, allocate: Callable[[int], bytearray] = bytearray
    ) -> tuple[bytearray, int, int] | None:
        """For a frame of `at_least` bytes or more whose length has arrived but not all of it:
        (a buffer of its length plus `pad` zero bytes holding what has arrived, how much that
        is, its length); what it holds leaves the framer, and the caller receives the rest
        straight into it (recv_into). `allocate` makes the buffer: any bytes it holds are
        overwritten, so a caller may pass one that leaves them unset (the engine's
        buckets/_columnar/allocator.unfilled_bytearray). None if the length is unknown, the frame
        is smaller or it has all arrived (`next_frame` takes it).

        Why: a reply of megabytes arrives in receives of 256 KB, and cutting the frame from them
        copied every byte a second time (the join), a tenth of a reader's time."""
        if self._size < 4 or self._eof:
            return None
        length = self._next_length()
        if length < at_least or length > self.max_size or self._size >= length:
            return None  # small, absurd (next_frame says so) or all here
        buffer = allocate(length + pad)
        buffer[length:] = bytes(pad)
        return buffer, self._move_into(buffer), length

    def _move_into(self, buffer: bytearray) -> int:
        """Copy every unread byte to the start of `buffer`, which then holds them alone; how
        many."""
        filled = 0
        chunks = self._chunks
        for chunk in chunks:
            piece = memoryview(chunk)[self._start if filled == 0 else 0 :]
            buffer[filled : filled + len(piece)] = piece
            filled += len(piece)
        chunks.clear()
        self._start = self._size = 0
        return filled

    def _checked_length(self) -> int:
        """The next frame's length (its first 4 bytes have arrived); ProtocolError if out of
        range. Checked before the whole frame arrives, so an absurd length never makes us buffer
        it."""
        length = self._next_length()
        if length <= HEADER.size or length > self.max_size:
            raise ProtocolError(f"message length {length} out of range (16, {self.max_size}]")
        return length

    def _next_length(self) -> int:
        """The next frame's length (its first 4 bytes have arrived)."""
        chunks = self._chunks
        while len(chunks[0]) - self._start < 4:  # the length itself is split between chunks:
            head = chunks.popleft()[self._start :]  # join the first two only, not all received
            chunks[0] = head + chunks[0]
            self._start = 0
        return int(_I32.unpack_from(chunks[0], self._start)[0])

    def _take(self, n: int, pad: int) -> bytes:
        """The next `n` unread bytes (there are that many) and `pad` zero bytes, copied once at
        most."""
        chunks, start = self._chunks, self._start
        self._size -= n
        first = chunks[0]
        # A frame that came in one piece: no copy at all.
        if start == 0 and len(first) == n and not pad:
            chunks.popleft()
            return first
        if len(first) - start > n and not pad:
            self._start = start + n
            return first[start : start + n]
        return self._join(n, pad)

    def _join(self, n: int, pad: int) -> bytes:
        """The next `n` unread bytes, spread over chunks, and `pad` zero bytes, in one copy."""
        chunks, start = self._chunks, self._start
        pieces: list[bytes | memoryview] = []
        need = n
        while need:
            chunk = memoryview(chunks[0])[start:]
            if len(chunk) > need:
                pieces.append(chunk[:need])
                self._start = start + need
                break
            pieces.append(chunk)
            need -= len(chunk)
            chunks.popleft()
            start = 0
        else:
            self._start = 0
        if pad:
            pieces.append(bytes(pad))
        return b"".join(pieces)


# ---------------------------------------------------------------------------------------------
# encoding


def encode_op_msg(
    request_id: int,
    response_to: int,
    body: bytes | list[bytes | memoryview],
    *,
    flags: int = 0,
    sequences: tuple[tuple[str, tuple[bytes, ...]], ...] = (),
) -> bytes:
    """An OP_MSG; `body` is the body document's BSON, or its pieces
    (oplog_splice.document_parts)."""
    # One join for the whole message: replies run to megabytes, and every `+` of such a bytes
    # object is a fresh allocation of that size, which faults in page by page.
    checksum = bool(flags & FLAG_CHECKSUM_PRESENT)
    message = joined(
        op_msg_parts(
            request_id,
            response_to,
            body,
            flags=flags,
            sequences=sequences,
            trailer=4 if checksum else 0,
        )
    )
    if checksum:
        return message + _U32.pack(crc32c.crc32c(message))
    return message


def op_msg_parts(
    request_id: int,
    response_to: int,
    body: bytes | list[bytes | memoryview],
    *,
    flags: int = 0,
    sequences: tuple[tuple[str, tuple[bytes, ...]], ...] = (),
    trailer: int = 0,
) -> list[bytes | memoryview]:
    """An OP_MSG as the pieces it is made of, unjoined, for a scatter-gather write (`sendmsg`):
    a reply of megabytes then goes to the socket without first being copied into one bytes
    object. `trailer` bytes (a checksum) are counted in the length but not given."""
    body_parts = body if isinstance(body, list) else (body,)
    parts: list[bytes | memoryview] = [b"", _U32.pack(flags), b"\x00", *body_parts]
    for ident, docs in sequences:
        name = ident.encode() + b"\x00"
        parts += [b"\x01", _I32.pack(4 + len(name) + sum(map(len, docs))), name, *docs]
    length = sum(map(len, parts)) + HEADER.size + trailer
    parts[0] = HEADER.pack(length, request_id, response_to, OP_MSG)
    return parts


def encode_op_reply(
    request_id: int,
    response_to: int,
    documents: tuple[bytes, ...],
    *,
    response_flags: int = 8,
    cursor_id: int = 0,
    starting_from: int = 0,
) -> bytes:
    # response_flags 8 = AwaitCapable, which every modern server sets on OP_REPLY.
    head = struct.pack("<iqii", response_flags, cursor_id, starting_from, len(documents))
    payload = head + b"".join(documents)
    return HEADER.pack(HEADER.size + len(payload), request_id, response_to, OP_REPLY) + payload


def encode_op_query(
    request_id: int,
    full_collection_name: str,
    query: bytes,
    *,
    flags: int = 0,
    number_to_skip: int = 0,
    number_to_return: int = -1,
) -> bytes:
    payload = (
        _I32.pack(flags)
        + full_collection_name.encode()
        + b"\x00"
        + struct.pack("<ii", number_to_skip, number_to_return)
        + query
    )
    return HEADER.pack(HEADER.size + len(payload), request_id, 0, OP_QUERY) + payload


def compress(message: bytes, compressor: str, *, level: int = -1) -> bytes:
    """Wrap an encoded message in OP_COMPRESSED with `compressor` ("zlib", "snappy", "zstd",
    "noop")."""
    length, request_id, response_to, op_code = HEADER.unpack_from(message, 0)
    inner = message[HEADER.size :]
    packed = compressed(inner, compressor, level=level)
    payload = struct.pack("<iiB", op_code, len(inner), COMPRESSOR_IDS[compressor]) + packed
    return HEADER.pack(HEADER.size + len(payload), request_id, response_to, OP_COMPRESSED) + payload
