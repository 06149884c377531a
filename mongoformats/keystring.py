"""KeyString V1 encoding of BSON values, as the server builds resume tokens.

Strategy: a value is appended as a one-byte "ctype" followed by its bytes; the encoding is
order-preserving, so comparing two keys' bytes compares their values. Type distinctions that the
ordering ignores (Int32 vs Int64 vs Double, String vs Symbol) go into a separate bit stream, the
"type bits", serialized next to the key. Resume tokens use an all-ascending ordering, so no byte
is ever inverted except where the format itself inverts negative numbers.

Source (facts only): mongodb/mongo src/mongo/db/storage/key_string.cpp (`CType`,
`_appendBsonValue`, `_appendInteger`, `TypeBits`), summarized in
shared/reference/mongodb-formats.md section A.3/A.4. keystring_reader.py reads keys back. Numbers
keyed as doubles and integers are keystring_numbers.py's, Decimal128 values keystring_decimal.py's.
pymongo decodes the deprecated Symbol, Undefined and DBPointer types as str, None and DBRef, so
keys of those types are encoded as the types they decode to.
"""

from __future__ import annotations

import datetime
import math
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import bson
from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS

from mongoformats.keystring_decimal import decimal_key
from mongoformats.keystring_numbers import (
    MIN_LARGE_DOUBLE,
    NUM_NEG_1BYTE,
    NUM_NEG_LARGE,
    NUM_POS_1BYTE,
    NUM_ZERO,
    NUMERIC_NAN,
    double_key,
    preshifted_key,
)

__all__ = ["KeyStringBuilder", "encode_type_bits", "END", "key_of"]

MINKEY, UNDEFINED, NULL = 0x0A, 0x0F, 0x14
INT64_MIN = -(2**63)
STRING, OBJECT, ARRAY, BINDATA, OID = 0x3C, 0x46, 0x50, 0x5A, 0x64
FALSE, TRUE, DATE, TIMESTAMP = 0x6E, 0x6F, 0x78, 0x82
REGEX, CODE, CODE_WITH_SCOPE, MAXKEY = 0x8C, 0xA0, 0xAA, 0xF0
END = 0x04

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

# Type-bit values for numbers, appended high bit first (TypeBits::kInt ... kDecimal).
TB_INT32, TB_INT64, TB_DOUBLE = 0b00, 0b01, 0b10
TB_DECIMAL = 0b11  # Decimal128: 6 bits of its exponent follow
_TB_SPECIAL_ZERO = 0b11  # a zero with 3 more bits: -0.0 or a Decimal128 zero
_NEGATIVE_ZERO_BITS = [1, 1, 0, 0, 0]


def key_of(values: Iterable[object]) -> bytes:
    """The KeyString of `values` in order, without type bits: the bytes an index compares, so
    values the server holds equal (1, 1.0, NumberLong(1), Decimal128("1")) give equal keys."""
    ks = KeyStringBuilder()
    for value in values:
        ks.append(value)
    return ks.data


def _escape(text: bytes) -> bytes:
    # A NUL inside a string is written 00 FF so that the terminating 00 stays unambiguous.
    return text.replace(b"\x00", b"\x00\xff") + b"\x00"


class KeyStringBuilder:
    """Appends values; `data` and `type_bits` hold the result."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._bits: list[int] = []

    @property
    def data(self) -> bytes:
        return bytes(self._buf)

    @property
    def type_bits(self) -> bytes:
        return encode_type_bits(self._bits)

    @property
    def bits(self) -> list[int]:
        """The type bits so far, one int each, not yet encoded: for a caller that writes the
        rest of a KeyString itself and appends these to its own."""
        return list(self._bits)

    def append_end(self) -> None:
        self._buf.append(END)

    def append_zero_type_bits(self, count: int) -> None:
        """The type bits of `count` values whose bytes the caller writes itself, all zero (int32,
        String, ...): a key spliced from cached byte runs."""
        self._bits += [0] * count

    def append(self, value: object) -> None:
        fast = _FAST.get(type(value))
        if fast is not None:
            fast(self, value)
            return
        if isinstance(value, DBRef):  # a document {$ref, $id, ...} that pymongo decoded as a DBRef
            value = value.as_doc()
        self._buf.append(self._ctype(value))
        self._append_body(value)

    # Exact-type fast paths (hot: every event token encodes a documentKey).
    def _fast_oid(self, value: ObjectId) -> None:
        self._buf.append(OID)
        self._buf += value.binary

    def _fast_int(self, value: int) -> None:
        if not -(2**31) <= value < 2**31:
            self._buf.append(self._ctype(value))
            self._append_body(value)
            return
        self._bits += (0, 0)
        if value == 0:
            self._buf.append(NUM_ZERO)
            return
        self._buf += preshifted_key(abs(value) << 1, value < 0)

    def _decimal(self, value: Decimal128) -> None:
        key, bits = decimal_key(value)
        self._buf += key
        self._bits += bits

    def _fast_str(self, value: str) -> None:
        self._buf.append(STRING)
        self._bits.append(0)
        self._buf += _escape(value.encode())

    def _fast_dict(self, value: dict[str, Any]) -> None:
        buf = self._buf
        buf.append(OBJECT)
        for name, item in value.items():
            t = type(item)
            buf.append(_GENERIC_BY_TYPE.get(t) or _generic_ctype(self._ctype(item)))
            buf += _escape(name.encode())
            self.append(item)
        buf.append(0)

    # -- helpers ------------------------------------------------------------------------------

    def _numeric_bits(self, bits: int) -> None:
        self._bits += [(bits >> 1) & 1, bits & 1]

    @staticmethod
    def _ctype(value: object) -> int:
        if value is None:
            return NULL
        if isinstance(value, bool):
            return TRUE if value else FALSE
        if isinstance(value, (int, float)):
            return _number_ctype(value)
        if isinstance(value, Code):  # a str subclass: before str
            return CODE if value.scope is None else CODE_WITH_SCOPE
        return _class_ctype(value)

    def _append_body(self, value: object) -> None:
        if value is None or isinstance(value, (bool, MinKey, MaxKey)):
            return  # the type byte is the whole key
        if isinstance(value, (int, float)):
            self._number_body(value)
            return
        for classes, write in _BODY_WRITERS:
            if isinstance(value, classes):
                write(self, value)
                return

    def _number_body(self, value: int | float) -> None:
        if isinstance(value, float) and value == 0 and math.copysign(1.0, value) < 0:
            # -0.0 shares the zero key byte; its type bits are V1's 5-bit negative-zero
            # code 0b11000 (TypeBits::appendZero, kV1NegativeDoubleZero).
            self._bits += _NEGATIVE_ZERO_BITS
            return
        self._numeric_bits(_number_type_bits(value))
        if isinstance(value, float) and not _is_integer_double(value):
            self._buf += double_key(value)[1:]
            return
        self._buf += _integer_body(value)

    def _code_body(self, value: Code) -> None:
        self._buf += _escape(str(value).encode())
        if value.scope is not None:  # then the scope's elements, as an object's
            self._object_body(value.scope)

    def _string_body(self, value: str) -> None:
        self._bits.append(0)  # String, not Symbol
        self._buf += _escape(value.encode())

    def _array_body(self, value: list[object] | tuple[object, ...]) -> None:
        for item in value:
            self.append(item)
        self._buf.append(0)

    def _binary_body(self, value: bytes | Binary) -> None:
        subtype = value.subtype if isinstance(value, Binary) else 0
        payload = bytes(value)
        size = len(payload)
        self._buf += bytes([size]) if size < 0xFF else b"\xff" + struct.pack(">i", size)
        self._buf.append(subtype)
        self._buf += payload

    def _oid_body(self, value: ObjectId) -> None:
        self._buf += value.binary

    def _date_body(self, value: datetime.datetime | DatetimeMS) -> None:
        millis = int(value) if isinstance(value, DatetimeMS) else _millis(value)
        self._buf += struct.pack(">Q", (millis & 0xFFFFFFFFFFFFFFFF) ^ (1 << 63))

    def _timestamp_body(self, value: Timestamp) -> None:
        self._buf += struct.pack(">II", value.time, value.inc)

    def _regex_body(self, value: Regex[Any]) -> None:
        self._buf += _escape(value.pattern.encode()) + _escape(_regex_flags(value))

    def _object_body(self, value: Mapping[str, Any]) -> None:
        """An object's elements (generic type byte, name, value), then its terminator."""
        buf = self._buf
        for name, item in value.items():
            buf.append(_generic_ctype(self._ctype(item)))
            buf += _escape(name.encode())
            self.append(item)
        buf.append(0)


# Type bytes of the values that are neither numbers, booleans, null nor Code, in the order
# `isinstance` must try them. A DBRef is keyed as the document it stands for.
_CTYPE_BY_CLASS: tuple[tuple[type | tuple[type, ...], int], ...] = (
    (str, STRING),
    ((DBRef, Mapping), OBJECT),
    ((list, tuple), ARRAY),
    ((bytes, Binary), BINDATA),
    (ObjectId, OID),
    ((datetime.datetime, DatetimeMS), DATE),
    (Timestamp, TIMESTAMP),
    (Regex, REGEX),
    (MinKey, MINKEY),
    (MaxKey, MAXKEY),
    # its family; `append` writes the exact type byte (keystring_decimal)
    (Decimal128, NUMERIC_NAN),
)

# The writers of a value's bytes after its type byte, by type (Code before its base class str).
_BodyWriter = Callable[[KeyStringBuilder, Any], None]
_BODY_WRITERS: tuple[tuple[type | tuple[type, ...], _BodyWriter], ...] = (
    (Code, KeyStringBuilder._code_body),
    (str, KeyStringBuilder._string_body),
    (Mapping, KeyStringBuilder._object_body),
    ((list, tuple), KeyStringBuilder._array_body),
    ((bytes, Binary), KeyStringBuilder._binary_body),
    (ObjectId, KeyStringBuilder._oid_body),
    ((datetime.datetime, DatetimeMS), KeyStringBuilder._date_body),
    (Timestamp, KeyStringBuilder._timestamp_body),
    (Regex, KeyStringBuilder._regex_body),
)

_FAST: dict[type, Any] = {
    ObjectId: KeyStringBuilder._fast_oid,
    int: KeyStringBuilder._fast_int,
    str: KeyStringBuilder._fast_str,
    dict: KeyStringBuilder._fast_dict,
    Decimal128: KeyStringBuilder._decimal,
}
_GENERIC_BY_TYPE: dict[type, int] = {
    ObjectId: OID,
    int: NUMERIC_NAN,
    float: NUMERIC_NAN,
    Int64: NUMERIC_NAN,
    str: STRING,
    dict: OBJECT,
    list: ARRAY,
    type(None): NULL,
    bool: FALSE,
    Timestamp: TIMESTAMP,
    Decimal128: NUMERIC_NAN,
}


def _regex_flags(value: Regex[Any]) -> bytes:
    """The flags as BSON stores them ("imx"): pymongo decodes them into re-module bits."""
    if isinstance(value.flags, str):
        return value.flags.encode()
    raw = bson.encode({"": value})  # {"": regex}: header, type, name, pattern\0, flags\0, end
    return raw[6 + len(value.pattern.encode()) + 1 : -2]


def _millis(value: datetime.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    delta = value - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _is_integer_double(value: float) -> bool:
    """Doubles the key encodes exactly like integers: whole numbers with magnitude below 2**63."""
    return math.isfinite(value) and value == int(value) and abs(value) < MIN_LARGE_DOUBLE


# The body of Int64(-2**63)'s key: the double -2**63's (see `_append_body`).
INT64_MIN_BODY = double_key(float(INT64_MIN))[1:]


def _number_ctype(value: int | float) -> int:
    if isinstance(value, float) and not _is_integer_double(value):
        return double_key(value)[0]
    if isinstance(value, int) and value == INT64_MIN:
        return NUM_NEG_LARGE
    return _integer_ctype(_integral(value))


def _number_type_bits(value: int | float) -> int:
    """The 2 type bits naming a number's BSON type: Int64, double, or by its size int32/int64."""
    if isinstance(value, Int64):
        return TB_INT64
    if isinstance(value, float):
        return TB_DOUBLE
    return TB_INT32 if -(2**31) <= value < 2**31 else TB_INT64


def _integral(value: int | float) -> int:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value) or value != int(value)):
        raise ValueError(f"KeyString encoding of the double {value!r} is not supported")
    v = int(value)
    if abs(v) >= 2**63:
        raise ValueError("KeyString encoding of magnitudes >= 2**63 is not supported")
    return v


def _integer_ctype(v: int) -> int:
    if v == 0:
        return NUM_ZERO
    n = ((abs(v) << 1).bit_length() + 7) // 8
    return NUM_POS_1BYTE - 1 + n if v > 0 else NUM_NEG_1BYTE + 1 - n


def _class_ctype(value: object) -> int:
    """The type byte of a value of a class in _CTYPE_BY_CLASS; ValueError for any other."""
    for classes, ctype in _CTYPE_BY_CLASS:
        if isinstance(value, classes):
            return ctype
    raise ValueError(f"cannot encode {type(value).__name__} in a KeyString")


def _generic_ctype(ctype: int) -> int:
    # Inside objects, the byte before a field name names the value's type family, not the value.
    if 0x1E <= ctype <= 0x33:
        return NUMERIC_NAN
    return ctype if ctype not in (TRUE, UNDEFINED) else {TRUE: FALSE, UNDEFINED: NULL}[ctype]


def encode_type_bits(bits: list[int]) -> bytes:
    """Serialize type bits (LSB-first packing; see mongodb-formats.md A.4). b"" means all zero."""
    if not any(bits):
        return b""
    data = _packed_bits(bits)
    if len(data) == 1 and data[0] < 0x80:
        return bytes(data)
    if len(data) <= 127:
        return bytes([0x80 | len(data)]) + bytes(data)
    return b"\x80" + struct.pack("<i", len(data)) + bytes(data)


def _packed_bits(bits: list[int]) -> bytearray:
    """`bits` packed LSB-first into bytes."""
    data = bytearray((len(bits) + 7) // 8)
    for i, bit in enumerate(bits):
        if bit:
            data[i // 8] |= 1 << (i % 8)
    return data


def _integer_body(value: int | float) -> bytes:
    """The body of a whole number (the type byte is written already): none for zero."""
    if value == INT64_MIN and not isinstance(value, float):
        # No positive int64 holds its magnitude: keyed as that double (_appendInteger).
        return INT64_MIN_BODY
    v = _integral(value)
    return preshifted_key(abs(v) << 1, v < 0)[1:] if v else b""
