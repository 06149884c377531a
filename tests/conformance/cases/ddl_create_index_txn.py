"""jstests/change_streams/ddl_create_index_txn.js (requires_fcv_60): a createIndexes run inside a
transaction on a collection that does not exist yet gives a `create` and a `createIndexes` event,
the latter with the transaction's lsid and txnNumber, on collection, database and cluster
streams with showExpandedEvents."""

from tests.conformance.model import DB, PRESENT, Case

SOURCE = "jstests/change_streams/ddl_create_index_txn.js"
EXPANDED = {"showExpandedEvents": True}
SPEC = {"v": 2, "key": {"unused": 1}, "name": "unused_1"}


def _txn(coll: str) -> tuple:
    return (
        "txn",
        [
            (
                "command",
                {"createIndexes": coll, "indexes": [{"key": {"unused": 1}, "name": "unused_1"}]},
            )
        ],
    )


def _events(db: str, coll: str) -> tuple:
    ns = {"db": db, "coll": coll}
    return (
        {"operationType": "create", "ns": ns},
        {
            "operationType": "createIndexes",
            "ns": ns,
            "operationDescription": {"indexes": [SPEC]},
            "lsid": PRESENT,
            "txnNumber": PRESENT,
        },
    )


OPS = (
    _txn("c1"),
    _txn("c2"),
    (
        "txn",
        [
            (
                "command",
                {
                    "createIndexes": "someColl",
                    "indexes": [{"key": {"unused": 1}, "name": "unused_1"}],
                },
                f"{DB}_3",
            )
        ],
    ),
)

CASES = [
    Case(
        "create-index-txn-collection",
        SOURCE,
        "collection",
        coll="c1",
        options=EXPANDED,
        ops=OPS,
        expect=_events(DB, "c1"),
    ),
    Case(
        "create-index-txn-database",
        SOURCE,
        "database",
        options=EXPANDED,
        ops=OPS,
        expect=(*_events(DB, "c1"), *_events(DB, "c2")),
    ),
    Case(
        "create-index-txn-cluster",
        SOURCE,
        "cluster",
        options=EXPANDED,
        ops=OPS,
        buckets=False,
        expect=(*_events(DB, "c1"), *_events(DB, "c2"), *_events(f"{DB}_3", "someColl")),
    ),
]
