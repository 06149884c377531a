"""jstests/change_streams/apply_ops.js: a transaction's writes unwound from its applyOps entry,
each event with the transaction's lsid and txnNumber, on collection, database and cluster
streams; a collection stream ends with the drop and an invalidate.

The index holds a 2018-era version of this jstest: 7.0/8.0 add `truncatedArrays` to every
`updateDescription` (from 4.2 on), which the cases include. The jstest's own applyOps command run
outside a transaction is left out: mongos does not accept applyOps. The other database may have its
primary on the other shard, where its part of the transaction commits with that shard's own
timestamp, so the cluster case compares its events as a set."""

from tests.conformance.model import DB, PRESENT, Case

SOURCE = "jstests/change_streams/apply_ops.js"
COLL = "change_stream_apply_ops"
OTHER = "change_stream_apply_ops_2"
OTHER_DB = f"{DB}_other"
TXN = {"lsid": PRESENT, "txnNumber": PRESENT}


def _insert(db: str, coll: str, key: int, a: object) -> dict:
    return {
        "operationType": "insert",
        "ns": {"db": db, "coll": coll},
        "documentKey": {"_id": key},
        "fullDocument": {"_id": key, "a": a},
        **TXN,
    }


SETUP = (
    ("command", {"create": COLL}),
    ("command", {"create": OTHER}),
    ("command", {"create": "someColl"}, OTHER_DB),
    ("insert", COLL, {"_id": 0, "a": "I was here before the transaction"}),
)
TXN_OPS = (
    "txn",
    [
        ("insert", COLL, {"_id": 1, "a": 0}),
        ("insert", COLL, {"_id": 2, "a": 0}),
        ("insert", OTHER, {"_id": 111, "a": "Doc on other collection"}),
        (
            "command",
            {"insert": "someColl", "documents": [{"_id": 222, "a": "Doc on other DB"}]},
            OTHER_DB,
        ),
        ("update", COLL, {"_id": 1}, {"$inc": {"a": 1}}),
        ("delete", COLL, {"_id": 0}),
    ],
)
OPS = (TXN_OPS, ("drop", COLL))
FIRST = (_insert(DB, COLL, 1, 0), _insert(DB, COLL, 2, 0))
REST = (
    {
        "operationType": "update",
        "ns": {"db": DB, "coll": COLL},
        "documentKey": {"_id": 1},
        "updateDescription": {
            "updatedFields": {"a": 1},
            "removedFields": [],
            "truncatedArrays": [],
        },
        **TXN,
    },
    {"operationType": "delete", "ns": {"db": DB, "coll": COLL}, "documentKey": {"_id": 0}, **TXN},
    {"operationType": "drop", "ns": {"db": DB, "coll": COLL}},
)

CASES = [
    Case(
        "apply-ops-collection",
        SOURCE,
        "collection",
        coll=COLL,
        setup=SETUP,
        ops=OPS,
        expect=(*FIRST, *REST, {"operationType": "invalidate"}),
    ),
    Case(
        "apply-ops-database",
        SOURCE,
        "database",
        setup=SETUP,
        ops=OPS,
        expect=(*FIRST, _insert(DB, OTHER, 111, "Doc on other collection"), *REST),
    ),
    Case(
        "apply-ops-cluster",
        SOURCE,
        "cluster",
        setup=SETUP,
        ops=OPS,
        buckets=False,
        unordered=True,
        expect=(
            *FIRST,
            _insert(DB, OTHER, 111, "Doc on other collection"),
            _insert(OTHER_DB, "someColl", 222, "Doc on other DB"),
            *REST,
        ),
    ),
]
