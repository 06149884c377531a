"""jstests/change_streams/whole_db_metadata_notifications.js: a database stream shows drops and
renames without being invalidated, ignores other databases and system collections, resumes from
before a drop, and ends with dropDatabase and an invalidate when its database is dropped.

The index holds a pre-6.0 version of this jstest; the events it asserts are unchanged in 7.0/8.0."""

from tests.conformance.model import DB, Case
from tests.conformance.runner import END_COLL

SOURCE = "jstests/change_streams/whole_db_metadata_notifications.js"
OTHER_DB = f"{DB}other"


def _ns(coll: str) -> dict:
    return {"db": DB, "coll": coll}


def _case(name: str, **kwargs: object) -> Case:
    return Case(f"whole-db-metadata-{name}", SOURCE, "database", **kwargs)  # type: ignore[arg-type]


INSERT = {
    "operationType": "insert",
    "ns": _ns("test"),
    "documentKey": {"_id": 1},
    "fullDocument": {"_id": 1},
}
CRUD = (
    ("insert", "test", {"_id": 1}),
    ("update", "test", {"_id": 1}, {"$set": {"a": 1}}),
    ("delete", "test", {"_id": 1}),
    ("drop", "test"),
    ("command", {"create": "test"}),
    ("insert", "test", {"_id": 1}),
    ("drop", "test"),
)

CASES = [
    _case(
        "crud-drop-recreate",
        setup=(("command", {"create": "test"}),),
        ops=CRUD,
        expect=(
            INSERT,
            {
                "operationType": "update",
                "ns": _ns("test"),
                "documentKey": {"_id": 1},
                "updateDescription": {
                    "updatedFields": {"a": 1},
                    "removedFields": [],
                    "truncatedArrays": [],
                },
            },
            {"operationType": "delete", "ns": _ns("test"), "documentKey": {"_id": 1}},
            {"operationType": "drop", "ns": _ns("test")},
            INSERT,
            {"operationType": "drop", "ns": _ns("test")},
        ),
    ),
    _case(
        "resume-from-before-a-drop",
        setup=(("command", {"create": "test"}),),
        ops=CRUD,
        resume=("resumeAfter", 4),
        expect=({"operationType": "drop", "ns": _ns("test")},),
    ),
    _case(
        "other-database-drop-is-not-seen",
        setup=(
            ("command", {"insert": "test_other", "documents": [{"_id": 0}]}, OTHER_DB),
            ("command", {"create": "test"}),
        ),
        ops=(("command", {"drop": "test_other"}, OTHER_DB), ("insert", "test", {"_id": 1})),
        expect=(
            {
                "operationType": "insert",
                "ns": _ns("test"),
                "documentKey": {"_id": 1},
                "fullDocument": {"_id": 1},
            },
        ),
    ),
    _case(
        "rename",
        setup=(("command", {"create": "test"}),),
        ops=(("admin", {"renameCollection": f"{DB}.test", "to": f"{DB}.renamed_coll"}),),
        expect=({"operationType": "rename", "ns": _ns("test"), "to": _ns("renamed_coll")},),
    ),
    _case(
        "rename-drop-target",
        setup=(("command", {"create": "renamed_coll"}),),
        ops=(
            ("command", {"create": "test"}),
            ("insert", "test", {"_id": 0}),
            (
                "admin",
                {"renameCollection": f"{DB}.renamed_coll", "to": f"{DB}.test", "dropTarget": True},
            ),
        ),
        expect=(
            {
                "operationType": "insert",
                "ns": _ns("test"),
                "documentKey": {"_id": 0},
                "fullDocument": {"_id": 0},
            },
            {"operationType": "rename", "ns": _ns("renamed_coll"), "to": _ns("test")},
        ),
    ),
    _case(
        "drop",
        setup=(("command", {"create": "test"}),),
        ops=(("drop", "test"),),
        expect=({"operationType": "drop", "ns": _ns("test")},),
    ),
    _case(
        "view-is-not-seen",
        setup=(("command", {"create": "test"}),),
        ops=(
            ("command", {"create": "view1", "viewOn": "test", "pipeline": []}),
            ("insert", "test", {"_id": 0}),
        ),
        expect=(
            {
                "operationType": "insert",
                "ns": _ns("test"),
                "documentKey": {"_id": 0},
                "fullDocument": {"_id": 0},
            },
        ),
    ),
    _case(
        "drop-database",
        setup=(("insert", "test", {"_id": 0}),),
        ops=(("command", {"dropDatabase": 1}),),
        unordered=True,
        expect=(
            {"operationType": "drop", "ns": _ns("test")},
            {"operationType": "drop", "ns": _ns(END_COLL)},
            {"operationType": "dropDatabase", "ns": {"db": DB}},
            {"operationType": "invalidate"},
        ),
    ),
]
