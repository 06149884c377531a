"""jstests/change_streams/delete_in_txn_produces_correct_doc_key.js: `delete` events from a
transaction carry only the documentKey, even when the collection records pre-images, and a
stream resumes after them.

The indexed version enables pre-images with `recordPreImages`, which 6.0 removed; the cases use
its 6.0+ replacement, `changeStreamPreAndPostImages`."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/delete_in_txn_produces_correct_doc_key.js"
COLL = "delete_in_txn_produces_correct_doc_key"
NS = {"db": DB, "coll": COLL}
SETUP = (
    ("command", {"create": COLL}),
    ("command", {"collMod": COLL, "changeStreamPreAndPostImages": {"enabled": True}}),
    (
        "insert_many",
        COLL,
        [
            {"_id": 1, "a": 0, "fullDoc": "It's a full document!"},
            {"_id": 2, "a": 0},
            {"_id": 3, "a": 0},
            {"_id": 4, "a": 1},
        ],
    ),
)
DELETES = {
    "delete-one": (("delete", COLL, {"_id": 1}),),
    "delete-many": (("delete_many", COLL, {"a": 0, "_id": {"$gt": 0}}),),
    "find-and-modify": (
        ("command", {"findAndModify": COLL, "query": {"a": 0}, "sort": {"_id": 1}, "remove": True}),
    ),
}
KEYS = {"delete-one": (1,), "delete-many": (1, 2, 3), "find-and-modify": (1,)}


def _deletes(name: str) -> tuple:
    return tuple(
        {"documentKey": {"_id": key}, "ns": NS, "operationType": "delete"} for key in KEYS[name]
    )


CASES = [
    *[
        Case(
            f"delete-in-txn-{name}",
            SOURCE,
            "collection",
            coll=COLL,
            setup=SETUP,
            ops=(("txn", list(ops)),),
            expect=_deletes(name),
        )
        for name, ops in DELETES.items()
    ],
    *[
        Case(
            f"delete-in-txn-{name}-resume",
            SOURCE,
            "collection",
            coll=COLL,
            setup=SETUP,
            ops=(("txn", list(ops)), ("insert", COLL, {"_id": 5})),
            resume=("resumeAfter", len(KEYS[name]) - 1),
            expect=(
                {
                    "documentKey": {"_id": 5},
                    "fullDocument": {"_id": 5},
                    "ns": NS,
                    "operationType": "insert",
                },
            ),
        )
        for name, ops in DELETES.items()
    ],
]
