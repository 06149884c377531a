"""jstests/change_streams/create_event_from_chunk_migration.js (requires_fcv_60,
requires_sharding): a chunk migration to a shard without the collection shows the recipient's
`create` and `createIndexes` with showSystemEvents, and nothing without it."""

from tests.conformance.model import DB, OTHER_SHARD, Case

SOURCE = "jstests/change_streams/create_event_from_chunk_migration.js"
NS = {"db": DB, "coll": "test"}
SETUP = (
    ("admin", {"enableSharding": DB}),
    ("command", {"create": "test"}),
    ("command", {"createIndexes": "test", "indexes": [{"key": {"x": 1}, "name": "idx_x"}]}),
    ("admin", {"shardCollection": f"{DB}.test", "key": {"_id": 1}}),
    ("admin", {"split": f"{DB}.test", "middle": {"_id": 0}}),
)
MOVE = ("admin", {"moveChunk": f"{DB}.test", "find": {"_id": 0}, "to": OTHER_SHARD})

CASES = [
    Case(
        "chunk-migration-create-events",
        SOURCE,
        "collection",
        coll="test",
        setup=SETUP,
        ops=(MOVE,),
        options={"showExpandedEvents": True, "showSystemEvents": True},
        prefix=True,
        expect=(
            {"operationType": "create", "ns": NS},
            {"operationType": "createIndexes", "ns": NS},
        ),
    ),
    Case(
        "chunk-migration-create-events-hidden",
        SOURCE,
        "collection",
        coll="test",
        setup=SETUP,
        ops=(MOVE, ("insert", "test", {"_id": 1, "x": 1})),
        options={"showExpandedEvents": True, "showSystemEvents": False},
        expect=(
            {
                "operationType": "insert",
                "ns": NS,
                "fullDocument": {"_id": 1, "x": 1},
                "documentKey": {"_id": 1},
            },
        ),
    ),
]
