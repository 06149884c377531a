"""KeyString V1 keys of numbers keyed as doubles or whole numbers: the encoders that keystring.py
(every BSON value) and keystring_decimal.py (a Decimal128 keyed by its nearest double) share.

Source (facts only): mongodb/mongo src/mongo/db/storage/key_string.cpp
(`_appendDoubleWithoutTypeBits`, `_appendPreshiftedIntegerPortion`, `CType`).
"""

from __future__ import annotations

import math
import struct

__all__ = [
    "NUMERIC_NAN",
    "NUM_ZERO",
    "NUM_POS_1BYTE",
    "NUM_NEG_1BYTE",
    "NUM_NEG_LARGE",
    "NUM_NEG_SMALL",
    "NUM_POS_SMALL",
    "NUM_POS_LARGE",
    "double_key",
    "preshifted_key",
]

NUMERIC_NAN = 0x1E
NUM_ZERO, NUM_POS_1BYTE, NUM_NEG_1BYTE = 0x29, 0x2B, 0x27
# Doubles outside the integer encodings (V1): |x| < 1, |x| >= 2**63 (and infinities).
NUM_NEG_LARGE, NUM_NEG_SMALL, NUM_POS_SMALL, NUM_POS_LARGE = 0x1F, 0x28, 0x2A, 0x33
MIN_LARGE_DOUBLE = 2.0**63
TINIEST_WITH_2BIT_DCM = 2.0**-255  # smaller doubles are scaled up by 2**256 first
ALL_ONES = (1 << 64) - 1


def double_key(value: float, dcm: int = 0) -> bytes:
    """Type byte and body of a number keyed as a double (key_string.cpp, V1
    `_appendDoubleWithoutTypeBits`): whole numbers below 2**63 take the integer form, others one
    of the fraction, small and large forms. Negative values store their magnitude's bytes
    inverted, so the byte order is the numeric order.

    `dcm` is the decimal continuation marker a Decimal128 stores in the spare low bits (0 for a
    double; keystring_decimal.py): two bits below 2**63, one bit in the tiny and large ranges.
    With a marker, a whole number takes the fraction form too.
    """
    if math.isnan(value):
        return bytes([NUMERIC_NAN])
    negative = value < 0
    magnitude = -value if negative else value
    if magnitude < 1.0:
        ctype, encoded = _small(magnitude, negative, dcm)
    elif magnitude < MIN_LARGE_DOUBLE:
        integer = int(magnitude)
        if dcm == 0 and integer == magnitude:
            return preshifted_key(integer << 1, negative)
        ctype, encoded = _with_fraction(magnitude, integer, negative, dcm)
    else:
        ctype, encoded = _large(value, magnitude, dcm)
    return bytes([ctype]) + magnitude_bytes(encoded.to_bytes(8, "big"), negative)


def _small(magnitude: float, negative: bool, dcm: int) -> tuple[int, int]:
    """(type, body) of a magnitude below 1."""
    ctype = NUM_NEG_SMALL if negative else NUM_POS_SMALL
    if magnitude >= TINIEST_WITH_2BIT_DCM:
        # prefix 0b11 (the exponent's top bits)
        return ctype, (double_bits(magnitude) << 2) | dcm
    # prefix 0b01 or 0b10
    return ctype, ((double_bits(math.ldexp(magnitude, 256)) << 1) | (dcm != 0)) + (1 << 62)


def _with_fraction(magnitude: float, integer: int, negative: bool, dcm: int) -> tuple[int, int]:
    """(type, body) of a magnitude from 1 to 2**63 that is not written as an integer: the whole
    part doubled plus one (the "has a fraction" bit), then the fraction's bytes."""
    fraction_bytes = (64 - (integer << 1).bit_length()) // 8
    ctype = (0x20 + fraction_bytes) if negative else (0x32 - fraction_bytes)
    shift = 8 * fraction_bytes
    return ctype, int(math.ldexp(magnitude, shift)) + ((integer + 1) << shift) | dcm


def _large(value: float, magnitude: float, dcm: int) -> tuple[int, int]:
    """(type, body) of a magnitude of 2**63 or more, infinity included."""
    ctype = NUM_POS_LARGE if value > 0 else NUM_NEG_LARGE
    shifted = ((double_bits(magnitude) << 1) & (ALL_ONES >> 1)) | (dcm != 0)
    return ctype, ALL_ONES if math.isinf(value) else shifted


def magnitude_bytes(body: bytes, negative: bool) -> bytes:
    return bytes(b ^ 0xFF for b in body) if negative else body


def preshifted_key(preshifted: int, negative: bool) -> bytes:
    """A whole number's key from its magnitude doubled, plus 1 if a fraction follows
    (`_appendPreshiftedIntegerPortion`): a type byte that counts its bytes, then the bytes."""
    n = (preshifted.bit_length() + 7) // 8
    ctype = NUM_NEG_1BYTE + 1 - n if negative else NUM_POS_1BYTE - 1 + n
    return bytes([ctype]) + magnitude_bytes(preshifted.to_bytes(n, "big"), negative)


def double_bits(value: float) -> int:
    return int.from_bytes(struct.pack(">d", value), "big")


def double_from_bits(bits: int) -> float:
    return float(struct.unpack(">d", bits.to_bytes(8, "big"))[0])
