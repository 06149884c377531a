"""Hashed index values: the server's hasher test vectors (hasher_test.cpp), value for value."""

import pytest
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex
from bson.datetime_ms import DatetimeMS

from mongoformats.hashed_key import hashed_value

DOUBLE_MAX = 1.7976931348623157e308

VECTORS = [
    (42, -944302157085130861),
    (42.123, -944302157085130861),
    (Int64(42), -944302157085130861),
    (0, 4854801880128277513),
    (0.456, 4854801880128277513),
    (float("nan"), 4854801880128277513),
    (1, 5902408780260971510),
    (1.987, 5902408780260971510),
    (-1, 1140205862565771219),
    (-1.789, 1140205862565771219),
    (-(2**31), 6165898260261354870),
    (2**31 - 1, 1143184177162245883),
    (DOUBLE_MAX, 921523596458303250),
    (Int64(2**63 - 1), 921523596458303250),
    (-DOUBLE_MAX, 4532067210535695462),
    (Int64(-(2**63)), 4532067210535695462),
    (MinKey(), 7961148599568647290),
    (MaxKey(), 5504842513779440750),
    ("abc", 8478485326885698097),
    ("", 2049396243249673340),
    ({"a": "abc", "b": Int64(123)}, 4771603801758380216),
    ({}, 7980500913326740417),
    (["bar", "baz", "qux"], -2938911267422831539),
    ([], 8849948234993459283),
    (Binary(bytes([0, 1, 2, 3, 4, 6]), 0), 7252465090394235301),
    (Binary(bytes([0, 1, 2, 3, 4, 6]), 128), 5736670452907618262),
    (Binary(bytes(range(16)), 4), 6084661258071355978),
    (ObjectId("010203040506070809101112"), -5588663249627035708),
    (ObjectId("000000000000000000000000"), -4293118519463489418),
    (True, 6405873908747105701),
    (False, 6289544573401934092),
    (DatetimeMS(0x5566778811223344), 4476222765095560467),
    (DatetimeMS(0), -1178696894582842035),
    (Regex("mongodb"), -7275792090268217043),
    (Regex(".*", "i"), 7095855029187981886),
    (Code("func f() { return 1; }"), 6861638109178014270),
    (Code("func f() { return 1; }", {"c": True}), 501342939894575968),
]


@pytest.mark.parametrize(("value", "want"), VECTORS)
def test_the_servers_hash_vectors(value, want):
    assert hashed_value(value) == want


# Numbers squash to an int64 by BSONElement::safeNumberLongForHash (bsonelement.h); the server's
# vectors above miss its two edges, so these pairs say which int64 each value must hash as.
SQUASHED = [
    (2.0**63, Int64(-(2**63))),  # an overflow of old, kept: the double 2^63 hashes as -2^63
    (float("inf"), Int64(2**63 - 1)),
    (float("-inf"), Int64(-(2**63))),
    (Decimal128("42"), 42),
    (Decimal128("1.4"), 1),
    (Decimal128("1.5"), 2),
    (Decimal128("2.5"), 2),
    (Decimal128("1.7"), 2),
    (Decimal128("-1.5"), -2),
    (Decimal128("-0.5"), 0),  # Decimal128::toLong: half to even
    (Decimal128("NaN"), 0),
    (Decimal128("Infinity"), Int64(2**63 - 1)),
    (Decimal128("-Infinity"), Int64(-(2**63))),
    (Decimal128("1E+30"), Int64(2**63 - 1)),
    (Decimal128("-1E+30"), Int64(-(2**63))),
]


@pytest.mark.parametrize(("value", "same_as"), SQUASHED)
def test_numbers_hash_as_the_int64_they_squash_to(value, same_as):
    assert hashed_value(value) == hashed_value(Int64(same_as))
