"""The sort keys of a batch's block: what each event's resume token KeyString is made of, for
the documentKeys the block takes, as splice_crud's `_token_key` and sort key make them;
block_events.py's `assemble` writes them from a kind's key template and each event's `_id` bytes.

A token's KeyString is 0x82, the ts (seconds, then increment, big-endian), the token's fixed head,
the collection's UUID (19 bytes: 0x5a, its length, subtype 4, the 16 bytes), the operation and
the documentKey's object head (`_KEY_ID_AT` bytes in all for an insert, update or delete; one
more for a replacement, whose operationType has seven letters), then the
documentKey's elements and the ends of the objects and of the key (0x00 0x00 0x04).

The documentKeys (batch_layout's _R_OK): `{_id: ObjectId}`, `{_id: binary of 16 bytes}` (a UUID)
and `{_id: string}` of no zero byte (`_ID_STRING`), whose element head is constant (`_HEADS`, in
the kind's key template) and whose value's bytes are the entry's own (a string's with its
terminator, which the KeyString has too); and the walked ones (`_ID_WALKED`): a documentKey of
ObjectIds, strings, int32s, int64s and documents of these (a string `_id` with a zero byte, a
number, a compound `_id`, a shard key beside `_id`), whose elements `walk_key` writes out from the
entry. Their type bits (a string's 0, an int32's 00, an int64's 01: the server's
src/mongo/db/storage/key_string/key_string.h TypeBits kString 0, kInt 0, kLong 1, appended high bit
first) follow the token's seven zero bits; the set ones (an int64's) and their count go into the
entry's kind, so that a kind's events share their token's `_typeBits` (its templates hold the
element). An int64 of a magnitude of 2**62 or more (INT64_MIN is keyed as a double), any other
type, a name twice (the general encoder decides which value counts) or a deeper nesting than _DEPTH
is left to splice_crud.

Why one width per block with zero padding: a block's keys are rows of a numpy array (the merge
compares and stacks rows), and a key shorter than the block's widest is padded with zero bytes.
The padding keeps the keys' order: every key ends with 0x04 (the KeyString's end), so its padded
row is still the key followed by zeros, and no key is a proper prefix of another (each value in
it is self-delimiting: fixed sizes, a size byte, or a terminator that an escaped string never
holds), so two keys differ at a byte inside both, where padding plays no part. Readers strip the
padding (trailing zeros) to get a key back.
"""

from __future__ import annotations

import struct

from buckets._columnar.numba_cache import CACHE  # picks numba's cache dir before numba loads

# isort: split
import numba
import numpy as np
import numpy.typing as npt

from buckets._columnar.byte_kernels import NO_REFCOUNTS, Data, U, load_byte, load_word
from buckets._columnar.byte_kernels import i32_at as i32
from buckets._columnar.byte_kernels import u8_at as u8
from mongoformats.keystring import encode_type_bits
from mongoformats.oplog_splice import _OP_IDENT, _TOKEN_HEAD

_Bytes = npt.NDArray[np.uint8]
_Ints = npt.NDArray[np.int64]

_ID_OID, _ID_WALKED, _ID_UUID, _ID_STRING = 1, 2, 3, 4
_KEY_TS = 1  # where a key's ts is
_OBJECT = b"\x46"  # the documentKey's object head, the last byte of a kind's key template
# "insert", "delete" and "update" have as many letters: their keys share one layout.
assert len({len(_OP_IDENT[op]) for op in ("insert", "delete", "update")}) == 1
_KEY_ID_AT = _KEY_TS + 8 + len(_TOKEN_HEAD) + 19 + len(_OP_IDENT["insert"]) + len(_OBJECT)
# After the `_id` bytes: the ends of the documentKey's and of the token's objects, the key's end.
_KEY_TAIL = b"\x00\x00\x04"

# By the documentKey's kind: the `_id` element's KeyString head (type byte, name, type byte, a
# binary's size byte), and where its value's bytes are in the documentKey's BSON and how many.
_HEADS = {
    _ID_OID: b"\x64_id\x00\x64",
    _ID_WALKED: b"",
    _ID_UUID: b"\x5a_id\x00\x5a\x10",
    _ID_STRING: b"\x3c_id\x00\x3c",
}
_OID_VALUE = (9, 12)  # {len, 0x07, "_id\0", 12 bytes, 0}
_UUID_VALUE = (13, 17)  # {len, 0x05, "_id\0", len, subtype, 16 bytes, 0}: subtype and bytes

# KeyString type bytes (key_string.cpp CType): inside an object, a number's element is headed by
# the numeric family's byte; an int's own byte counts its magnitude's bytes (doubled: the low bit
# says a fraction follows, none here), negative ones counting down with inverted bytes.
_NUMERIC, _ZERO, _POSITIVE_0, _NEGATIVE_0 = 0x1E, 0x29, 0x2A, 0x28
_STRING, _OBJECT_TYPE, _OID = 0x3C, 0x46, 0x64
_DEPTH = 8  # nesting a walk follows (a deeper documentKey is left to splice_crud)
_BITS = 2 * _DEPTH  # in a walk's stack: the type bits' count, then those set, as a mask
# A token's type bits start with its version's, tokenType's, txnOpIndex's (2 each) and
# operationType's (1: a string), all 0 (oplog_splice's _TS_TAIL_BITS); a walked key's follow.
_TS_TAIL_BITS = 7
_MAX_BITS = 50  # a key whose set type bit lies past this is left to splice_crud
# A walked documentKey's kind (batch_layout's _R_OK) holds its type bits when some are set:
# _ID_WALKED, their count from bit 3, the mask of those set from bit 11.
_KIND_MASK, _COUNT_AT, _MASK_AT = 7, 3, 11


def fixed_bytes(kind: int) -> int:
    """How many bytes each key of a documentKey kind has beyond its template (its `_id`'s value
    and the key's tail) if all have as many (an ObjectId's, a UUID's); 0 for walked keys."""
    return _FIXED_BYTES.get(kind & _KIND_MASK, 0)


_FIXED_BYTES = {_ID_OID: _OID_VALUE[1] + len(_KEY_TAIL), _ID_UUID: _UUID_VALUE[1] + len(_KEY_TAIL)}


def type_bits_element(kind: int) -> bytes:
    """The token's `_typeBits` element of a documentKey kind's events (none without type bits),
    as oplog_splice's `_event_parts` writes it: a binary of subtype 0."""
    bits = type_bits_of(kind)
    return b"\x05_typeBits\x00" + struct.pack("<i", len(bits)) + b"\x00" + bits if bits else b""


def type_bits_of(kind: int) -> bytes:
    """The token's `_typeBits` of a documentKey kind (b"" for none: all zero), as
    keystring.encode_type_bits writes them."""
    count, mask = (kind >> _COUNT_AT) & 0xFF, kind >> _MASK_AT
    return encode_type_bits([(mask >> i) & 1 for i in range(count)]) if mask else b""


def key_template(op: str, uuid_ks: bytes, id_kind: int) -> bytes:
    """A kind's sort key up to its `_id`'s value (walked keys: up to their elements), with zeros
    where each event's ts goes."""
    return _KEY_FRONT + uuid_ks + _KEY_BACKS[op, id_kind]


# A key template's parts before and after the collection's UUID (made once: the templates are
# made for every kind of every batch).
_KEY_FRONT = b"\x82" + bytes(8) + _TOKEN_HEAD
_KEY_BACKS = {
    (op, id_kind): _OP_IDENT[op] + _OBJECT + head
    for op in ("insert", "delete", "update", "replace")
    for id_kind, head in _HEADS.items()
}
assert all(
    len(_KEY_FRONT) + 19 + len(_OP_IDENT[op]) + len(_OBJECT) == _KEY_ID_AT + len(op) - len("insert")
    for op, _ in _KEY_BACKS
)


@numba.njit(cache=CACHE, **NO_REFCOUNTS)
def walk_key(d: _Bytes, start: int, out: _Bytes, at: int, stack: _Ints) -> int:
    """`walk_key_at` of the array `d` (for callers that hold the array)."""
    return walk_key_at((d.ctypes.data, len(d)), start, out, at, stack)


@numba.njit(inline="always")
def walk_key_at(d: Data, start: int, out: _Bytes, at: int, stack: _Ints) -> int:
    """Write the KeyString of the elements of the documentKey at d[start:] (the bytes at address
    d[0], d[1] of them; the documentKey's length and terminating zero are checked here) at out[at:],
    as oplog_splice's `_ks_document_key` writes them (up to, not with, the documentKey's end);
    return where they end, or -1 for a documentKey it does not take (see the module's docstring)
    or whose elements do not fill it exactly. `out` has room for twice the documentKey's length
    (no element's KeyString is longer). `stack` holds, for each open document, its end (its
    terminating zero) and its first element, then the type bits' count and those set (see
    `_put_number`). Inlined, with its helpers, into a kernel compiled without reference counts
    (byte_kernels.NO_REFCOUNTS): each read is a bounds check and a load, no call."""
    depth, p, length = 0, start + 4, i32(d, start)
    stack[0], stack[1] = start + length - 1, p
    stack[_BITS], stack[_BITS + 1] = _TS_TAIL_BITS, 0
    if (length < 5) | (u8(d, start + length - 1) != 0):
        return -1
    while True:
        end = stack[2 * depth]
        if p == end:  # a document's end: the documentKey's is the caller's
            if depth == 0:
                return at
            out[U(at)] = 0
            at, p, depth = at + 1, p + 1, depth - 1
            continue
        # (reads within the document, which lies in d, load unchecked)
        t, q = load_byte(U(d[0] + p)), p + 1
        while q < end and load_byte(U(d[0] + q)) != 0:
            q += 1
        if (q >= end) | _named_before(d, stack[2 * depth + 1], p, q):
            return -1
        v, n = q + 1, i32(d, q + 1)
        # each type's value: its size in the BSON, whether it fits in the document
        size = (t == 7) * 12 + (t == 0x10) * 4 + (t == 0x12) * 8 + (t == 2) * (4 + n) + (t == 3) * n
        last = u8(d, v + size - 1)  # a string's or a document's end
        if not (
            (size > 0)
            & (v + size <= end)
            & ((t != 2) | ((n >= 1) & (last == 0)))
            & ((t != 3) | ((n >= 5) & (last == 0) & (depth + 1 < _DEPTH)))
        ):
            return -1
        # the element's head: its type's family, its name, then its value's type byte
        out[U(at)] = _GENERIC[U(t)]
        for j in range(U(p + 1), U(v)):
            out[U(at) + j - U(p)] = load_byte(U(d[0]) + j)
        at += v - p
        if (t == 0x10) | (t == 0x12):
            at = _put_number(d, out, at, t, v, stack)
            if at < 0:
                return -1
        elif t == 3:
            out[U(at)] = _OBJECT_TYPE
            depth += 1
            stack[2 * depth], stack[2 * depth + 1] = v + size - 1, v + 4
            at, v, size = at + 1, v + 4, 0
        else:
            stack[_BITS] += t == 2  # a string's type bit: 0 (kString)
            at = _put_bytes(d, out, at, t, v, size)
        p = v + size


# An element's type byte in a KeyString object, by its BSON type (only those walk_key takes).
_GENERIC = np.zeros(256, np.uint8)
_GENERIC[[2, 3, 7, 0x10, 0x12]] = _STRING, _OBJECT_TYPE, _OID, _NUMERIC, _NUMERIC


@numba.njit(inline="always")
def _named_before(d: Data, first: int, p: int, q: int) -> bool:
    """Whether an element before the one at p (from `first` on, all read already) in its document
    has the name d[p + 1:q]."""
    r = first
    while r < p:
        t, same, j = load_byte(U(d[0] + r)), True, 0
        while load_byte(U(d[0] + r + 1 + j)) != 0:
            same &= (p + 1 + j < q) and load_byte(U(d[0] + r + 1 + j)) == load_byte(
                U(d[0] + p + 1 + j)
            )
            j += 1
        if same & (p + 1 + j == q):
            return True
        v = r + 2 + j
        r = (
            v
            + (t == 7) * 12
            + (t == 0x10) * 4
            + (t == 0x12) * 8
            + (t == 2) * 4
            + ((t == 2) | (t == 3)) * _length(d, v)
        )
    return False


@numba.njit(inline="always")
def _length(d: Data, v: int) -> int:
    """The int32 at v, an element's length read already (so non-negative and in d)."""
    u = U(d[0] + v)
    return load_byte(u) | load_byte(u + 1) << 8 | load_byte(u + 2) << 16 | load_byte(u + 3) << 24


@numba.njit(inline="always")
def _put_bytes(d: Data, out: _Bytes, at: int, t: int, v: int, size: int) -> int:
    """An ObjectId's bytes, or a string's (its zero bytes written 00 FF) and its end, after
    their type byte; where they end."""
    out[U(at)] = _GENERIC[U(t)]
    at += 1
    if t == 7:
        for j in range(U(12)):
            out[U(at) + j] = load_byte(U(d[0] + v) + j)
        return at + 12
    for j in range(U(v + 4), U(v + size - 1)):
        byte = load_byte(U(d[0]) + j)
        out[U(at)] = byte
        at += 1
        if byte == 0:
            out[U(at)] = 0xFF
            at += 1
    out[U(at)] = 0
    return at + 1


@numba.njit(inline="always")
def _put_number(d: Data, out: _Bytes, at: int, t: int, v: int, stack: _Ints) -> int:
    """An int32's or int64's KeyString and type bits (00 and 01: key_string.h TypeBits kInt 0,
    kLong 1, high bit first, as keystring.py's TB_INT32, TB_INT64); -1 for an int64 of a
    magnitude of 2**62 or more, or whose set bit lies past _MAX_BITS (left to splice_crud)."""
    value = i32(d, v) if t == 0x10 else int(np.int64(load_word(U(d[0] + v))))
    bit = stack[_BITS]
    stack[_BITS] = bit + 2
    if t == 0x12:
        if (value >= 1 << 62) | (value <= -(1 << 62)) | (bit + 1 >= _MAX_BITS):
            return -1
        stack[_BITS + 1] |= 1 << (bit + 1)
    return _put_int(out, at, value)


@numba.njit(inline="always")
def _put_int(out: _Bytes, at: int, value: int) -> int:
    """An integer's KeyString (key_string.cpp `_appendInteger`, `_appendPreshiftedIntegerPortion`):
    0x29 for zero; else its magnitude doubled, in as few big-endian bytes as hold it, after a
    type byte counting them, inverted if it is negative. Where it ends."""
    if value == 0:
        out[U(at)] = _ZERO
        return at + 1
    negative = value < 0
    shifted = (-value if negative else value) << 1
    n = 1
    while (n < 8) and (shifted >> (8 * n)):
        n += 1
    out[U(at)] = _NEGATIVE_0 - n if negative else _POSITIVE_0 + n
    flip = 0xFF * negative
    for j in range(n):
        out[U(at + 1 + j)] = ((shifted >> (8 * (n - 1 - j))) & 0xFF) ^ flip
    return at + 1 + n
