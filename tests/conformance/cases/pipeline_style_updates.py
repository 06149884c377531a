"""jstests/change_streams/pipeline_style_updates.js: update events of pipeline-style updates,
which the server logs as `$v: 2` delta entries (changed fields only, not a replacement)."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/pipeline_style_updates.js"
NS = {"db": DB, "coll": "t1"}
LARGE = "*" * 512
DOC = {"_id": 100, "a": 1, "b": 2, "obj": {"a": 1, "b": 2, "str": LARGE}}
STEPS = [
    (
        "set",
        [{"$set": {"a": 2}}],
        {"updatedFields": {"a": 2}, "removedFields": [], "truncatedArrays": []},
    ),
    (
        "unset",
        [{"$unset": ["a"]}],
        {"updatedFields": {}, "removedFields": ["a"], "truncatedArrays": []},
    ),
    (
        "replace-root",
        [
            {
                "$replaceRoot": {
                    "newRoot": {"_id": 100, "b": 2, "obj": {"a": 2, "b": 2, "str": LARGE}}
                }
            }
        ],
        {"updatedFields": {"obj.a": 2}, "removedFields": [], "truncatedArrays": []},
    ),
]

CASES = [
    Case(
        f"pipeline-update-{name}",
        SOURCE,
        "collection",
        coll="t1",
        setup=(
            ("insert", "t1", DOC),
            *(("update", "t1", {"_id": 100}, u) for _, u, _ in STEPS[:i]),
        ),
        ops=(("update", "t1", {"_id": 100}, update),),
        expect=(
            {
                "documentKey": {"_id": 100},
                "ns": NS,
                "operationType": "update",
                "updateDescription": description,
            },
        ),
    )
    for i, (name, update, description) in enumerate(STEPS)
]
