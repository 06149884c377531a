"""jstests/change_streams/migrate_last_chunk_from_shard_event.js (requires_fcv_60,
requires_sharding): moving a collection's last chunk off a shard gives a
`migrateLastChunkFromShard` event naming that shard, with showExpandedEvents and
showSystemEvents only; a stream resumes after it. On collection and database streams."""

from tests.conformance.model import DB, OTHER_SHARD, PRIMARY_SHARD, Case, uuid_of

SOURCE = "jstests/change_streams/migrate_last_chunk_from_shard_event.js"
NS = {"db": DB, "coll": "test"}
SKIP_CREATES = ({"$match": {"operationType": {"$nin": ["create", "createIndexes"]}}},)
SETUP = (
    ("admin", {"enableSharding": DB}),
    ("insert", "test", {"_id": 1}),
    ("admin", {"shardCollection": f"{DB}.test", "key": {"_id": 1}}),
)
MOVE = ("admin", {"moveChunk": f"{DB}.test", "find": {"_id": 0}, "to": OTHER_SHARD})
INSERT = {
    "operationType": "insert",
    "ns": NS,
    "fullDocument": {"_id": 2},
    "documentKey": {"_id": 2},
}


def _options(system: bool) -> dict:
    return {"showExpandedEvents": True, "showSystemEvents": system}


CASES = [
    *[
        Case(
            f"migrate-last-chunk-{watch}",
            SOURCE,
            watch,
            coll="test",
            options=_options(True),
            setup=SETUP,
            pipeline=SKIP_CREATES,
            ops=(MOVE,),
            expect=(
                {
                    "operationType": "migrateLastChunkFromShard",
                    "ns": NS,
                    "collectionUUID": uuid_of("test"),
                    "operationDescription": {"shardId": PRIMARY_SHARD},
                },
            ),
        )
        for watch in ("collection", "database")
    ],
    *[
        Case(
            f"migrate-last-chunk-{watch}-resume",
            SOURCE,
            watch,
            coll="test",
            options=_options(True),
            setup=SETUP,
            pipeline=SKIP_CREATES,
            ops=(MOVE, ("insert", "test", {"_id": 2})),
            resume=("resumeAfter", 0),
            resume_pipeline=(),
            expect=(INSERT,),
        )
        for watch in ("collection", "database")
    ],
    Case(
        "migrate-last-chunk-hidden-without-system-events",
        SOURCE,
        "collection",
        coll="test",
        options=_options(False),
        setup=SETUP,
        pipeline=SKIP_CREATES,
        ops=(MOVE, ("insert", "test", {"_id": 2})),
        expect=(INSERT,),
    ),
]
