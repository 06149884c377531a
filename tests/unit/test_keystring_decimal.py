"""Decimal128 document keys in resume tokens (mongoformats/keystring_decimal.py).

No server-made token with a decimal key was available to compare bytes with, so these tests pin
what the format guarantees and what our other numeric encodings (checked against real tokens)
already fix:
- a decimal equal to a double or an integer has exactly that number's key bytes;
- keys of decimals, doubles and integers sort as their values do, equal values giving equal
  keys: the continuation bytes and markers can only be right if this holds everywhere;
- a key and its type bits give back the decimal exactly, exponent included (1.0 is not 1.00).
"""

from __future__ import annotations

import math
from decimal import Context, Decimal
from fractions import Fraction
from typing import Any

import pytest
from bson import Int64, Timestamp
from bson.decimal128 import Decimal128
from hypothesis import given, settings
from hypothesis import strategies as st

from mongoformats.keystring import KeyStringBuilder
from mongoformats.keystring_reader import KeyStringReader
from mongoformats.resume_token import ResumeTokenData, decode_token, encode_token


def key(value: Any) -> tuple[bytes, bytes]:
    ks = KeyStringBuilder()
    ks.append(value)
    return ks.data, ks.type_bits


def exact(value: Any) -> Fraction:
    if isinstance(value, Decimal128):
        return Fraction(value.to_decimal())
    return Fraction(value)


# Decimals inside the normal double range (the encodings beyond it are not written).
coefficients = st.integers(min_value=1, max_value=10**34 - 1)
decimals = st.builds(
    lambda c, e, neg: Decimal128(Decimal((int(neg), tuple(map(int, str(c))), e))),
    coefficients,
    st.integers(min_value=-300, max_value=250),
    st.booleans(),
).filter(lambda d: 1e-300 < abs(float(d.to_decimal())) < 1e300)


# Decimals near doubles and integers, where the markers and continuations decide the order: a
# double's exact value rounded to 1..34 digits, and its decimal neighbours at that precision.
def _near(f: float, digits: int, nudge: int) -> Decimal128:
    ctx = Context(prec=digits, Emin=-999999, Emax=999999)
    d = ctx.plus(Decimal(f))
    if nudge:
        d = ctx.next_plus(d) if nudge > 0 else ctx.next_minus(d)
    return Decimal128(d)


near_doubles = st.builds(
    _near,
    st.floats(min_value=-1e30, max_value=1e30).filter(lambda f: abs(f) > 1e-200),
    st.integers(min_value=1, max_value=34),
    st.sampled_from((-1, 0, 1)),
)
doubles = st.floats(allow_nan=False, allow_infinity=False).filter(
    lambda f: f == 0 or 1e-300 < abs(f) < 1e300
)
integers = st.one_of(
    st.integers(min_value=-(2**31), max_value=2**31 - 1),
    st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1).map(Int64),
)
numbers = st.one_of(decimals, near_doubles, doubles, integers)


@pytest.mark.parametrize(
    "text, double",
    [
        ("1.5", 1.5),
        ("-2.25", -2.25),
        ("1", 1.0),
        ("1.000", 1.0),
        ("0.5", 0.5),
        ("12345678", 12345678.0),
        ("-1E+20", -1e20),
    ],
)
def test_a_decimal_equal_to_a_double_has_its_key(text, double):
    assert key(Decimal128(text))[0] == key(double)[0]


@settings(max_examples=400, deadline=None)
@given(decimals | near_doubles)
def test_a_decimal_comes_back_from_its_key_exactly(value):
    data, bits = key(value)
    reader = KeyStringReader(data + b"\x04", bits)
    back = reader.read()
    reader.finish()
    assert isinstance(back, Decimal128) and back.bid == value.bid


@settings(max_examples=600, deadline=None)
@given(numbers, numbers)
def test_keys_sort_as_the_numbers_do(a, b):
    ka, kb = key(a)[0], key(b)[0]
    va, vb = exact(a), exact(b)
    assert (ka < kb) == (va < vb) and (ka == kb) == (va == vb), (a, b)


@pytest.mark.parametrize("text", ["0", "-0", "0E-20", "-0E+300", "0.000"])
def test_decimal_zeros_keep_their_exponent_and_sign(text):
    data, bits = key(Decimal128(text))
    assert data == key(0)[0]
    back = KeyStringReader(data + b"\x04", bits).read()
    assert back.bid == Decimal128(text).bid


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_decimal_nan_and_infinities_share_the_double_keys(text):
    data, bits = key(Decimal128(text))
    assert data == key(float(text.lower().replace("infinity", "inf")))[0]
    back = KeyStringReader(data + b"\x04", bits).read()
    assert str(back) == text


def test_an_event_token_with_a_decimal_document_key_round_trips():
    data = ResumeTokenData(
        Timestamp(1700000000, 3),
        2,
        128,
        0,
        False,
        None,
        {"operationType": "insert", "documentKey": {"_id": Decimal128("0.1")}},
    )
    token = encode_token(data)
    assert "_typeBits" in token  # the decimal's type bits travel with the token
    back = decode_token(token)
    assert back.event_identifier["documentKey"]["_id"].bid == Decimal128("0.1").bid


# Decimals beyond the doubles: below the subnormals and above the largest double they key by
# their own bits; in the subnormal range by a double scaled up by 2**256 and a continuation.
extremes = st.builds(
    lambda c, e, neg: Decimal128(Decimal((int(neg), tuple(map(int, str(c))), e))),
    coefficients,
    st.one_of(
        st.integers(min_value=-6176, max_value=-290), st.integers(min_value=270, max_value=6111)
    ),
    st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(
    extremes
    | st.builds(
        _near,
        st.floats(min_value=5e-324, max_value=1e-300),
        st.integers(min_value=1, max_value=34),
        st.sampled_from((-1, 0, 1)),
    )
)
def test_decimals_beyond_the_double_range_come_back_and_sort(value):
    data, bits = key(value)
    back = KeyStringReader(data + b"\x04", bits).read()
    assert back.bid == value.bid
    for other in (0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, math.inf, 1e-300):
        for o in (other, -other):
            assert (
                (data < key(o)[0]) == (exact(value) < exact(o))
                if not math.isinf(o)
                else (data < key(o)[0]) == (o > 0)
            )
