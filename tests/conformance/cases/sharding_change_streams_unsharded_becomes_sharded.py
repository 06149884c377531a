"""jstests/sharding/change_streams_unsharded_becomes_sharded.js: a collection stream opened while
its collection is unsharded goes on after the collection is sharded, and the documentKey of
later inserts holds the shard key, on the shard that owned the collection and on the shard a
chunk moves to.

The jstest reads each insert as it goes; each case here runs the steps before its insert as
setup. The index holds a 4.x-era version; the events it asserts are unchanged in 7.0/8.0."""

from tests.conformance.model import DB, OTHER_SHARD, Case

SOURCE = "jstests/sharding/change_streams_unsharded_becomes_sharded.js"
COLL = "change_streams_unsharded_becomes_sharded"
NS = {"db": DB, "coll": COLL}
UNSHARDED = (
    ("command", {"create": COLL}),
    ("command", {"createIndexes": COLL, "indexes": [{"key": {"x": 1}, "name": "x_1"}]}),
)
SHARD = (
    ("admin", {"enableSharding": DB}),
    ("admin", {"shardCollection": f"{DB}.{COLL}", "key": {"x": 1}}),
    ("admin", {"split": f"{DB}.{COLL}", "middle": {"x": 0}}),
)
MOVE = (("admin", {"moveChunk": f"{DB}.{COLL}", "find": {"x": -1}, "to": OTHER_SHARD}),)


def _insert(doc: dict, key: dict) -> dict:
    return {"documentKey": key, "fullDocument": doc, "ns": NS, "operationType": "insert"}


CASES = [
    Case(
        "unsharded-insert-key-is-id",
        SOURCE,
        "collection",
        coll=COLL,
        setup=UNSHARDED,
        ops=(("insert", COLL, {"_id": 0, "x": 0}),),
        expect=(_insert({"_id": 0, "x": 0}, {"_id": 0}),),
    ),
    Case(
        "sharded-insert-key-has-shard-key",
        SOURCE,
        "collection",
        coll=COLL,
        setup=(*UNSHARDED, ("insert", COLL, {"_id": 0, "x": 0})),
        ops=(*SHARD, ("insert", COLL, {"_id": 1, "x": 1})),
        expect=(_insert({"_id": 1, "x": 1}, {"x": 1, "_id": 1}),),
    ),
    Case(
        "sharded-insert-on-recipient-shard",
        SOURCE,
        "collection",
        coll=COLL,
        setup=(
            *UNSHARDED,
            ("insert", COLL, {"_id": 0, "x": 0}),
            *SHARD,
            ("insert", COLL, {"_id": 1, "x": 1}),
        ),
        ops=(*MOVE, ("insert", COLL, {"_id": -1, "x": -1})),
        expect=(_insert({"_id": -1, "x": -1}, {"x": -1, "_id": -1}),),
    ),
]
