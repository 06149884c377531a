"""The value a hashed index (and so a hashed shard key) keeps for a BSON value: the server's
BSONElementHasher::hash64 with seed 0 (src/mongo/db/hasher.cpp), from the value's BSON bytes.

MD5 over: the seed (int32), then for the value its canonical type (int32); numbers squashed to
an int64 (doubles truncated toward zero and saturated, NaN as 0), so 1, 1.5, NumberLong(1) hash
alike; documents and arrays as each element's canonical type, name (with its NUL) and value, then
the terminating EOO's type; code with scope as its code string then its scope's elements; any
other value as its BSON value bytes. The first 8 bytes of the digest, little-endian, are the hash.
The server's own test vectors (hasher_test.cpp) are tests/unit/test_hashed_key.py. Its squashing
(BSONElement::safeNumberLongForHash, read for facts only) has two edges the vectors miss: the
double 2^63 squashes to -2^63 (an old overflow kept so hashes never change), and a Decimal128 is
rounded half to even (Decimal128::toLong's default), not truncated as a double is.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import bson
from bson import Decimal128, Int64

from mongoformats.idl import INT64_MIN, safe_long
from mongoformats.oplog_splice import _value_end

__all__ = ["hashed_value"]

_I32, _I64, _F64 = struct.Struct("<i"), struct.Struct("<q"), struct.Struct("<d")

# BSON type byte -> canonical type (canonicalizeBSONType); EOO and Undefined share 0.
_CANONICAL = {
    0x00: 0,
    0x06: 0,
    0xFF: -1,
    0x0A: 5,
    0x01: 10,
    0x10: 10,
    0x12: 10,
    0x13: 10,
    0x02: 15,
    0x0E: 15,
    0x03: 20,
    0x04: 25,
    0x05: 30,
    0x07: 35,
    0x08: 40,
    0x09: 45,
    0x11: 47,
    0x0B: 50,
    0x0C: 55,
    0x0D: 60,
    0x0F: 65,
    0x7F: 127,
}


def hashed_value(value: Any) -> Int64:
    """The int64 a hashed index keeps for `value`."""
    doc = bson.encode({"": value})
    digest = hashlib.md5(b"\x00\x00\x00\x00")  # the seed, 0
    _hash_element(digest, doc, 4, with_name=False)
    return Int64(_I64.unpack_from(digest.digest())[0])


def _hash_element(digest: Any, buf: bytes, p: int, *, with_name: bool) -> int:
    """Feed the element at `p`; returns where the next one starts."""
    t = buf[p]
    digest.update(_I32.pack(_CANONICAL[t]))
    if t == 0x00:  # EOO: its type alone
        return p + 1
    name_end = buf.index(0, p + 1)
    if with_name:
        digest.update(buf[p + 1 : name_end + 1])
    v = name_end + 1
    end = _value_end(buf, t, v)
    if t in (0x03, 0x04):
        _hash_elements(digest, buf, v + 4)
    elif t == 0x0F:  # code with scope: int32 total, the code string (with its NUL), the scope
        n = _I32.unpack_from(buf, v + 4)[0]
        digest.update(buf[v + 8 : v + 8 + n])
        _hash_elements(digest, buf, v + 8 + n + 4)
    elif t in (0x01, 0x10, 0x12, 0x13):
        digest.update(_I64.pack(_as_int64(t, buf, v)))
    else:
        digest.update(buf[v:end])
    return end


def _hash_elements(digest: Any, buf: bytes, p: int) -> None:
    """A document's elements from `p`, its EOO included."""
    while buf[p] != 0:
        p = _hash_element(digest, buf, p, with_name=True)
    _hash_element(digest, buf, p, with_name=True)


def _as_int64(t: int, buf: bytes, p: int) -> int:
    """safeNumberLongForHash: safeNumberLong (NaN as 0, saturated, doubles toward zero, decimals
    half to even), except for the double 2^63."""
    if t == 0x10:
        return _I32.unpack_from(buf, p)[0]
    if t == 0x12:
        return _I64.unpack_from(buf, p)[0]
    if t == 0x01:
        d = _F64.unpack_from(buf, p)[0]
        return INT64_MIN if d == 2.0**63 else safe_long(d)
    return safe_long(Decimal128.from_bid(bytes(buf[p : p + 16])))
