"""The pure half of an accelerated watch() (buckets/watch_command.py): which aggregates the engine
serves, the errors mongos would give for malformed ones, and the private stream planned for the
rest. No sockets, no event loop."""

import uuid
from typing import Any

import pytest
from bson import Timestamp

from buckets.commands import MAX_PIPELINE_STAGES
from buckets.ports import Decline
from buckets.watch_command import plan_watch, read_watch
from mongoformats.errors import MongoError
from mongoformats.resume_token import ResumeTokenData, encode_token, high_water_mark

AT = Timestamp(1_700_000_000, 3)
BUFFER = 1 << 20


def watch(*stages: dict[str, Any], coll: Any = "c", **spec: Any) -> dict[str, Any]:
    """A driver's watch() aggregate: {$changeStream: spec} and `stages`."""
    return {"aggregate": coll, "pipeline": [{"$changeStream": spec}, *stages], "cursor": {}}


def plan(db: str, cmd: dict[str, Any]) -> Any:
    return plan_watch(read_watch(db, cmd), cmd, shard_buffer_bytes=BUFFER)


def event_token(**fields: Any) -> dict[str, Any]:
    return encode_token(
        ResumeTokenData(
            AT,
            uuid=uuid.UUID(int=7),
            event_identifier={"operationType": "insert", "documentKey": {"_id": 1}},
            **fields,
        )
    )


def test_a_collections_watch_is_one_private_bucket_scoped_to_it():
    p = plan("db", watch())
    assert p.open == {
        "nBuckets": 1,
        "showExpandedEvents": False,
        "showSystemEvents": False,
        "fullDocument": "default",
        "fullDocumentBeforeChange": "off",
        "shardBufferBytes": BUFFER,
        "pipeline": [],
    }
    assert (p.scope, p.ns, p.stages) == (("db", "c"), "db.c", ())
    assert (p.event_token, p.keep_version) == (None, None)
    assert read_watch("db", watch()).resource == {"db": "db", "collection": "c"}


def test_a_cluster_wide_watch_runs_on_admin_only():
    cmd = watch(coll=1, allChangesForCluster=True)
    p = plan("admin", cmd)
    assert (p.scope, p.ns) == (None, "admin.$cmd.aggregate")
    assert read_watch("admin", cmd).resource == {"db": "", "collection": ""}
    with pytest.raises(Decline):  # mongos answers a misplaced stream with its own error
        read_watch("db", cmd)


def test_match_stages_filter_as_events_are_dealt_and_other_stages_run_per_event():
    match = {"$match": {"operationType": "insert"}}
    p = plan("db", watch(match))
    assert (p.open["pipeline"], p.stages) == ([match], ())
    project = {"$project": {"fullDocument": 1}}
    p = plan("db", watch(match, project))
    assert (p.open["pipeline"], p.stages) == ([], (match, project))
    # A lookup the $match may test: the whole pipeline runs on each returned event.
    p = plan("db", watch(match, fullDocument="updateLookup"))
    assert (p.open["pipeline"], p.stages) == ([], (match,))


@pytest.mark.parametrize(
    "cmd",
    [
        {**watch(), "explain": True},
        {**watch(), "hint": {"a": 1}},
        {**watch(), "collation": {"locale": "fr"}},
        watch(fullDocument="sometimes"),
        watch(resumeAfter=high_water_mark(AT), startAtOperationTime=AT),
        watch(unknownOption=1),
        watch(showExpandedEvents="yes"),
    ],
    ids=[
        "explain",
        "hint",
        "collation",
        "fullDocument",
        "two starts",
        "unknown option",
        "mistyped",
    ],
)
def test_what_changes_mongos_answer_is_left_to_mongos(cmd):
    with pytest.raises(Decline):
        read_watch("db", cmd)


def test_a_simple_collation_is_as_none():
    assert plan("db", {**watch(), "collation": {"locale": "simple"}}).scope == ("db", "c")


def test_malformed_commands_fail_with_mongos_errors():
    """mongos's codes and messages: DocumentSourceChangeStream refuses a readConcern other than
    majority (jstests/noPassthrough/change_stream_require_majority_read_concern.js);
    Pipeline::parseCommon limits a pipeline's length (sharding/query/pipeline_length_limit.js)."""
    with pytest.raises(MongoError) as info:
        read_watch("db", {**watch(), "readConcern": {"level": "local"}})
    assert (info.value.code_name, info.value.errmsg) == (
        "InvalidOptions",
        "Aggregation stage $changeStream cannot run with a readConcern other "
        "than 'majority'. Current readConcern: local",
    )
    long = watch(*[{"$match": {}}] * MAX_PIPELINE_STAGES)
    with pytest.raises(MongoError) as info:
        read_watch("db", long)
    assert info.value.code == 7749501


def test_resuming_after_an_event_starts_at_its_time_and_must_meet_it_again():
    token = event_token()
    p = plan("db", watch(resumeAfter=token))
    assert p.open["resumeAfter"] == high_water_mark(AT)
    assert p.event_token == token and p.fragment is None
    assert p.keep_version == (AT, 2)


def test_resuming_after_an_invalidate_or_a_fragment_without_the_split_stage_is_left_to_mongos():
    request = read_watch("db", watch(startAfter=event_token(from_invalidate=True)))
    with pytest.raises(Decline):
        plan_watch(request, watch(), shard_buffer_bytes=BUFFER)
    request = read_watch("db", watch(resumeAfter=event_token(fragment_num=1)))
    with pytest.raises(Decline):
        plan_watch(request, watch(), shard_buffer_bytes=BUFFER)


def test_a_start_time_and_a_high_water_mark_pass_as_they_are():
    assert plan("db", watch(startAtOperationTime=AT)).open["startAtOperationTime"] == AT
    mark = high_water_mark(AT)
    p = plan("db", watch(resumeAfter=mark))
    assert (p.open["resumeAfter"], p.event_token) == (mark, None)
