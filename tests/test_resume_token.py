"""Resume tokens: the public examples byte for byte, and a property test of round trip and order."""

import math
import uuid

import bson
import pytest
from bson import Binary, Code, DBRef, Int64, ObjectId, Regex, Timestamp
from hypothesis import given
from hypothesis import strategies as st

from mongoformats.errors import MongoError
from mongoformats.keystring import KeyStringBuilder
from mongoformats.resume_token import (
    EVENT_TOKEN,
    HIGH_WATER_MARK,
    ResumeTokenData,
    decode_token,
    encode_token,
    high_water_mark,
    token_sort_key,
)

# MongoDB manual, "Resume Tokens from Change Events" (v2 insert); also quoted in Debezium's
# SourceInfoTest.
MANUAL_V2_INSERT = (
    "82635019A0000000012B042C0100296E5A1004AB1154ACACD849A48C61756D70D3B21F463C6F7065726174696F6E5479706500"
    "3C696E736572740046646F63756D656E744B65790046645F69640064635019A078BE67426D7CF4D2000004"
)
# shared/reference/mongodb-formats.md A.8: a v0 insert token.
SEED_V0 = (
    "825F156B3F0000000229295A1004C982483732384D28AE57C6500C6018BF46645F696400645F156B3F0DE1FAAEF1"
    "B3DF830004"
)


def test_manual_v2_insert_token():
    data = decode_token({"_data": MANUAL_V2_INSERT})
    assert data == ResumeTokenData(
        Timestamp(1666193824, 1),
        2,
        EVENT_TOKEN,
        0,
        False,
        uuid.UUID("ab1154ac-acd8-49a4-8c61-756d70d3b21f"),
        {"operationType": "insert", "documentKey": {"_id": ObjectId("635019a078be67426d7cf4d2")}},
    )
    assert encode_token(data) == {"_data": MANUAL_V2_INSERT}


def test_seed_v0_token():
    data = decode_token({"_data": SEED_V0})
    assert data.version == 0 and data.event_identifier == {
        "_id": ObjectId("5f156b3f0de1faaef1b3df83")
    }
    assert encode_token(data) == {"_data": SEED_V0}


def test_high_water_marks():
    # Both quoted in mongodb-formats.md A.2 (v2 from mongo docs/change_streams.md).
    assert high_water_mark(Timestamp(1773154695, 2)) == {
        "_data": "8269B03187000000022B0429296E1404"
    }
    assert high_water_mark(Timestamp(1, 0), version=1) == {
        "_data": "8200000001000000002B0229296E04"
    }


def test_type_bits_for_double_key():
    # {_id: 3.0}: bit 7 set after six header bits and one string bit -> serialized 82 80 00
    # ("goAA").
    tok = encode_token(
        ResumeTokenData(
            Timestamp(5, 1),
            event_identifier={"operationType": "insert", "documentKey": {"_id": 3.0}},
        )
    )
    assert bytes(tok["_typeBits"]) == b"\x82\x80\x00"
    assert decode_token(tok).event_identifier["documentKey"]["_id"] == 3.0
    assert type(decode_token(tok).event_identifier["documentKey"]["_id"]) is float


def test_type_bits_for_negative_zero_key():
    # {_id: -0.0}: the zero key byte, and V1's 5-bit negative-zero code 11000 (TypeBits::appendZero
    # in key_string.cpp) after the seven header bits -> bits 7 and 8 set -> serialized 82 80 01.
    tok = encode_token(
        ResumeTokenData(
            Timestamp(5, 1),
            event_identifier={"operationType": "insert", "documentKey": {"_id": -0.0}},
        )
    )
    zero = encode_token(
        ResumeTokenData(
            Timestamp(5, 1), event_identifier={"operationType": "insert", "documentKey": {"_id": 0}}
        )
    )
    assert tok["_data"] == zero["_data"]  # -0.0 == 0 == 0.0 in the index order
    assert bytes(tok["_typeBits"]) == b"\x82\x80\x01"
    back = decode_token(tok).event_identifier["documentKey"]["_id"]
    assert type(back) is float and math.copysign(1.0, back) == -1.0


# Hand-derived from key_string.cpp's V1 double rules (_appendDoubleWithoutTypeBits,
# _appendSmallDouble, _appendLargeDouble, marker 0): the key byte and the 8 bytes that follow it.
@pytest.mark.parametrize(
    ("value", "key"),
    [
        (1.5, "2B0380000000000000"),  # 1-byte whole part 2*1+1, then the fraction .5 = 0x80
        (-1.5, "27FC7FFFFFFFFFFFFF"),  # the same bytes inverted under the negative type byte
        (0.25, "2AFF40000000000000"),  # |x| < 1: the double's bits shifted left by 2
        (2.0**70, "3308A0000000000000"),  # |x| >= 2**63: bits shifted left by 1, top bit cleared
        (math.inf, "33FFFFFFFFFFFFFFFF"),
    ],
)
def test_double_keys(value, key):
    tok = encode_token(
        ResumeTokenData(
            Timestamp(5, 1),
            event_identifier={"operationType": "insert", "documentKey": {"_id": value}},
        )
    )
    assert tok["_data"].endswith("5F6964" + "00" + key + "000004")
    assert decode_token(tok).event_identifier["documentKey"]["_id"] == value
    other = encode_token(
        ResumeTokenData(
            Timestamp(5, 1), event_identifier={"operationType": "insert", "documentKey": {"_id": 1}}
        )
    )
    assert (tok["_data"] < other["_data"]) == (value < 1)


def test_the_smallest_long_is_keyed_as_the_double_of_its_value():
    # key_string.cpp _appendInteger: no positive int64 holds 2**63, so NumberLong(-2**63) takes the
    # key of the double -2**63 (large-magnitude form), keeping its NumberLong type bits.
    def token(value):
        return encode_token(
            ResumeTokenData(
                Timestamp(5, 1),
                event_identifier={"operationType": "insert", "documentKey": {"_id": value}},
            )
        )

    long_min, double = token(Int64(-(2**63))), token(-(2.0**63))
    assert long_min["_data"] == double["_data"] and long_min["_data"].endswith(
        "5F6964001FF83FFFFFFFFFFFFF000004"
    )
    assert long_min["_typeBits"] != double["_typeBits"]
    back = decode_token(long_min).event_identifier["documentKey"]["_id"]
    assert type(back) is Int64 and back == -(2**63)


# key_string.cpp: kCode (160) then the code as a C string; kCodeWithScope (170) then the code and
# the scope's elements as an object's (_appendCodeWString); a {$ref, $id} document, which pymongo
# decodes as a DBRef, is an object like any other; kRegEx (140), pattern and flags (_appendRegex).
@pytest.mark.parametrize(
    ("value", "key"),
    [
        (Code("f"), "A06600"),
        (Code("f", {"a": 1}), "AA66001E61002B0200"),
        (DBRef("c", 1), "463C24726566003C63001E246964002B0200"),
        # kRegEx, pattern, flags as BSON stores them (pymongo decodes them into re-module bits)
        (bson.decode(bson.encode({"r": Regex("ab", "imx")}))["r"], "8C616200696D7800"),
    ],
)
def test_code_regex_and_dbref_keys(value, key):
    tok = encode_token(
        ResumeTokenData(
            Timestamp(5, 1),
            event_identifier={"operationType": "insert", "documentKey": {"_id": value}},
        )
    )
    assert tok["_data"].endswith("5F6964" + "00" + key + "000004")
    back = decode_token(tok).event_identifier["documentKey"]["_id"]
    assert bson.encode({"v": back}) == bson.encode({"v": value})


@pytest.mark.parametrize(
    "token,code",
    [
        ({"_data": 5}, 40647),
        ({"_data": "XYZ"}, 9),
        ({"_data": "8200000001000000002B0629296E04"}, 50795),
        ({"_data": "8269B03187000000022B0429296E1404", "_typeBits": Binary(b"\x01", 3)}, 40648),
    ],
)
def test_malformed_tokens_use_server_codes(token, code):
    with pytest.raises(MongoError) as info:
        decode_token(token)
    assert info.value.code == code


scalar = st.one_of(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.integers(-(2**52), 2**52).map(float),
    st.just(-0.0),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(min_size=12, max_size=12).map(ObjectId),
    st.booleans(),
    st.none(),
)
doc_key = st.dictionaries(
    st.text(min_size=1, max_size=5).filter(lambda s: "\x00" not in s),
    scalar,
    min_size=1,
    max_size=3,
)
timestamps = st.builds(Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
tokens = st.builds(
    ResumeTokenData,
    cluster_time=timestamps,
    version=st.just(2),
    token_type=st.sampled_from([HIGH_WATER_MARK, EVENT_TOKEN]),
    txn_op_index=st.integers(0, 2**31 - 1),
    from_invalidate=st.booleans(),
    uuid=st.uuids() | st.none(),
    event_identifier=st.one_of(
        st.none(), doc_key.map(lambda k: {"operationType": "insert", "documentKey": k})
    ),
)


def _same(a, b):
    # Equality that also compares BSON types (1 == 1.0 == Int64(1) in Python).
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return type(b) is float and a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return type(a) is type(b) and a == b


@given(tokens)
def test_round_trip(data):
    back = decode_token(encode_token(data))
    assert back == data and _same(back.event_identifier, data.event_identifier)


@given(tokens, tokens)
def test_byte_order_is_logical_order(a, b):
    def logical(t):
        return (
            t.cluster_time.time,
            t.cluster_time.inc,
            t.version,
            t.token_type,
            t.txn_op_index,
            t.from_invalidate,
        )

    ka, kb = token_sort_key(encode_token(a)), token_sort_key(encode_token(b))
    if logical(a) != logical(b):
        assert (ka < kb) == (logical(a) < logical(b))
    # _data strings order the same way as their bytes (uppercase hex).
    assert (ka < kb) == (encode_token(a)["_data"] < encode_token(b)["_data"])


@given(tokens)
def test_fast_event_token_path_is_byte_identical_to_the_generic_encoder(data):
    from mongoformats.resume_token import encode_token_generic

    assert encode_token(data) == encode_token_generic(data)


def _token_of(*values):
    """A token whose KeyString holds `values` in order (each field of ResumeTokenData's layout)."""
    builder = KeyStringBuilder()
    for value in values:
        builder.append(value)
    builder.append_end()
    token = {"_data": builder.data.hex().upper()}
    if builder.type_bits:
        token["_typeBits"] = Binary(builder.type_bits, 0)
    return token


TS = Timestamp(1, 1)
UUID4 = Binary(uuid.UUID(int=1).bytes, 4)


# The codes of ResumeToken::getData (src/mongo/db/pipeline/resume_token.cpp, the module's source):
# 51057 an unknown tokenType, 50855 a txnOpIndex that is not an int, 50794 a negative one, 40646
# fields after the last one a version has. decode_token answers any other field of the wrong type
# with InvalidResumeToken (260).
@pytest.mark.parametrize(
    "values,code",
    [
        ((TS, 1, 99, 0, False), 51057),
        ((TS, 1, EVENT_TOKEN, "0", False), 50855),
        ((TS, 1, EVENT_TOKEN, -1, False), 50794),
        ((TS, 1, EVENT_TOKEN, 0, 1), 260),
        ((TS, 1, EVENT_TOKEN, 0, False, Binary(b"x" * 16, 0)), 260),
        ((TS, 1, EVENT_TOKEN, 0, False, UUID4, "not an object"), 260),
        ((TS, 1, EVENT_TOKEN, 0, False, UUID4, {"_id": 1}, 7), 40646),
    ],
)
def test_tokens_with_a_malformed_field_use_server_codes(values, code):
    with pytest.raises(MongoError) as info:
        decode_token(_token_of(*values))
    assert info.value.code == code


def test_each_field_a_version_has_is_decoded():
    data = decode_token(_token_of(TS, 2, EVENT_TOKEN, 3, True, None, {"_id": 1}, 4))
    assert (data.version, data.txn_op_index, data.from_invalidate) == (2, 3, True)
    assert (data.uuid, data.event_identifier, data.fragment_num) == (None, {"_id": 1}, 4)
    v0 = decode_token(_token_of(TS, 0, 0, UUID4))
    assert (v0.token_type, v0.from_invalidate, v0.uuid) == (EVENT_TOKEN, False, uuid.UUID(int=1))
