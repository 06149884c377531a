"""Byte-level BSON helpers: a document's elements and values as offsets, arrays and reply
cursors spliced from encoded documents, without decoding them.

Why: the proxy's hot paths (oplog entries to events, replies to consumers) move documents it
never needs to look inside; reading their elements by offset and joining their bytes avoids
inflating each one into Python objects and encoding it again.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain
from typing import Any

import bson
from bson import Timestamp
from bson.raw_bson import RawBSONDocument

from mongoformats.codecs import RAW
from mongoformats.wire import ArrayRun, joined

__all__ = [
    "SplicedDocument",
    "array_items",
    "array_of",
    "byte_slices",
    "cursor_batch",
    "cursor_document",
    "cursor_span",
    "document_of",
    "document_parts",
    "elements",
    "first_element",
    "plain_elements",
    "leading_id",
    "splice_at_end",
    "splice_before_ns",
    "timestamp_of",
]

_I32 = struct.Struct("<i")
_TS = struct.Struct("<II")  # BSON Timestamp: increment, then seconds (little-endian)

# Sizes of fixed-width BSON values by type byte.
_FIXED = {
    0x01: 8,
    0x07: 12,
    0x08: 1,
    0x09: 8,
    0x0A: 0,
    0x10: 4,
    0x11: 8,
    0x12: 8,
    0x13: 16,
    0x06: 0,
    0x7F: 0,
    0xFF: 0,
}


# Values of variable width, by type byte: an int32 length, and how many bytes the value has
# beyond that length (from where the int32 begins).
_LENGTH_PREFIXED = {
    0x03: 0,  # document: int32 total length
    0x04: 0,  # array: int32 total length
    0x0F: 0,  # code with scope: int32 total length
    0x02: 4,  # string: int32 length + bytes
    0x0D: 4,  # JS code: int32 length + bytes
    0x0E: 4,  # symbol: int32 length + bytes
    0x05: 5,  # binary: int32 length + subtype + bytes
    0x0C: 16,  # DBPointer: string (int32 length + bytes) + ObjectId
}


def _value_end(buf: bytes | bytearray, t: int, p: int) -> int:
    n = _FIXED.get(t)
    if n is not None:
        return p + n
    extra = _LENGTH_PREFIXED.get(t)
    if extra is not None:
        return p + extra + _I32.unpack_from(buf, p)[0]
    if t == 0x0B:  # regex: two cstrings
        return buf.index(0, buf.index(0, p) + 1) + 1
    raise ValueError(f"unknown BSON type 0x{t:02x}")


def leading_id(doc: bytes) -> tuple[int, bytes] | None:
    """(BSON type, value bytes) of `doc`'s `_id` when it is the first element (drivers put it
    there), else None."""
    if len(doc) < 10 or doc[5:9] != b"_id\x00":
        return None
    t = doc[4]
    return t, doc[9 : _value_end(doc, t, 9)]


def elements(buf: bytes | bytearray, start: int = 0) -> dict[bytes, tuple[int, int, int]]:
    """The elements of the BSON document at `start`: name -> (type, value start, value end)
    (names as bytes, in a bytearray too: a reply received into its own buffer)."""
    unpack, index, fixed = _I32.unpack_from, buf.index, _FIXED
    names = byte_slices(buf)
    end = start + unpack(buf, start)[0] - 1
    p = start + 4
    out: dict[bytes, tuple[int, int, int]] = {}
    while p < end:
        t = buf[p]
        q = index(0, p + 1)
        v = q + 1
        # The common types inline: this loop runs for every element of every oplog entry.
        if t == 3 or t == 4:
            e = v + unpack(buf, v)[0]
        elif t == 2:
            e = v + 4 + unpack(buf, v)[0]
        else:
            n = fixed.get(t)
            e = v + n if n is not None else _value_end(buf, t, v)
        out[names[p + 1 : q]] = (t, v, e)
        p = e
    return out


def array_items(buf: bytes, start: int = 0) -> list[bytes]:
    """The values of the BSON array (or document) of documents at `start`, as byte slices;
    ValueError unless each is a document that lies in the array."""
    unpack, index = _I32.unpack_from, buf.index
    end = start + unpack(buf, start)[0] - 1
    p = start + 4
    out = []
    while p < end:
        if buf[p] != 3:
            raise ValueError(f"array element of BSON type 0x{buf[p]:02x}, not a document")
        v = index(0, p + 1) + 1
        size = unpack(buf, v)[0]
        if size < 5 or v + size > end:
            raise ValueError("an array's document runs past the array")
        p = v + size
        out.append(buf[v:p])
    return out


@functools.lru_cache(maxsize=17)
def _index_keys(size_class: int) -> tuple[bytes, ...]:
    """The element headers (type 0x03, then the index as a C string) of an array's first
    2**size_class documents; memoized: every getMore reply would otherwise format one per event."""
    return tuple(b"\x03%d\x00" % i for i in range(1 << size_class))


def _keys_of(first: int, n: int) -> Sequence[bytes]:
    """The element headers of indices first .. first + n - 1."""
    size_class = (first + n).bit_length()
    if size_class <= 16:  # up to 64k keys cached (a few MB); a larger batch formats its own
        return _index_keys(size_class)[first : first + n]
    return [b"\x03%d\x00" % i for i in range(first, first + n)]


# A document this large is a piece of its own (not copied); smaller ones are joined, at most
# _JOINED_DOCUMENTS to a piece. Why: every piece costs its sender more (a buffer view, an entry
# of a scatter-gather write) than copying a document of a few KB; a batch of thousands of small
# events as two pieces each spent more on the pieces than on the bytes.
_OWN_PIECE_BYTES = 16 << 10
_JOINED_DOCUMENTS = 256


def _keyed_pieces(items: Sequence[Any], first: int) -> list[bytes]:
    """Encoded documents as array elements keyed from `first` on (type 3, the index in
    decimal, the document), as the pieces of a message: runs of small documents joined with
    their keys, each large one left where it lies."""
    keys = _keys_of(first, len(items))
    sizes = list(map(len, items))
    large = []
    if max(sizes, default=0) >= _OWN_PIECE_BYTES:
        large = [i for i, size in enumerate(sizes) if size >= _OWN_PIECE_BYTES]
    pieces: list[bytes] = []
    start = 0
    for stop in (*large, len(items)):
        for at in range(start, stop, _JOINED_DOCUMENTS):
            end = min(stop, at + _JOINED_DOCUMENTS)
            elements = zip(keys[at:end], items[at:end], strict=True)
            pieces.append(b"".join(chain.from_iterable(elements)))
        if stop < len(items):
            pieces += (keys[stop], items[stop])
        start = stop + 1
    return pieces


def _array_parts(items: list[Any]) -> tuple[int, list[Any]]:
    """A BSON array of the given documents (encoded, or runs of them: wire.ArrayRun, the
    engine's event blocks, whose elements are keyed and written as the reply is sent) as (its
    size, the pieces after its length).

    Pieces, not bytes: the caller joins them once into the whole reply, or sends them as they
    are. Every `+` of a reply-sized bytes object costs an allocation of that size, and such
    fresh memory faults in page by page.
    """
    parts: list[Any] = []
    index, size = 0, 5
    start = 0  # the first of the encoded documents not yet keyed
    runs = () if list(map(type, items)).count(bytes) == len(items) else enumerate(items)
    for at, item in runs:
        if isinstance(item, ArrayRun):
            if start < at:
                parts += _keyed_pieces(items[start:at], index)
                index += at - start
            body = item.array_body(index)
            parts.append(body)
            index += len(item)
            start = at + 1
    if start < len(items):
        parts += _keyed_pieces(items[start:] if start else items, index)
    parts.append(b"\x00")
    size += sum(map(len, parts)) - 1
    return size, parts


def array_of(items: list[bytes]) -> bytes:
    """A BSON array of the given encoded documents (the inverse of array_items)."""
    size, parts = _array_parts(items)
    return joined(chain((_I32.pack(size),), parts))


class SplicedDocument(Mapping[str, Any]):
    """A BSON document held as the pieces it was spliced from, joined only if its bytes are
    asked for.

    Why: a reply's cursor may hold megabytes of events (a shard's oplog batch, a consumer that
    fell behind). Joined here and then again into the wire message, each event would be copied
    twice into fresh reply-sized memory, which faults in page by page. `document_parts` embeds
    the pieces as they are, so the message is the one join.
    Elsewhere it reads like a RawBSONDocument: `raw`, a read-only mapping, and bson.encode takes
    it by its type marker.
    """

    _type_marker = 101  # what bson.encode looks for to embed a document's `raw` bytes as they are
    __slots__ = ("parts", "size", "_raw", "_document")

    def __init__(self, parts: list[bytes]) -> None:
        self.parts = parts  # the first piece is the int32 length of the whole
        self.size = _I32.unpack(parts[0])[0]
        self._raw: bytes | None = None
        self._document: RawBSONDocument | None = None

    @property
    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = joined(self.parts)
        return self._raw

    def _inflated(self) -> RawBSONDocument:
        if self._document is None:
            self._document = RawBSONDocument(self.raw, RAW)
        return self._document

    def __getitem__(self, key: str) -> Any:
        return self._inflated()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._inflated())

    def __len__(self) -> int:
        return len(self._inflated())


# A small reply's head and tail (cursor id and ns, postBatchResumeToken, ok, $clusterTime,
# operationTime) are written here from their parts rather than by bson.encode: a live tail's
# getMore replies are small and many, and a few bson.encode calls of small dicts each cost more
# than the rest of such a reply. Only exact types whose bytes are plain to write are taken; a
# document holding anything else (or a key or value bson.encode would refuse) goes to bson.encode
# whole, so the bytes and errors are always bson.encode's.
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


@functools.lru_cache(maxsize=256)
def _key(name: str) -> bytes | None:
    """An element's name as a C string; None if bson.encode would not take it as it is."""
    if "\x00" in name:
        return None
    try:
        return name.encode() + b"\x00"
    except UnicodeEncodeError:
        return None


def _str_value(value: str) -> tuple[int, bytes] | None:
    try:
        return 0x02, _string(value.encode())
    except UnicodeEncodeError:
        return None


def _int_value(value: int) -> tuple[int, bytes] | None:
    if _INT32_MIN <= value <= _INT32_MAX:
        return 0x10, _I32.pack(value)
    return _int64_value(value)


def _int64_value(value: int) -> tuple[int, bytes] | None:
    try:
        return 0x12, _I64.pack(value)
    except struct.error:
        return None  # out of range: bson.encode's own error


def _document_value(value: dict[str, Any]) -> tuple[int, bytes] | None:
    body = _elements_of(value, top_level=False)
    return None if body is None else (0x03, document_of(body))


def _binary_value(value: bson.Binary) -> tuple[int, bytes] | None:
    if value.subtype != 0:
        return None  # subtype 2 has a second length inside
    return 0x05, _I32.pack(len(value)) + b"\x00" + bytes(value)


_VALUES: dict[type, Any] = {
    str: _str_value,
    int: _int_value,
    bson.Int64: _int64_value,
    float: lambda v: (0x01, _F64.pack(v)),
    bool: lambda v: (0x08, b"\x01" if v else b"\x00"),
    Timestamp: lambda v: (0x11, _TS.pack(v.inc, v.time)),
    bson.Binary: _binary_value,
    RawBSONDocument: lambda v: (0x03, v.raw),
    dict: _document_value,
}


_PLAIN_TYPES = frozenset(_VALUES) - {RawBSONDocument}
_EMBEDDED = (RawBSONDocument, SplicedDocument)


def _elements_of(doc: Mapping[str, Any], top_level: bool) -> bytes | None:
    """`doc`'s elements as bson.encode writes them, or None where this does not know how."""
    if top_level and "_id" in doc:
        return None  # bson.encode moves a top-level _id first
    out: list[bytes] = []
    for name, value in doc.items():
        key = _key(name) if type(name) is str else None
        write = _VALUES.get(type(value))
        element = None if write is None else write(value)
        if key is None or element is None:
            return None
        out += (bytes((element[0],)), key, element[1])
    return b"".join(out)


def plain_elements(doc: Mapping[str, Any]) -> bytes:
    """`bson.encode(doc)` without its length and terminator: its elements."""
    body = _elements_of(doc, top_level=True) if type(doc) is dict else None
    return bson.encode(doc)[4:-1] if body is None else body


def _cursor_head(cursor_id: int, ns: str) -> bytes:
    """The elements `{id: Int64(cursor_id), ns}` of a reply's cursor."""
    try:
        return b"\x12id\x00" + _I64.pack(cursor_id) + _ns_element(ns)
    except (struct.error, UnicodeEncodeError):
        return bson.encode({"id": bson.Int64(cursor_id), "ns": ns})[4:-1]


@functools.lru_cache(maxsize=64)
def _ns_element(ns: str) -> bytes:
    return b"\x02ns\x00" + _string(ns.encode())


def cursor_document(
    cursor_id: int, ns: str, batch_field: str, items: list[Any], extra: dict[str, Any] | None = None
) -> SplicedDocument:
    """A reply's `cursor` sub-document `{id, ns, <batch_field>: [...], **extra}` with the batch
    spliced from the documents' own bytes: no per-document object is built or re-encoded, and
    nothing is joined until the reply is (see SplicedDocument)."""
    head = _cursor_head(cursor_id, ns)
    tail = plain_elements(extra) if extra else b""
    name = b"\x04" + batch_field.encode() + b"\x00"
    array_size, array_parts = _array_parts(items)
    size = 4 + len(head) + len(name) + array_size + len(tail) + 1
    return SplicedDocument(
        [_I32.pack(size), head, name, _I32.pack(array_size), *array_parts, tail, b"\x00"]
    )


def document_parts(doc: Mapping[str, Any]) -> list[bytes | memoryview]:
    """`doc` as BSON, in pieces to join once (with the wire header, by `encode_op_msg`): the
    embedded raw documents (a reply's cursor, megabytes of events) are not copied into an
    encoder's growing buffer, which reallocates and faults in a reply-sized block each time,
    and a SplicedDocument's pieces go in as they are."""
    parts: list[bytes | memoryview] = [b""]
    size = 4 + 1  # the length and the terminator
    plain: dict[str, Any] = {}

    def flush() -> None:
        nonlocal size
        if plain:
            encoded = plain_elements(plain)
            parts.append(encoded)
            size += len(encoded)
            plain.clear()

    for key, value in doc.items():
        # (Known plain types first: an isinstance against these Mapping classes is an ABC check.)
        if type(value) not in _PLAIN_TYPES and isinstance(value, _EMBEDDED):
            flush()
            name = b"\x03" + key.encode() + b"\x00"
            if isinstance(value, SplicedDocument):
                parts.append(name)
                parts += value.parts
                size += len(name) + value.size
            else:
                parts += (name, value.raw)
                size += len(name) + len(value.raw)
        else:
            plain[key] = value
    flush()
    parts.append(b"\x00")
    parts[0] = _I32.pack(size)
    return parts


def splice_before_ns(event: bytes, name: str, document: bytes | None) -> bytes:
    """`event` (BSON) with a `name` element (`document`'s BSON, or null) spliced in just before
    `ns`: where the server puts fullDocument (a slot the transform reserves). Fields
    ahead of `_id` (a transaction's lsid/txnNumber) stay where they are."""
    _, ns_value, _ = elements(event)[b"ns"]
    at = ns_value - len(b"\x03ns\x00")
    key = name.encode()
    element = (
        b"\x03" + key + b"\x00" + document if document is not None else b"\x0a" + key + b"\x00"
    )
    return document_of(event[4:at] + element + event[at:-1])


def splice_at_end(event: bytes, name: str, document: bytes | None) -> bytes:
    """`event` (BSON) with a `name` element (`document`'s BSON, or null) appended after its last
    field: where the server puts fullDocumentBeforeChange. DocumentSourceChangeStreamAddPreImage
    sets that field, which the event does not have, and a pipeline Document appends a field it
    does not find (document.h, DocumentStorage::getField; audit D11)."""
    key = name.encode()
    element = (
        b"\x03" + key + b"\x00" + document if document is not None else b"\x0a" + key + b"\x00"
    )
    return document_of(event[4:-1] + element)


def cursor_batch(reply: bytes) -> tuple[int, list[bytes]]:
    """(cursor id, documents of firstBatch/nextBatch) of a find/getMore reply, without decoding
    them."""
    cursor_id, start, _ = cursor_span(reply)
    return cursor_id, array_items(reply, start)


def byte_slices(buf: bytes | bytearray) -> Any:
    """What slices `buf` to bytes objects: `buf` itself if it is bytes (no cost on the usual
    path), else a view of it whose slices are copied into bytes once (a bytearray's own slices
    are bytearrays, unhashable and not bytes to `type(x) is bytes` checks): a reply received
    into its own buffer (UpstreamConnection) hands out entries and names as bytes."""
    return buf if type(buf) is bytes else _BytesOf(memoryview(buf))


class _BytesOf:
    __slots__ = ("view",)

    def __init__(self, view: memoryview) -> None:
        self.view = view

    def __getitem__(self, cut: slice) -> bytes:
        return bytes(self.view[cut])


def cursor_span(reply: bytes | bytearray, at: int = 0) -> tuple[int, int, int]:
    """(cursor id, where its firstBatch/nextBatch array starts and ends) of the find/getMore reply
    at `at` in `reply`."""
    _, c0, _ = elements(reply, at)[b"cursor"]
    cursor = elements(reply, c0)
    _, i0, i1 = cursor[b"id"]
    _, start, end = cursor.get(b"nextBatch") or cursor[b"firstBatch"]
    return int.from_bytes(reply[i0:i1], "little", signed=True), start, end


def timestamp_of(doc: bytes | bytearray, name: bytes = b"ts", start: int = 0) -> Timestamp:
    """The timestamp `name` of the document at `start`, read where it lies (a live tail reads
    its last entry's in the reply); KeyError if it has none."""
    found = first_element(doc, name, start)
    if found is None:
        raise KeyError(name)
    inc, secs = _TS.unpack_from(doc, found[1])
    return Timestamp(secs, inc)


def first_element(
    buf: bytes | bytearray, name: bytes, start: int = 0
) -> tuple[int, int, int] | None:
    """(type, value start, value end) of the first element `name` of the BSON document at
    `start`, walked only up to it and read where it lies; None if it has none. Why not
    `elements`: a live tail reads one element (an oplog entry's ts, a reply's ok) of each small
    reply, and a dict of all of them costs more than the walk."""
    end = start + _I32.unpack_from(buf, start)[0] - 1
    p, size = start + 4, len(name)
    while p < end:
        t = buf[p]
        q = buf.index(0, p + 1)
        e = _value_end(buf, t, q + 1)
        if q - p - 1 == size and buf[p + 1 : q] == name:
            return t, q + 1, e
        p = e
    return None


def _cstring_element(t: int, name: bytes, value: bytes) -> bytes:
    return bytes((t,)) + name + b"\x00" + value


def _string(value: bytes) -> bytes:
    return _I32.pack(len(value) + 1) + value + b"\x00"


def document_of(body: bytes) -> bytes:
    """A BSON document of the elements `body` (its length, then the elements, then the end byte).
    Joined, not added: `body` is copied once, which counts for large events' fragments."""
    return b"".join((_I32.pack(len(body) + 5), body, b"\x00"))
