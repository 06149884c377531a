"""The pure half of a parallelChangeStream command (buckets/commands.py): read into an
OpenRequest, and its pipeline into the $match applied as events are dealt, without sockets."""

from __future__ import annotations

import pytest
from bson import Timestamp

from buckets.commands import OpenRequest, open_match, read_drop, read_open
from mongoformats.errors import MongoError
from mongoformats.resume_token import high_water_mark


def test_an_open_command_reads_into_a_request_without_its_null_options():
    request = read_open(
        {
            "parallelChangeStream": 1,
            "nBuckets": 4,
            "name": "s",
            "batchSize": 10,
            "fullDocument": None,
        }
    )
    assert request == OpenRequest(
        {"parallelChangeStream": 1, "nBuckets": 4, "name": "s", "batchSize": 10}, 4, None, "s", 10
    )


def test_bucket_tokens_of_another_count_are_one_token_if_common():
    token = high_water_mark(Timestamp(10, 1))
    request = read_open({"parallelChangeStream": 1, "nBuckets": 4, "resumeAfter": [token, token]})
    assert request.cmd["resumeAfter"] == token
    with pytest.raises(MongoError) as info:
        read_open(
            {
                "parallelChangeStream": 1,
                "nBuckets": 4,
                "resumeAfter": [token, high_water_mark(Timestamp(11, 1))],
            }
        )
    assert info.value.code_name == "BadValue"


@pytest.mark.parametrize(
    ("field", "value", "code_name"),
    [
        ("fullDocument", "sometimes", "BadValue"),
        ("fullDocumentBeforeChange", 1, "TypeMismatch"),
        ("bucketBy", "shard", "BadValue"),
        ("surprise", 1, "IDLUnknownField"),
    ],
)
def test_a_bad_option_fails_with_the_servers_code(field, value, code_name):
    with pytest.raises(MongoError) as info:
        read_open({"parallelChangeStream": 1, "nBuckets": 2, field: value})
    assert info.value.code_name == code_name


def test_match_stages_fold_into_one_flat_and():
    assert open_match({"pipeline": []}) == (None, False)
    assert open_match({"pipeline": [{"$match": {"a": 1}}]}) == ({"a": 1}, False)
    assert open_match(
        {
            "pipeline": [
                {"$match": {"a": 1}},
                {"$match": {"b": 2}},
                {"$changeStreamSplitLargeEvent": {}},
            ]
        }
    ) == ({"$and": [{"a": 1}, {"b": 2}]}, True)


def test_a_match_may_not_test_what_lookups_add():
    with pytest.raises(MongoError) as info:
        open_match(
            {"fullDocument": "updateLookup", "pipeline": [{"$match": {"fullDocument.a": 1}}]}
        )
    assert info.value.code_name == "BadValue" and "runs before the lookups" in info.value.errmsg
    with pytest.raises(MongoError, match="may only contain \\$match stages"):
        open_match({"pipeline": [{"$project": {"a": 1}}]})


def test_a_drop_command_names_one_stream_by_a_string():
    assert read_drop({"dropParallelChangeStream": "s"}) == "s"
    with pytest.raises(MongoError) as info:
        read_drop({"dropParallelChangeStream": 1})
    assert info.value.code_name == "TypeMismatch"
    with pytest.raises(MongoError) as info:
        read_drop({"dropParallelChangeStream": "x" * 256})
    assert info.value.code_name == "InvalidNamespace"
