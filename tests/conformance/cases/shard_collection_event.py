"""jstests/change_streams/shard_collection_event.js (requires_fcv_60, requires_sharding): the
`shardCollection` event with showExpandedEvents carries the command's options as the jstest
lists them, on a database stream and on a collection stream, and a stream resumes after it.

The jstest skips the `create` and `createIndexes` events that may come before the
shardCollection event; the cases filter them out with a $match."""

from bson import Int64

from tests.conformance.model import DB, Case, uuid_of

SOURCE = "jstests/change_streams/shard_collection_event.js"
NS = {"db": DB, "coll": "test"}
EXPANDED = {"showExpandedEvents": True}
SKIP_CREATES = ({"$match": {"operationType": {"$nin": ["create", "createIndexes"]}}},)
ENABLE = (("admin", {"enableSharding": DB}),)


def _description(key: dict, *, unique: bool = False, chunks: int = 0, **more: object) -> dict:
    return {
        "shardKey": key,
        "unique": unique,
        "numInitialChunks": Int64(chunks),
        "presplitHashedZones": False,
        **more,
    }


def _shard(options: dict) -> tuple:
    return ("admin", {"shardCollection": f"{DB}.test", **options})


# (name, shardCollection's options, the operationDescription)
VARIANTS: list[tuple[str, dict, dict]] = [
    ("range", {"key": {"_id": 1}}, _description({"_id": 1})),
    ("hashed", {"key": {"_id": "hashed"}}, _description({"_id": "hashed"})),
    ("compound-hashed", {"key": {"x": "hashed", "y": 1}}, _description({"x": "hashed", "y": 1})),
    (
        "num-initial-chunks",
        {"key": {"_id": "hashed"}, "numInitialChunks": 10},
        _description({"_id": "hashed"}, chunks=10),
    ),
    ("unique", {"key": {"_id": 1}, "unique": True}, _description({"_id": 1}, unique=True)),
    (
        "collation",
        {"key": {"_id": 1}, "collation": {"locale": "simple"}},
        _description({"_id": 1}, collation={"locale": "simple"}),
    ),
]


RESUMED: list[tuple[str, dict]] = [("range", {"_id": 1}), ("hashed", {"_id": "hashed"})]


def _event(description: dict, uuid: bool) -> dict:
    event = {"operationType": "shardCollection", "ns": NS, "operationDescription": description}
    return {**event, "collectionUUID": uuid_of("test")} if uuid else event


CASES = [
    *[
        Case(
            f"shard-collection-{name}-{watch}",
            SOURCE,
            watch,
            coll="test",
            options=EXPANDED,
            setup=ENABLE,
            pipeline=SKIP_CREATES,
            ops=(_shard(options),),
            expect=(_event(description, True),),
        )
        for watch in ("database", "collection")
        for name, options, description in VARIANTS
    ],
    *[
        Case(
            f"shard-collection-{name}-{watch}-resume",
            SOURCE,
            watch,
            coll="test",
            options=EXPANDED,
            setup=(*ENABLE, ("command", {"create": "test"})),
            pipeline=SKIP_CREATES,
            ops=(_shard({"key": key}), ("insert", "test", {"_id": 1})),
            resume=("resumeAfter", 0),
            expect=(
                {
                    "operationType": "insert",
                    "ns": NS,
                    "fullDocument": {"_id": 1},
                    "documentKey": {"_id": 1},
                },
            ),
        )
        for watch in ("database", "collection")
        for name, key in RESUMED
    ],
]
