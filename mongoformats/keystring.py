"""KeyString V1 encoding of BSON values, as the server builds resume tokens.

Strategy: a value is appended as a one-byte "ctype" followed by its bytes; the encoding is
order-preserving, so comparing two keys' bytes compares their values. Type distinctions that the
ordering ignores (Int32 vs Int64 vs Double, String vs Symbol) go into a separate bit stream, the
"type bits", serialized next to the key. Resume tokens use an all-ascending ordering, so no byte
is ever inverted except where the format itself inverts negative numbers.

Source (facts only): mongodb/mongo src/mongo/db/storage/key_string.cpp (`CType`,
`_appendBsonValue`, `_appendInteger`, `TypeBits`), summarized in shared/reference/mongodb-formats.md
section A.3/A.4. Numbers keyed as doubles and integers are keystring_numbers.py's, Decimal128
values keystring_decimal.py's. pymongo decodes the deprecated
Symbol, Undefined and DBPointer types as str, None and DBRef, so keys of those types are encoded
as the types they decode to.
"""

from __future__ import annotations

import datetime
import math
import struct
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import bson
from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS

from mongoformats.keystring_decimal import decimal_key, read_decimal, read_decimal_value, read_decimal_zero
from mongoformats.keystring_numbers import (
    ALL_ONES,
    MIN_LARGE_DOUBLE,
    NUM_NEG_1BYTE,
    NUM_NEG_LARGE,
    NUM_NEG_SMALL,
    NUM_POS_1BYTE,
    NUM_POS_LARGE,
    NUM_POS_SMALL,
    NUM_ZERO,
    NUMERIC_NAN,
    double_from_bits,
    double_key,
    magnitude_bytes,
    preshifted_key,
)

__all__ = ["KeyStringBuilder", "KeyStringReader", "encode_type_bits", "decode_type_bits", "END", "key_of"]

MINKEY, UNDEFINED, NULL = 0x0A, 0x0F, 0x14
_INT64_MIN = -(2**63)
STRING, OBJECT, ARRAY, BINDATA, OID = 0x3C, 0x46, 0x50, 0x5A, 0x64
FALSE, TRUE, DATE, TIMESTAMP, REGEX, CODE, CODE_WITH_SCOPE, MAXKEY = 0x6E, 0x6F, 0x78, 0x82, 0x8C, 0xA0, 0xAA, 0xF0
END = 0x04

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

# Type-bit values for numbers, appended high bit first (TypeBits::kInt ... kDecimal).
_TB_INT32, _TB_INT64, _TB_DOUBLE = 0b00, 0b01, 0b10
_TB_DECIMAL = 0b11                # Decimal128: 6 bits of its exponent follow
_TB_SPECIAL_ZERO = 0b11           # a zero with 3 more bits: -0.0 or a Decimal128 zero
_NEGATIVE_ZERO_BITS = [1, 1, 0, 0, 0]


def key_of(values: Any) -> bytes:
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

    def append(self, value: Any) -> None:
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
    def _ctype(value: Any) -> int:
        if value is None:
            return NULL
        if isinstance(value, bool):
            return TRUE if value else FALSE
        if isinstance(value, float) and not _is_integer_double(value):
            return double_key(value)[0]
        if isinstance(value, int) and value == _INT64_MIN:
            return NUM_NEG_LARGE
        if isinstance(value, (int, float)):
            return _integer_ctype(_integral(value))
        if isinstance(value, Code):  # a str subclass: before str
            return CODE if value.scope is None else CODE_WITH_SCOPE
        if isinstance(value, str):
            return STRING
        if isinstance(value, DBRef):
            return OBJECT
        if isinstance(value, Mapping):
            return OBJECT
        if isinstance(value, (list, tuple)):
            return ARRAY
        if isinstance(value, (bytes, Binary)):
            return BINDATA
        if isinstance(value, ObjectId):
            return OID
        if isinstance(value, (datetime.datetime, DatetimeMS)):
            return DATE
        if isinstance(value, Timestamp):
            return TIMESTAMP
        if isinstance(value, Regex):
            return REGEX
        if isinstance(value, MinKey):
            return MINKEY
        if isinstance(value, MaxKey):
            return MAXKEY
        if isinstance(value, Decimal128):
            return NUMERIC_NAN  # its family; `append` writes the exact type byte (keystring_decimal)
        raise ValueError(f"cannot encode {type(value).__name__} in a KeyString")

    def _append_body(self, value: Any) -> None:
        buf = self._buf
        if value is None or isinstance(value, (bool, MinKey, MaxKey)):
            return
        if isinstance(value, (int, float)):
            if isinstance(value, Int64):
                self._numeric_bits(_TB_INT64)
            elif isinstance(value, float):
                if value == 0 and math.copysign(1.0, value) < 0:
                    # -0.0 shares the zero key byte; its type bits are V1's 5-bit negative-zero
                    # code 0b11000 (TypeBits::appendZero, kV1NegativeDoubleZero).
                    self._bits += _NEGATIVE_ZERO_BITS
                    return
                self._numeric_bits(_TB_DOUBLE)
                if not _is_integer_double(value):
                    buf += double_key(value)[1:]
                    return
            elif -(2**31) <= value < 2**31:
                self._numeric_bits(_TB_INT32)
            else:
                self._numeric_bits(_TB_INT64)
            if value == _INT64_MIN and not isinstance(value, float):
                # No positive int64 holds its magnitude: keyed as that double (_appendInteger).
                buf += double_key(float(value))[1:]
                return
            v = _integral(value)
            if v:
                buf += preshifted_key(abs(v) << 1, v < 0)[1:]  # (its type byte is written already)
            return
        if isinstance(value, Code):  # Code is a str subclass: test it before str
            buf += _escape(str(value).encode())
            if value.scope is not None:  # then the scope's elements, as an object's
                self._object_body(value.scope)
        elif isinstance(value, str):
            self._bits.append(0)  # String, not Symbol
            buf += _escape(value.encode())
        elif isinstance(value, Mapping):
            self._object_body(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                self.append(item)
            buf.append(0)
        elif isinstance(value, (bytes, Binary)):
            subtype = value.subtype if isinstance(value, Binary) else 0
            payload = bytes(value)
            buf += bytes([len(payload)]) if len(payload) < 0xFF else b"\xff" + struct.pack(">i", len(payload))
            buf.append(subtype)
            buf += payload
        elif isinstance(value, ObjectId):
            buf += value.binary
        elif isinstance(value, (datetime.datetime, DatetimeMS)):
            millis = int(value) if isinstance(value, DatetimeMS) else _millis(value)
            buf += struct.pack(">Q", (millis & 0xFFFFFFFFFFFFFFFF) ^ (1 << 63))
        elif isinstance(value, Timestamp):
            buf += struct.pack(">II", value.time, value.inc)
        elif isinstance(value, Regex):
            buf += _escape(value.pattern.encode()) + _escape(_regex_flags(value))


    def _object_body(self, value: Mapping[str, Any]) -> None:
        """An object's elements (generic type byte, name, value), then its terminator."""
        buf = self._buf
        for name, item in value.items():
            buf.append(_generic_ctype(self._ctype(item)))
            buf += _escape(name.encode())
            self.append(item)
        buf.append(0)


_FAST: dict[type, Any] = {
    ObjectId: KeyStringBuilder._fast_oid, int: KeyStringBuilder._fast_int, str: KeyStringBuilder._fast_str,
    dict: KeyStringBuilder._fast_dict, Decimal128: KeyStringBuilder._decimal,
}
_GENERIC_BY_TYPE: dict[type, int] = {ObjectId: OID, int: NUMERIC_NAN, float: NUMERIC_NAN, Int64: NUMERIC_NAN,
                                     str: STRING, dict: OBJECT, list: ARRAY, type(None): NULL, bool: FALSE,
                                     Timestamp: TIMESTAMP, Decimal128: NUMERIC_NAN}


def _regex_flags(value: Regex[Any]) -> bytes:
    """The flags as BSON stores them ("imx"): pymongo decodes them into re-module bits."""
    if isinstance(value.flags, str):
        return value.flags.encode()
    raw = bson.encode({"": value})  # {"": regex}: header, type, name, pattern\0, flags\0, end
    return raw[6 + len(value.pattern.encode()) + 1:-2]


def _millis(value: datetime.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    delta = value - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _is_integer_double(value: float) -> bool:
    """Doubles the key encodes exactly like integers: whole numbers with magnitude below 2**63."""
    return math.isfinite(value) and value == int(value) and abs(value) < MIN_LARGE_DOUBLE


# The body of Int64(-2**63)'s key: the double -2**63's (see `_append_body`).
_INT64_MIN_BODY = double_key(float(_INT64_MIN))[1:]


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


def _generic_ctype(ctype: int) -> int:
    # Inside objects, the byte before a field name names the value's type family, not the value.
    if 0x1E <= ctype <= 0x33:
        return NUMERIC_NAN
    return ctype if ctype not in (TRUE, UNDEFINED) else {TRUE: FALSE, UNDEFINED: NULL}[ctype]


def encode_type_bits(bits: list[int]) -> bytes:
    """Serialize type bits (LSB-first packing; see mongodb-formats.md A.4). b"" means all zero."""
    if not any(bits):
        return b""
    data = bytearray((len(bits) + 7) // 8)
    for i, bit in enumerate(bits):
        if bit:
            data[i // 8] |= 1 << (i % 8)
    if len(data) == 1 and data[0] < 0x80:
        return bytes(data)
    if len(data) <= 127:
        return bytes([0x80 | len(data)]) + bytes(data)
    return b"\x80" + struct.pack("<i", len(data)) + bytes(data)


def decode_type_bits(raw: bytes) -> list[int]:
    if not raw:
        return []
    if raw[0] < 0x80:
        data = raw[:1]
        if len(raw) != 1:
            raise ValueError("invalid type bits: trailing bytes")
    elif raw[0] == 0x80:
        (size,) = struct.unpack_from("<i", raw, 1)
        data = raw[5 : 5 + size]
        if len(data) != size or len(raw) != 5 + size:
            raise ValueError("invalid type bits length")
    else:
        size = raw[0] & 0x7F
        data = raw[1 : 1 + size]
        if len(data) != size or len(raw) != 1 + size:
            raise ValueError("invalid type bits length")
    return [(data[i // 8] >> (i % 8)) & 1 for i in range(len(data) * 8)]


class KeyStringReader:
    """Reads values back; numbers and strings take their exact BSON type from the type bits."""

    def __init__(self, data: bytes, type_bits: bytes = b"") -> None:
        self._data = data
        self._pos = 0
        self._bits = decode_type_bits(type_bits)
        self._bit = 0

    def at_end(self) -> bool:
        return self._pos < len(self._data) and self._data[self._pos] == END

    def finish(self) -> None:
        if not self.at_end() or self._pos + 1 != len(self._data):
            raise ValueError("KeyString does not end with its terminator")

    def _next_bit(self) -> int:
        bit = self._bits[self._bit] if self._bit < len(self._bits) else 0
        self._bit += 1
        return bit

    def _next_bits(self, n: int) -> int:
        """The next `n` type bits as a number, the first the most significant."""
        value = 0
        for _ in range(n):
            value = value << 1 | self._next_bit()
        return value

    def _take(self, n: int) -> bytes:
        chunk = self._data[self._pos : self._pos + n]
        if len(chunk) != n:
            raise ValueError("truncated KeyString")
        self._pos += n
        return chunk

    def _cstring(self) -> bytes:
        out = bytearray()
        data = self._data
        while True:
            if self._pos >= len(data):
                raise ValueError("unterminated KeyString string")
            b = data[self._pos]
            self._pos += 1
            if b == 0:
                if self._pos < len(data) and data[self._pos] == 0xFF:
                    out.append(0)
                    self._pos += 1
                    continue
                return bytes(out)
            out.append(b)

    def read(self) -> Any:
        (ctype,) = self._take(1)
        return self._read_body(ctype)

    def _read_body(self, ctype: int) -> Any:
        if ctype == NULL:
            return None
        if ctype in (FALSE, TRUE):
            return ctype == TRUE
        if ctype == MINKEY:
            return MinKey()
        if ctype == MAXKEY:
            return MaxKey()
        if ctype in (NUMERIC_NAN, NUM_NEG_LARGE, NUM_NEG_SMALL, NUM_POS_SMALL, NUM_POS_LARGE):
            return self._read_double(ctype)
        if NUM_NEG_1BYTE - 7 <= ctype <= NUM_POS_1BYTE + 7:
            return self._read_number(ctype)
        if ctype == STRING:
            text = self._cstring().decode()
            if self._next_bit():
                raise ValueError("Symbol values are not supported")
            return text
        if ctype == OBJECT:
            return self._object()
        if ctype == ARRAY:
            items = []
            while self._data[self._pos : self._pos + 1] != b"\x00":
                items.append(self.read())
            self._pos += 1
            return items
        if ctype == BINDATA:
            (size,) = self._take(1)
            if size == 0xFF:
                (size,) = struct.unpack(">i", self._take(4))
            (subtype,) = self._take(1)
            return Binary(self._take(size), subtype)
        if ctype == OID:
            return ObjectId(self._take(12))
        if ctype == DATE:
            (raw,) = struct.unpack(">Q", self._take(8))
            millis = raw ^ (1 << 63)
            if millis >= 1 << 63:
                millis -= 1 << 64
            return DatetimeMS(millis)
        if ctype == TIMESTAMP:
            secs, inc = struct.unpack(">II", self._take(8))
            return Timestamp(secs, inc)
        if ctype == REGEX:
            return Regex(self._cstring().decode(), self._cstring().decode())
        if ctype == CODE:
            return Code(self._cstring().decode())
        if ctype == CODE_WITH_SCOPE:
            code = self._cstring().decode()
            return Code(code, self._object())
        raise ValueError(f"unsupported KeyString type byte {ctype:#04x}")

    def _object(self) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        while True:
            (generic,) = self._take(1)
            if generic == 0:
                return obj
            name = self._cstring().decode()
            obj[name] = self.read()

    def _read_double(self, ctype: int) -> float | Decimal128:
        kind = self._next_bits(2)
        if kind == _TB_INT64 and ctype == NUM_NEG_LARGE and self._take(8) == _INT64_MIN_BODY:
            return Int64(_INT64_MIN)  # the one integer keyed as a double
        if kind not in (_TB_DOUBLE, _TB_DECIMAL):
            raise ValueError(f"a KeyString number with type byte {ctype:#04x} must be a double or a decimal")
        if ctype == NUMERIC_NAN:
            return math.nan if kind == _TB_DOUBLE else Decimal128("NaN")
        negative = ctype in (NUM_NEG_LARGE, NUM_NEG_SMALL)
        encoded = self._magnitude(8, negative)
        large = ctype in (NUM_NEG_LARGE, NUM_POS_LARGE)
        if large and encoded == ALL_ONES:
            if kind == _TB_DOUBLE:
                return -math.inf if negative else math.inf
            return Decimal128("-Infinity" if negative else "Infinity")
        if kind == _TB_DECIMAL:

            return read_decimal(large, encoded, negative, lambda: self._magnitude(8, negative),
                                self._decimal_exponent_bits())
        if large:
            # The shift dropped the exponent's top bit, which every double >= 2**63 has set.
            magnitude = double_from_bits((encoded >> 1) | (1 << 62))
        elif encoded >> 62 == 0b11:
            magnitude = double_from_bits(encoded >> 2)
        else:
            magnitude = math.ldexp(double_from_bits((encoded - (1 << 62)) >> 1), -256)
        return -magnitude if negative else magnitude

    def _magnitude(self, n: int, negative: bool) -> int:
        """The next `n` bytes as an unsigned big-endian number (stored inverted if negative)."""
        return int.from_bytes(magnitude_bytes(self._take(n), negative), "big")

    def _decimal_exponent_bits(self) -> int:
        """The low 6 bits of a decimal's biased exponent, which follow its type bits `11`."""
        return self._next_bits(6)

    def _decimal(self, magnitude: Decimal, dcm: int, negative: bool) -> Decimal128:

        continuation = self._magnitude(8, negative) if dcm in (1, 3) else None
        return read_decimal_value(magnitude, dcm, continuation, negative, self._decimal_exponent_bits())

    def _read_number(self, ctype: int) -> int | float | Decimal128:
        kind = self._next_bits(2)
        if ctype == NUM_ZERO:
            if kind == _TB_INT32:
                return 0
            if kind == _TB_INT64:
                return Int64(0)
            if kind == _TB_DOUBLE:
                return 0.0
            zero_kind = self._next_bits(3)
            if zero_kind == 0:  # _NEGATIVE_ZERO_BITS after its leading 11
                return -0.0
            return self._decimal_zero(zero_kind)
        negative = ctype < NUM_ZERO
        n = ctype - NUM_POS_1BYTE + 1 if not negative else NUM_NEG_1BYTE + 1 - ctype
        m = self._magnitude(n, negative)
        whole = m >> 1
        value: int | float
        if m & 1:  # a fraction (or a decimal's marker): the rest of 8 bytes follows
            if kind not in (_TB_DOUBLE, _TB_DECIMAL):
                raise ValueError("a fractional KeyString number must be a double or a decimal")
            shift = 8 * (8 - n)
            encoded = (m << shift) | self._magnitude(8 - n, negative)
            if kind == _TB_DECIMAL:
                # Whole parts from 2**53 on are exact and the byte after them is only the marker;
                # 8 whole-part bytes leave no room for one: a continuation always follows.
                dcm = encoded & 3 if shift else 3
                exact = Decimal(whole) if whole >= 2**53 else \
                    Decimal(math.ldexp((encoded & ~3) - ((whole + 1) << shift), -shift))
                return self._decimal(exact, dcm, negative)
            value = math.ldexp(encoded - ((whole + 1) << shift), -shift)
        else:
            value = whole
        value = -value if negative else value
        if kind == _TB_INT32:
            return value
        if kind == _TB_INT64:
            return Int64(value)
        if kind == _TB_DOUBLE:
            return float(value)
        return self._decimal(Decimal(whole), 0, negative)

    def _decimal_zero(self, prefix_tail: int) -> Decimal128:
        """A decimal zero: 0b11 and these 3 bits, then 12 more bits, name its exponent and sign."""

        return read_decimal_zero(0b11000 | prefix_tail, self._next_bits(12))
