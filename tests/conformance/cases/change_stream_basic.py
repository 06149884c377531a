"""jstests/change_streams/change_stream.js: basic CRUD events of a collection stream.

The jstest's expected events, with the 7.0/8.0 form of `updateDescription` (it carries
`truncatedArrays` from 4.2 on, as jstests/change_streams/change_stream.js of those versions
expects)."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/change_stream.js"
NS = {"db": DB, "coll": "t1"}

CASES = [
    Case(
        "basic-insert",
        SOURCE,
        "collection",
        coll="t1",
        ops=(("insert", "t1", {"_id": 0, "a": 1}),),
        expect=(
            {
                "documentKey": {"_id": 0},
                "fullDocument": {"_id": 0, "a": 1},
                "ns": NS,
                "operationType": "insert",
            },
        ),
    ),
    Case(
        "basic-replace",
        SOURCE,
        "collection",
        coll="t1",
        setup=(("insert", "t1", {"_id": 0, "a": 1}),),
        ops=(("replace", "t1", {"_id": 0}, {"_id": 0, "a": 3}),),
        expect=(
            {
                "documentKey": {"_id": 0},
                "fullDocument": {"_id": 0, "a": 3},
                "ns": NS,
                "operationType": "replace",
            },
        ),
    ),
    Case(
        "basic-replace-other-field",
        SOURCE,
        "collection",
        coll="t1",
        setup=(("insert", "t1", {"_id": 0, "a": 3}),),
        ops=(("replace", "t1", {"_id": 0}, {"_id": 0, "b": 3}),),
        expect=(
            {
                "documentKey": {"_id": 0},
                "fullDocument": {"_id": 0, "b": 3},
                "ns": NS,
                "operationType": "replace",
            },
        ),
    ),
    Case(
        "basic-upsert-is-an-insert",
        SOURCE,
        "collection",
        coll="t1",
        setup=(("insert", "t1", {"_id": 0}),),
        ops=(
            (
                "command",
                {
                    "update": "t1",
                    "updates": [{"q": {"_id": 2}, "u": {"_id": 2, "a": 4}, "upsert": True}],
                },
            ),
        ),
        expect=(
            {
                "documentKey": {"_id": 2},
                "fullDocument": {"_id": 2, "a": 4},
                "ns": NS,
                "operationType": "insert",
            },
        ),
    ),
    Case(
        "basic-inc-is-an-update",
        SOURCE,
        "collection",
        coll="t1",
        setup=(("insert", "t1", {"_id": 3, "a": 5, "b": 1}),),
        ops=(("update", "t1", {"_id": 3}, {"$inc": {"b": 2}}),),
        expect=(
            {
                "documentKey": {"_id": 3},
                "ns": NS,
                "operationType": "update",
                "updateDescription": {
                    "removedFields": [],
                    "updatedFields": {"b": 3},
                    "truncatedArrays": [],
                },
            },
        ),
    ),
    Case(
        "basic-delete",
        SOURCE,
        "collection",
        coll="t1",
        setup=(("insert", "t1", {"_id": 1, "a": 2}),),
        ops=(("delete", "t1", {"_id": 1}),),
        expect=({"documentKey": {"_id": 1}, "ns": NS, "operationType": "delete"},),
    ),
    Case(
        "basic-write-to-another-collection-is-not-seen",
        SOURCE,
        "collection",
        coll="t1",
        setup=(("insert", "t1", {"_id": 0}),),
        ops=(("insert", "t2", {"_id": 100, "c": 1}),),
        expect=(),
    ),
    Case(
        "basic-drop-of-unrelated-collection-is-not-seen",
        SOURCE,
        "collection",
        coll="t1",
        setup=(("insert", "t1", {"_id": 0}), ("insert", "dropping", {"_id": 0})),
        ops=(("drop", "dropping"),),
        expect=(),
    ),
    Case(
        "basic-insert-that-looks-like-a-rename",
        SOURCE,
        "collection",
        coll="dne1",
        setup=(("insert", "t2", {"_id": 0}),),
        ops=(("insert", "t2", {"_id": 101, "renameCollection": f"{DB}.dne1", "to": f"{DB}.dne2"}),),
        expect=(),
    ),
]
