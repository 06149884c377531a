"""jstests/sharding/change_stream_metadata_notifications.js: a collection stream on a collection
sharded over two shards shows the writes on both shards in cluster-time order, then the drop and
an invalidate; it resumes from before the drop; dropDatabase ends a stream on an unsharded
collection with its drop and an invalidate.

The index holds a pre-6.0 version of this jstest (requires_majority_read_concern); the events it
asserts are unchanged in 7.0/8.0."""

from tests.conformance.model import DB, OTHER_SHARD, Case

SOURCE = "jstests/sharding/change_stream_metadata_notifications.js"
COLL = "change_stream_metadata_notifications"
NS = {"db": DB, "coll": COLL}
SHARDED = (
    ("admin", {"enableSharding": DB}),
    ("admin", {"shardCollection": f"{DB}.{COLL}", "key": {"shardKey": 1}}),
    ("admin", {"split": f"{DB}.{COLL}", "middle": {"shardKey": 0}}),
    ("admin", {"moveChunk": f"{DB}.{COLL}", "find": {"shardKey": 1}, "to": OTHER_SHARD}),
    ("insert", COLL, {"shardKey": -1, "_id": -1}),
    ("insert", COLL, {"shardKey": 1, "_id": 1}),
)
WRITES = (
    ("update", COLL, {"shardKey": -1, "_id": -1}, {"$set": {"updated": True}}),
    ("update", COLL, {"shardKey": 1, "_id": 1}, {"$set": {"updated": True}}),
    ("insert", COLL, {"shardKey": 2, "_id": 2}),
    ("drop", COLL),
)
UPDATED = {"updatedFields": {"updated": True}, "removedFields": [], "truncatedArrays": []}
EVENTS = (
    {
        "operationType": "update",
        "ns": NS,
        "documentKey": {"shardKey": -1, "_id": -1},
        "updateDescription": UPDATED,
    },
    {
        "operationType": "update",
        "ns": NS,
        "documentKey": {"shardKey": 1, "_id": 1},
        "updateDescription": UPDATED,
    },
    {
        "operationType": "insert",
        "ns": NS,
        "documentKey": {"shardKey": 2, "_id": 2},
        "fullDocument": {"shardKey": 2, "_id": 2},
    },
    {"operationType": "drop", "ns": NS},
    {"operationType": "invalidate"},
)


def _case(name: str, **kwargs: object) -> Case:
    return Case(f"sharded-metadata-{name}", SOURCE, "collection", coll=COLL, **kwargs)  # type: ignore[arg-type]


CASES = [
    _case("writes-on-both-shards-then-drop", setup=SHARDED, ops=WRITES, expect=EVENTS),
    _case(
        "resume-from-before-the-drop",
        setup=SHARDED,
        ops=WRITES,
        resume=("resumeAfter", 0),
        expect=EVENTS[1:],
    ),
    # The 7.0-era jstest: resumed with a $match that keeps nothing, the stream is exhausted (the
    # invalidate, filtered out, still closes it).
    _case(
        "resume-filtered-sees-nothing",
        setup=SHARDED,
        ops=WRITES,
        resume=("resumeAfter", 0),
        resume_pipeline=({"$match": {"operationType": "DummyOperationType"}},),
        expect=(),
    ),
    _case(
        "drop-database-ends-an-unsharded-stream",
        setup=(("command", {"create": COLL}),),
        ops=(("command", {"dropDatabase": 1}),),
        expect=({"operationType": "drop", "ns": NS}, {"operationType": "invalidate"}),
    ),
]
