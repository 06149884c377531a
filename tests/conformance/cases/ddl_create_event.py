"""jstests/change_streams/ddl_create_event.js (requires_fcv_60): `create` events carry the options
of the user's command, normalised as the catalog stores them. The jstest runs every step on a
database stream and on a collection stream, with showExpandedEvents."""

from bson import Int64

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/ddl_create_event.js"
NS = {"db": DB, "coll": "c"}
ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
EXPANDED = {"showExpandedEvents": True}
WIRED_TIGER = {"wiredTiger": {"configString": "block_compressor=zlib"}}
COLLATION = {
    "locale": "en",
    "caseLevel": False,
    "caseFirst": "off",
    "strength": 3,
    "numericOrdering": False,
    "alternate": "non-ignorable",
    "maxVariable": "punct",
    "normalization": False,
    "backwards": True,
    "version": "57.1",
}


def _create(
    name: str, command: dict, description: dict, *, diverges: str | None = None
) -> list[Case]:
    """The jstest's step on both of its streams."""
    out = []
    for watch in ("database", "collection"):
        known = {path: diverges for path in ("simcluster", "watch", "buckets")} if diverges else {}
        out.append(
            Case(
                f"ddl-create-{name}-{watch}",
                SOURCE,
                watch,
                options=EXPANDED,
                ops=(("command", {"create": "c", **command}),),
                expect=(
                    {"operationType": "create", "ns": NS, "operationDescription": description},
                ),
                diverges=known,
            )
        )
    return out


CASES = [
    *_create("basic", {}, {"idIndex": ID_INDEX}),
    *_create(
        "capped",
        {"capped": True, "size": 1000, "max": 1000},
        {"idIndex": ID_INDEX, "capped": True, "size": 1024, "max": 1000},
    ),
    *_create(
        "storage-engine",
        {"indexOptionDefaults": {"storageEngine": WIRED_TIGER}, "storageEngine": WIRED_TIGER},
        {
            "idIndex": ID_INDEX,
            "indexOptionDefaults": {"storageEngine": WIRED_TIGER},
            "storageEngine": WIRED_TIGER,
        },
    ),
    *_create(
        "validator",
        {"validator": {"a": 1}, "validationLevel": "off", "validationAction": "warn"},
        {
            "idIndex": ID_INDEX,
            "validator": {"a": 1},
            "validationLevel": "off",
            "validationAction": "warn",
        },
    ),
    *_create(
        "collation",
        {"collation": COLLATION},
        {"collation": COLLATION, "idIndex": {**ID_INDEX, "collation": COLLATION}},
    ),
    *_create(
        "clustered-index",
        {
            "clusteredIndex": {"key": {"_id": 1}, "name": "newName", "unique": True},
            "expireAfterSeconds": 10,
        },
        {
            "clusteredIndex": {"v": 2, "key": {"_id": 1}, "name": "newName", "unique": True},
            "expireAfterSeconds": Int64(10),
        },
    ),
    *_create(
        "id-index-name-ignored",
        {"idIndex": {"v": 2, "key": {"_id": 1}, "name": "ignored"}},
        {"idIndex": ID_INDEX},
    ),
    *_create("id-index-v1", {"idIndex": {"v": 1, "key": {"_id": 1}, "name": "new"}}, {}),
    *[
        Case(
            f"ddl-create-implicit-by-insert-{watch}",
            SOURCE,
            watch,
            options=EXPANDED,
            ops=(("insert", "c", {"_id": 0}),),
            expect=(
                {
                    "operationType": "create",
                    "ns": NS,
                    "operationDescription": {"idIndex": ID_INDEX},
                },
                {
                    "operationType": "insert",
                    "fullDocument": {"_id": 0},
                    "ns": NS,
                    "documentKey": {"_id": 0},
                },
            ),
        )
        for watch in ("database", "collection")
    ],
    *[
        Case(
            f"ddl-create-by-shard-collection-{watch}",
            SOURCE,
            watch,
            options=EXPANDED,
            prefix=True,
            ops=(("admin", {"shardCollection": f"{DB}.c", "key": {"a": 1}}),),
            expect=(
                {
                    "operationType": "create",
                    "ns": NS,
                    "operationDescription": {"idIndex": ID_INDEX},
                },
            ),
        )
        for watch in ("database", "collection")
    ],
]
