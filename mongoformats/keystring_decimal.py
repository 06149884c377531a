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
to 15 or 34 digits in a given direction). Decimals below the normal double range (< 2.2e-308) or
above it (> 1.8e308) take further encodings that are not written here; they raise ValueError.
"""

from __future__ import annotations

import math
import sys
from decimal import ROUND_CEILING, Context, Decimal

from bson.decimal128 import Decimal128

from mongoformats.keystring import NUM_ZERO, double_key, preshifted_key

__all__ = ["decimal_key", "read_decimal_value", "read_decimal_zero"]

DECIMAL_BITS = (1, 1)          # TypeBits::kDecimal
_EXPONENT_BITS = 6             # TypeBits::kStoredDecimalExponentBits
_BIAS = 6176                   # Decimal128's exponent bias
_ZERO_KINDS = 12288            # biased exponents (0..12287) of positive zeros; negative ones follow
_DECIMAL_ZERO_0XXX = 0x1A      # first 5-bit prefix of a decimal zero (0b11010)
# Decimal continuation markers (key_string.h).
DCM_EQUAL, DCM_BELOW_15, DCM_EQUAL_15, DCM_ABOVE_15 = 0, 1, 2, 3
_DBL_MIN, _DBL_MAX = sys.float_info.min, sys.float_info.max
_MIN_LARGE = 2.0**63
_MAX_INT_FOR_DOUBLE = 2.0**53
_TINIEST_2BIT_DCM = 2.0**-255
_EXACT = Context(prec=1000, Emin=-100000, Emax=100000)  # a double's exact value has < 800 digits


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
    return [(head >> i) & 1 for i in range(4, -1, -1)] + [(which >> i) & 1 for i in range(11, -1, -1)]


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
    if magnitude < _DBL_MIN or magnitude >= _DBL_MAX:
        raise ValueError(f"KeyString encoding of the Decimal128 {d} (outside the normal double range) "
                         "is not supported")
    if magnitude >= _MIN_LARGE or magnitude < _TINIEST_2BIT_DCM:
        # One marker bit only in these ranges: always a continuation.
        key = double_key(bin_, DCM_ABOVE_15)
        stored = _rounded(Decimal(magnitude), 34, ROUND_CEILING)
    elif magnitude >= _MAX_INT_FOR_DOUBLE:
        # The double may have lost whole-number digits here: the whole part is written as an
        # integer with its "has a fraction" bit, then (below 2**55, where a byte is spare) a marker.
        whole = int(d.copy_abs())
        has_fraction = Decimal(whole) != d.copy_abs()
        key = preshifted_key((whole << 1) | has_fraction, negative)
        if not has_fraction:
            return key
        if whole < 2**55:
            key += bytes([DCM_ABOVE_15 ^ (0xFF if negative else 0)])
        stored = Decimal(whole)
    elif _coefficient(d) < 10**15:
        # At most 15 digits: the double rounded up to 15 digits is the decimal.
        return double_key(bin_, DCM_EQUAL_15)
    else:
        from_bin = _rounded(Decimal(magnitude), 15, ROUND_CEILING)
        if from_bin == d.copy_abs():
            return double_key(bin_, DCM_EQUAL_15)
        key = double_key(bin_, DCM_BELOW_15 if d.copy_abs() < from_bin else DCM_ABOVE_15)
        stored = _rounded(Decimal(magnitude), 34, ROUND_CEILING)
    return key + _continuation(d.copy_abs(), stored, negative)


def _coefficient(d: Decimal) -> int:
    return int("".join(map(str, d.as_tuple().digits)))


def _continuation(magnitude: Decimal, stored: Decimal, negative: bool) -> bytes:
    """The 8 bytes after the double: what the decimal exceeds the stored value by, in units of
    the stored value's 34th digit (the stored value normalized to 34 digits)."""
    unit = stored.adjusted() - 33
    steps = _EXACT.scaleb(_EXACT.subtract(magnitude, stored), -unit)
    if steps < 0 or steps != steps.to_integral_value() or steps >= 1 << 64:
        raise ValueError(f"no decimal continuation for {magnitude} above {stored}")  # never, by construction
    body = int(steps).to_bytes(8, "big")
    return bytes(b ^ 0xFF for b in body) if negative else body


def read_decimal_value(bin_magnitude: Decimal, dcm: int, continuation: int | None, negative: bool,
                       stored_exponent_bits: int) -> Decimal128:
    """The decimal a key holds: its exact magnitude from the double (as an exact Decimal) and the
    marker and continuation, then the one exponent in its cohort whose low 6 bits are stored."""
    if dcm == DCM_EQUAL:
        magnitude = bin_magnitude
    elif dcm == DCM_EQUAL_15:
        magnitude = _rounded(bin_magnitude, 15, ROUND_CEILING)
    else:
        if continuation is None:
            raise ValueError("a decimal continuation is missing")
        stored = _rounded(bin_magnitude, 34, ROUND_CEILING)
        magnitude = _EXACT.add(stored, _EXACT.scaleb(Decimal(continuation), stored.adjusted() - 33))
    reduced = magnitude.normalize(_EXACT)
    digits = len(reduced.as_tuple().digits)
    top = reduced.as_tuple().exponent
    assert isinstance(top, int)
    for exponent in range(top - (34 - digits), top + 1):
        if (exponent + _BIAS) % (1 << _EXPONENT_BITS) == stored_exponent_bits:
            value = magnitude.quantize(Decimal((0, (1,), exponent)), context=_EXACT)
            return Decimal128(value.copy_negate() if negative else value)
    raise ValueError("invalid decimal exponent bits in a KeyString")
