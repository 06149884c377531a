"""Decimal128 values in KeyStrings (V1), as the server writes them into resume tokens.

Source (facts only): mongodb/mongo src/mongo/db/storage/key_string.cpp (`_appendNumberDecimal`,
`_appendDoubleWithoutTypeBits`, `TypeBits::appendDecimalZero` / `appendDecimalExponent`) and
key_string.h (`DecimalContinuationMarker`, `kStoredDecimalExponentBits`).

A decimal is keyed by the double nearest to it toward zero, so that decimals, doubles and
integers of equal value have equal keys and all numbers sort by value together:
- a decimal that is exactly a double is keyed as that double (marker 0);
- one that is that double rounded up to 15 significant digits takes marker 2 in the double's
  spare low bits;
- any other stores marker 1 (below that 15-digit rounding) or 3 (above it) and is followed by an
  8-byte "continuation": the 34-digit remainder after the double, as an integer in units of the
  last digit of the double rounded up to 34 digits. Whole parts from 2**53 to 2**63 are written as
  integers instead, so they still compare exactly with integers.
The type bits keep what the order ignores: `11` (decimal) and the low 6 bits of the biased
exponent, enough to recover the exact representation (1.0 vs 1.00); zeros keep all 15 bits of
theirs and their sign.

Decimal128 arithmetic is done exactly with Python's `decimal` (a double's exact value, rounding
to 15 or 34 digits in a given direction). Beyond the normal doubles (`_appendTinyDecimal...`,
`_appendHugeDecimal...`): below the subnormals and above the largest double a decimal is keyed by
its own 128 bits (normalized to 34 digits); in the subnormal range by its double scaled up by
2**256 in the decimal domain, then a continuation.
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Callable
from decimal import ROUND_CEILING, ROUND_DOWN, Context, Decimal

from bson.decimal128 import Decimal128

from mongoformats.keystring_numbers import (
    NUM_NEG_LARGE,
    NUM_NEG_SMALL,
    NUM_POS_LARGE,
    NUM_POS_SMALL,
    NUM_ZERO,
    double_key,
    preshifted_key,
)

__all__ = ["decimal_key", "read_decimal", "read_decimal_value", "read_decimal_zero"]

DECIMAL_BITS = (1, 1)  # TypeBits::kDecimal
_EXPONENT_BITS = 6  # TypeBits::kStoredDecimalExponentBits
_BIAS = 6176  # Decimal128's exponent bias
_ZERO_KINDS = 12288  # biased exponents (0..12287) of positive zeros; negative ones follow
_DECIMAL_ZERO_0XXX = 0x1A  # first 5-bit prefix of a decimal zero (0b11010)
# Decimal continuation markers (key_string.h).
DCM_EQUAL, DCM_BELOW_15, DCM_EQUAL_15, DCM_ABOVE_15 = 0, 1, 2, 3
_DBL_MIN, _DBL_MAX = sys.float_info.min, sys.float_info.max
_MIN_LARGE = 2.0**63
_MAX_INT_FOR_DOUBLE = 2.0**53
_TINIEST_2BIT_DCM = 2.0**-255
_EXACT = Context(prec=1000, Emin=-100000, Emax=100000)  # a double's exact value has < 800 digits
# Decimal128's precision, toward zero.
_DOWN_34 = Context(prec=34, rounding=ROUND_DOWN, Emin=-100000, Emax=100000)
_MAX_EXPONENT = 6111
_U64 = (1 << 64) - 1
# 2**256 and 2**-256 as Decimal128 holds them: rounded down to 34 digits (underestimates).
_UPSHIFT = Context(prec=34, rounding=ROUND_DOWN).plus(Decimal(2.0**256))
_DOWNSHIFT = Context(prec=34, rounding=ROUND_DOWN, Emin=-100000).plus(Decimal(2.0**-256))


def _rounded(value: Decimal, digits: int, rounding: str) -> Decimal:
    return Context(prec=digits, rounding=rounding, Emin=-100000, Emax=100000).plus(value)


def _toward_zero_double(d: Decimal) -> tuple[float, bool]:
    """The double nearest `d` toward zero, and whether it is exact (Decimal128::toDouble with
    kRoundTowardZero and its inexact flag; an overflow gives the largest double, inexact)."""
    f = float(d)  # correctly rounded to nearest
    if math.isinf(f):
        return math.copysign(_DBL_MAX, f), False
    exact = Decimal(f)
    if exact == d:
        return f, True
    if exact.copy_abs() > d.copy_abs():
        f = math.nextafter(f, 0.0)
    return f, False


def _exponent_bits(biased: int) -> list[int]:
    low = biased & ((1 << _EXPONENT_BITS) - 1)
    return [(low >> i) & 1 for i in range(_EXPONENT_BITS - 1, -1, -1)]


def _zero_bits(value: Decimal) -> list[int]:
    """Type bits of a decimal zero: a 5-bit prefix and 12 bits naming its exponent and sign."""
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    which = exponent + _BIAS + (_ZERO_KINDS if value.is_signed() else 0)
    head = (which >> 12) + _DECIMAL_ZERO_0XXX
    head_bits = [(head >> i) & 1 for i in range(4, -1, -1)]
    return head_bits + [(which >> i) & 1 for i in range(11, -1, -1)]


def read_decimal_zero(head: int, low_bits: int) -> Decimal128:
    """The decimal zero named by a 5-bit prefix (0b11010..0b11111) and the 12 bits after it."""
    negative, biased = divmod(((head - _DECIMAL_ZERO_0XXX) << 12) | low_bits, _ZERO_KINDS)
    if head < _DECIMAL_ZERO_0XXX or negative > 1:
        raise ValueError("invalid decimal zero type bits in a KeyString")
    return Decimal128(Decimal((negative, (0,), biased - _BIAS)))


def decimal_key(value: Decimal128) -> tuple[bytes, list[int]]:
    """(type byte and body, type bits) of `value`."""
    d = value.to_decimal()
    negative = d.is_signed()
    if d.is_nan():
        return double_key(math.nan), list(DECIMAL_BITS)
    if d.is_infinite():
        return double_key(-math.inf if negative else math.inf), list(DECIMAL_BITS)
    if d.is_zero():
        return bytes([NUM_ZERO]), _zero_bits(d)
    exponent = d.as_tuple().exponent
    assert isinstance(exponent, int)
    return _key(d, negative), [*DECIMAL_BITS, *_exponent_bits(exponent + _BIAS)]


def _key(d: Decimal, negative: bool) -> bytes:
    bin_, exact = _toward_zero_double(d)
    if exact:  # the decimal is a double: 1.5, most integers, ...
        return double_key(bin_, DCM_EQUAL)
    magnitude = abs(bin_)
    if magnitude < _DBL_MIN:
        return _tiny_key(d.copy_abs(), magnitude, negative)
    if magnitude >= _DBL_MAX:
        return _huge_key(d, negative)
    if magnitude >= _MIN_LARGE or magnitude < _TINIEST_2BIT_DCM:
        # One marker bit only in these ranges: always a continuation.
        key = double_key(bin_, DCM_ABOVE_15)
        stored = _rounded(Decimal(magnitude), 34, ROUND_CEILING)
        return key + _continuation(d.copy_abs(), stored, negative)
    if magnitude >= _MAX_INT_FOR_DOUBLE:
        return _large_integer_key(d, negative)
    return _double_range_key(d, bin_, negative)


def _huge_key(d: Decimal, negative: bool) -> bytes:
    """Beyond the doubles: the decimal's own bits, with the top bit set (a finite double's is
    clear), so it sorts between the largest double and infinity."""
    hi, lo = _bid_words(_normalized(d.copy_abs()))
    ctype = NUM_NEG_LARGE if negative else NUM_POS_LARGE
    return bytes([ctype]) + _words(hi | 1 << 63, lo, negative)


def _large_integer_key(d: Decimal, negative: bool) -> bytes:
    """Where the double may have lost whole-number digits: the whole part is written as an
    integer with its "has a fraction" bit, then (below 2**55, where a byte is spare) a marker."""
    whole = int(d.copy_abs())
    has_fraction = Decimal(whole) != d.copy_abs()
    key = preshifted_key((whole << 1) | has_fraction, negative)
    if not has_fraction:
        return key
    if whole < 2**55:
        key += bytes([DCM_ABOVE_15 ^ (0xFF if negative else 0)])
    return key + _continuation(d.copy_abs(), Decimal(whole), negative)


def _double_range_key(d: Decimal, bin_: float, negative: bool) -> bytes:
    """Within the doubles' two-bit marker range: the double, marked by how the decimal compares
    with it rounded up to 15 digits, then a continuation unless those 15 digits are the
    decimal."""
    if _coefficient(d) < 10**15:
        # At most 15 digits: the double rounded up to 15 digits is the decimal.
        return double_key(bin_, DCM_EQUAL_15)
    magnitude = abs(bin_)
    from_bin = _rounded(Decimal(magnitude), 15, ROUND_CEILING)
    if from_bin == d.copy_abs():
        return double_key(bin_, DCM_EQUAL_15)
    key = double_key(bin_, DCM_BELOW_15 if d.copy_abs() < from_bin else DCM_ABOVE_15)
    stored = _rounded(Decimal(magnitude), 34, ROUND_CEILING)
    return key + _continuation(d.copy_abs(), stored, negative)


def _tiny_key(magnitude: Decimal, bin_magnitude: float, negative: bool) -> bytes:
    """A decimal below the normal doubles (`_appendTinyDecimalWithoutTypeBits`)."""
    ctype = bytes([NUM_NEG_SMALL if negative else NUM_POS_SMALL])
    if bin_magnitude == 0.0:  # below the smallest subnormal: the decimal's own bits (top two clear)
        return ctype + _words(*_bid_words(_normalized(magnitude)), negative)
    # Scaled up by (about) 2**256 in the decimal domain, rounding down at each step; the double
    # of that, and a continuation from the stored value scaled back down.
    scaled = _toward_zero_double(_DOWN_34.multiply(magnitude, _UPSHIFT))[0]
    scaled = max(scaled, bin_magnitude * 2.0**256)
    encoded = ((_double_bits(scaled) << 1) | 1) + (1 << 62)  # marker bit set even if exact
    stored = _DOWN_34.multiply(_rounded(Decimal(scaled), 34, ROUND_DOWN), _DOWNSHIFT)
    return ctype + _word(encoded, negative) + _continuation(magnitude, stored, negative)


def _normalized(magnitude: Decimal) -> Decimal:
    """`magnitude` with the most digits it can have (34, within the exponent range): Decimal128's
    normalize(), an addition of 0E-6176."""
    digits = magnitude.as_tuple().digits
    exponent = max(magnitude.adjusted() - 33, -_BIAS)
    coefficient = int(_EXACT.scaleb(magnitude, -exponent)) if digits else 0
    return Decimal((0, tuple(map(int, str(coefficient))), exponent))


def _bid_words(value: Decimal) -> tuple[int, int]:
    """The high and low 64 bits of a positive finite Decimal128 (BID: exponent, then
    coefficient)."""
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    coefficient = _coefficient(value)
    return ((exponent + _BIAS) << 49) | (coefficient >> 64), coefficient & _U64


def _from_bid(hi: int, lo: int) -> Decimal:
    coefficient = ((hi & ((1 << 49) - 1)) << 64) | lo
    return Decimal((0, tuple(map(int, str(coefficient))), ((hi >> 49) & 0x3FFF) - _BIAS))


def _word(value: int, negative: bool) -> bytes:
    """8 bytes big-endian, inverted for a negative number (whose magnitude's bytes sort
    reversed)."""
    body = value.to_bytes(8, "big")
    return bytes(b ^ 0xFF for b in body) if negative else body


def _words(hi: int, lo: int, negative: bool) -> bytes:
    return _word(hi, negative) + _word(lo, negative)


def _double_bits(value: float) -> int:
    return int.from_bytes(struct.pack(">d", value), "big")


def _double_from_bits(bits: int) -> float:
    return float(struct.unpack(">d", bits.to_bytes(8, "big"))[0])


def _coefficient(d: Decimal) -> int:
    return int("".join(map(str, d.as_tuple().digits)))


def _continuation(magnitude: Decimal, stored: Decimal, negative: bool) -> bytes:
    """The 8 bytes after the double: what the decimal exceeds the stored value by, in units of
    the stored value's 34th digit (the stored value normalized to 34 digits)."""
    unit = max(stored.adjusted() - 33, -_BIAS)
    steps = _EXACT.scaleb(_EXACT.subtract(magnitude, stored), -unit)
    if steps < 0 or steps != steps.to_integral_value() or steps >= 1 << 64:
        # never, by construction
        raise ValueError(f"no decimal continuation for {magnitude} above {stored}")
    return _word(int(steps), negative)


def read_decimal(
    large: bool, encoded: int, negative: bool, next_word: Callable[[], int], exponent_bits: int
) -> Decimal128:
    """The finite decimal behind a small- or large-magnitude key whose 8 bytes are `encoded`
    (un-inverted); `next_word()` reads the next 8 (a continuation, or a decimal's low bits)."""
    if large:
        return _read_large(encoded, negative, next_word, exponent_bits)
    if encoded >> 62 == 0b11:
        dcm = encoded & 3
        return _read_marked(
            _double_from_bits(encoded >> 2), dcm, negative, next_word, exponent_bits
        )
    if encoded >> 62 == 0:  # below the subnormals: the decimal's own bits
        return _with_exponent(_from_bid(encoded, next_word()), negative, exponent_bits)
    return _read_scaled(encoded, negative, next_word, exponent_bits)


def _read_large(
    encoded: int, negative: bool, next_word: Callable[[], int], exponent_bits: int
) -> Decimal128:
    """A large-magnitude key: beyond the doubles the decimal's own bits, else a double with a
    one-bit marker."""
    if encoded >> 63:  # beyond the doubles: the decimal's own bits
        own = _from_bid(encoded & ~(1 << 63), next_word())
        return _with_exponent(own, negative, exponent_bits)
    bin_magnitude = _double_from_bits((encoded >> 1) | (1 << 62))
    dcm = DCM_ABOVE_15 if encoded & 1 else DCM_EQUAL
    return _read_marked(bin_magnitude, dcm, negative, next_word, exponent_bits)


def _read_scaled(
    encoded: int, negative: bool, next_word: Callable[[], int], exponent_bits: int
) -> Decimal128:
    """A tiny key, scaled up by 2**256: in the subnormal range the stored value plus its
    continuation, else a double with a one-bit marker."""
    scaled = _double_from_bits((encoded - (1 << 62)) >> 1)
    if encoded & 1 and scaled < _DBL_MIN * 2.0**256:  # a decimal in the subnormal range
        stored = _DOWN_34.multiply(_rounded(Decimal(scaled), 34, ROUND_DOWN), _DOWNSHIFT)
        return _with_exponent(_plus_steps(stored, next_word()), negative, exponent_bits)
    bin_magnitude = math.ldexp(scaled, -256)
    dcm = DCM_ABOVE_15 if encoded & 1 else DCM_EQUAL
    return _read_marked(bin_magnitude, dcm, negative, next_word, exponent_bits)


def _read_marked(
    bin_magnitude: float, dcm: int, negative: bool, next_word: Callable[[], int], exponent_bits: int
) -> Decimal128:
    """The decimal of a double and its marker, reading the continuation the marker announces."""
    continuation = next_word() if dcm in (1, 3) else None
    return read_decimal_value(Decimal(bin_magnitude), dcm, continuation, negative, exponent_bits)


def read_decimal_value(
    bin_magnitude: Decimal,
    dcm: int,
    continuation: int | None,
    negative: bool,
    stored_exponent_bits: int,
) -> Decimal128:
    """The decimal a key holds: its exact magnitude from the double (as an exact Decimal) and the
    marker and continuation, then the one exponent in its cohort whose low 6 bits are stored."""
    if dcm == DCM_EQUAL:
        magnitude = bin_magnitude
    elif dcm == DCM_EQUAL_15:
        magnitude = _rounded(bin_magnitude, 15, ROUND_CEILING)
    else:
        if continuation is None:
            raise ValueError("a decimal continuation is missing")
        magnitude = _plus_steps(_rounded(bin_magnitude, 34, ROUND_CEILING), continuation)
    return _with_exponent(magnitude, negative, stored_exponent_bits)


def _plus_steps(stored: Decimal, steps: int) -> Decimal:
    """`stored` plus `steps` units of its 34th digit (a continuation's meaning)."""
    return _EXACT.add(stored, _EXACT.scaleb(Decimal(steps), max(stored.adjusted() - 33, -_BIAS)))


def _with_exponent(magnitude: Decimal, negative: bool, stored_exponent_bits: int) -> Decimal128:
    """The representation of `magnitude` whose biased exponent ends in the stored 6 bits: its
    cohort (the exponents it can be written with in 34 digits) spans fewer than 64."""
    reduced = magnitude.normalize(_EXACT)
    digits = len(reduced.as_tuple().digits)
    top = reduced.as_tuple().exponent
    assert isinstance(top, int)
    for exponent in range(max(top - (34 - digits), -_BIAS), min(top, _MAX_EXPONENT) + 1):
        if (exponent + _BIAS) % (1 << _EXPONENT_BITS) == stored_exponent_bits:
            value = magnitude.quantize(Decimal((0, (1,), exponent)), context=_EXACT)
            return Decimal128(value.copy_negate() if negative else value)
    raise ValueError("invalid decimal exponent bits in a KeyString")
