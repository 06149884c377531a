"""Reading KeyString V1 keys back into BSON values: the inverse of keystring.py's builder.

The key bytes give each value's family and magnitude; the type bits give the exact BSON type
(Int32, Int64, Double or Decimal128; String). Source (facts only): mongodb/mongo
src/mongo/db/storage/key_string.cpp (`_appendBsonValue`, `toBson`), summarized in
shared/reference/mongodb-formats.md section A.3/A.4.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS

from mongoformats.keystring import (
    ARRAY,
    BINDATA,
    CODE,
    CODE_WITH_SCOPE,
    DATE,
    END,
    FALSE,
    INT64_MIN,
    INT64_MIN_BODY,
    MAXKEY,
    MINKEY,
    NULL,
    OBJECT,
    OID,
    REGEX,
    STRING,
    TB_DECIMAL,
    TB_DOUBLE,
    TB_INT32,
    TB_INT64,
    TIMESTAMP,
    TRUE,
)
from mongoformats.keystring_decimal import read_decimal, read_decimal_value, read_decimal_zero
from mongoformats.keystring_numbers import (
    ALL_ONES,
    NUM_NEG_1BYTE,
    NUM_NEG_LARGE,
    NUM_NEG_SMALL,
    NUM_POS_1BYTE,
    NUM_POS_LARGE,
    NUM_POS_SMALL,
    NUM_ZERO,
    NUMERIC_NAN,
    double_from_bits,
    magnitude_bytes,
)

__all__ = ["KeyStringReader", "decode_type_bits"]


def decode_type_bits(raw: bytes) -> list[int]:
    if not raw:
        return []
    data = _type_bits_data(raw)
    return [(data[i // 8] >> (i % 8)) & 1 for i in range(len(data) * 8)]


def _type_bits_data(raw: bytes) -> bytes:
    """The bytes holding the bits of the encoded type bits `raw`: a single byte under 0x80,
    else a size (0x80 then an int32, or the byte's low 7 bits) and that many bytes."""
    if raw[0] < 0x80:
        if len(raw) != 1:
            raise ValueError("invalid type bits: trailing bytes")
        return raw[:1]
    if raw[0] == 0x80:
        (size,) = struct.unpack_from("<i", raw, 1)
        start = 5
    else:
        size, start = raw[0] & 0x7F, 1
    data = raw[start : start + size]
    if len(data) != size or len(raw) != start + size:
        raise ValueError("invalid type bits length")
    return data


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
        if ctype in _DOUBLE_CTYPES:
            return self._read_double(ctype)
        if NUM_NEG_1BYTE - 7 <= ctype <= NUM_POS_1BYTE + 7:
            return self._read_number(ctype)
        reader = _READERS.get(ctype)
        if reader is None:
            raise ValueError(f"unsupported KeyString type byte {ctype:#04x}")
        return reader(self)

    def _read_string(self) -> str:
        text = self._cstring().decode()
        if self._next_bit():
            raise ValueError("Symbol values are not supported")
        return text

    def _read_array(self) -> list[Any]:
        items = []
        while self._data[self._pos : self._pos + 1] != b"\x00":
            items.append(self.read())
        self._pos += 1
        return items

    def _read_binary(self) -> Binary:
        (size,) = self._take(1)
        if size == 0xFF:
            (size,) = struct.unpack(">i", self._take(4))
        (subtype,) = self._take(1)
        return Binary(self._take(size), subtype)

    def _read_oid(self) -> ObjectId:
        return ObjectId(self._take(12))

    def _read_date(self) -> DatetimeMS:
        (raw,) = struct.unpack(">Q", self._take(8))
        millis = raw ^ (1 << 63)
        if millis >= 1 << 63:
            millis -= 1 << 64
        return DatetimeMS(millis)

    def _read_timestamp(self) -> Timestamp:
        secs, inc = struct.unpack(">II", self._take(8))
        return Timestamp(secs, inc)

    def _read_regex(self) -> Regex[Any]:
        return Regex(self._cstring().decode(), self._cstring().decode())

    def _read_code(self) -> Code:
        return Code(self._cstring().decode())

    def _read_code_with_scope(self) -> Code:
        code = self._cstring().decode()
        return Code(code, self._object())

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
        if kind == TB_INT64 and ctype == NUM_NEG_LARGE and self._take(8) == INT64_MIN_BODY:
            return Int64(INT64_MIN)  # the one integer keyed as a double
        if kind not in (TB_DOUBLE, TB_DECIMAL):
            raise ValueError(
                f"a KeyString number with type byte {ctype:#04x} must be a double or a decimal"
            )
        if ctype == NUMERIC_NAN:
            return math.nan if kind == TB_DOUBLE else Decimal128("NaN")
        return self._read_non_nan(ctype, kind)

    def _read_non_nan(self, ctype: int, kind: int) -> float | Decimal128:
        """A double or decimal's body after its type bits `kind`: infinity, or its magnitude."""
        negative = ctype in (NUM_NEG_LARGE, NUM_NEG_SMALL)
        encoded = self._magnitude(8, negative)
        large = ctype in (NUM_NEG_LARGE, NUM_POS_LARGE)
        if large and encoded == ALL_ONES:
            return _infinity(kind == TB_DECIMAL, negative)
        if kind == TB_DECIMAL:
            return read_decimal(
                large,
                encoded,
                negative,
                lambda: self._magnitude(8, negative),
                self._decimal_exponent_bits(),
            )
        magnitude = _double_magnitude(encoded, large)
        return -magnitude if negative else magnitude

    def _magnitude(self, n: int, negative: bool) -> int:
        """The next `n` bytes as an unsigned big-endian number (stored inverted if negative)."""
        return int.from_bytes(magnitude_bytes(self._take(n), negative), "big")

    def _decimal_exponent_bits(self) -> int:
        """The low 6 bits of a decimal's biased exponent, which follow its type bits `11`."""
        return self._next_bits(6)

    def _decimal(self, magnitude: Decimal, dcm: int, negative: bool) -> Decimal128:

        continuation = self._magnitude(8, negative) if dcm in (1, 3) else None
        exponent_bits = self._decimal_exponent_bits()
        return read_decimal_value(magnitude, dcm, continuation, negative, exponent_bits)

    def _read_number(self, ctype: int) -> int | float | Decimal128:
        kind = self._next_bits(2)
        if ctype == NUM_ZERO:
            return self._read_zero(kind)
        negative = ctype < NUM_ZERO
        n = ctype - NUM_POS_1BYTE + 1 if not negative else NUM_NEG_1BYTE + 1 - ctype
        m = self._magnitude(n, negative)
        if m & 1:  # a fraction (or a decimal's marker): the rest of 8 bytes follows
            return self._read_fraction(m, n, kind, negative)
        whole = m >> 1
        if kind == TB_DECIMAL:
            return self._decimal(Decimal(whole), 0, negative)
        return _typed_number(-whole if negative else whole, kind)

    def _read_fraction(self, m: int, n: int, kind: int, negative: bool) -> int | float | Decimal128:
        """A number with a fraction (or a decimal's marker), its first `n` magnitude bytes `m`
        read: the rest of 8 bytes follows."""
        if kind not in (TB_DOUBLE, TB_DECIMAL):
            raise ValueError("a fractional KeyString number must be a double or a decimal")
        whole = m >> 1
        shift = 8 * (8 - n)
        encoded = (m << shift) | self._magnitude(8 - n, negative)
        if kind == TB_DECIMAL:
            # Whole parts from 2**53 on are exact and the byte after them is only the marker;
            # 8 whole-part bytes leave no room for one: a continuation always follows.
            dcm = encoded & 3 if shift else 3
            exact = (
                Decimal(whole)
                if whole >= 2**53
                else Decimal(math.ldexp((encoded & ~3) - ((whole + 1) << shift), -shift))
            )
            return self._decimal(exact, dcm, negative)
        value = math.ldexp(encoded - ((whole + 1) << shift), -shift)
        return _typed_number(-value if negative else value, kind)

    def _read_zero(self, kind: int) -> int | float | Decimal128:
        if kind == TB_DECIMAL:
            zero_kind = self._next_bits(3)
            if zero_kind == 0:  # _NEGATIVE_ZERO_BITS after its leading 11
                return -0.0
            return self._decimal_zero(zero_kind)
        return _typed_number(0, kind)

    def _decimal_zero(self, prefix_tail: int) -> Decimal128:
        """A decimal zero: 0b11 and these 3 bits, then 12 more bits, name its exponent and sign."""

        return read_decimal_zero(0b11000 | prefix_tail, self._next_bits(12))


# The type bytes of numbers keyed as doubles (and decimals beyond a double's 8 bytes).
_DOUBLE_CTYPES = frozenset(
    (NUMERIC_NAN, NUM_NEG_LARGE, NUM_NEG_SMALL, NUM_POS_SMALL, NUM_POS_LARGE)
)

# Readers of the values after their type byte, for every type but numbers.
_READERS: dict[int, Callable[[KeyStringReader], Any]] = {
    NULL: lambda reader: None,
    FALSE: lambda reader: False,
    TRUE: lambda reader: True,
    MINKEY: lambda reader: MinKey(),
    MAXKEY: lambda reader: MaxKey(),
    STRING: KeyStringReader._read_string,
    OBJECT: KeyStringReader._object,
    ARRAY: KeyStringReader._read_array,
    BINDATA: KeyStringReader._read_binary,
    OID: KeyStringReader._read_oid,
    DATE: KeyStringReader._read_date,
    TIMESTAMP: KeyStringReader._read_timestamp,
    REGEX: KeyStringReader._read_regex,
    CODE: KeyStringReader._read_code,
    CODE_WITH_SCOPE: KeyStringReader._read_code_with_scope,
}


def _infinity(decimal: bool, negative: bool) -> float | Decimal128:
    if decimal:
        return Decimal128("-Infinity" if negative else "Infinity")
    return -math.inf if negative else math.inf


def _double_magnitude(encoded: int, large: bool) -> float:
    """A double's magnitude from its 8 key bytes (keystring_numbers.double_key, read back)."""
    if large:
        # The shift dropped the exponent's top bit, which every double >= 2**63 has set.
        return double_from_bits((encoded >> 1) | (1 << 62))
    if encoded >> 62 == 0b11:
        return double_from_bits(encoded >> 2)
    return math.ldexp(double_from_bits((encoded - (1 << 62)) >> 1), -256)


def _typed_number(value: int | float, kind: int) -> int | float:
    """`value` as the BSON type its 2 type bits name: int32, Int64 or double."""
    if kind == TB_INT32:
        return value
    if kind == TB_INT64:
        return Int64(value)
    return float(value)
