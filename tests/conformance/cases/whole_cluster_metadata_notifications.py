"""jstests/change_streams/whole_cluster_metadata_notifications.js: a cluster-wide stream shows
writes, drops and renames in every database and is never invalidated; it resumes from before a
drop.

The index holds a 4.0-era version of this jstest, in which dropDatabase invalidated a cluster
stream and a view's system.views insert showed up as an insert. From 4.0.1 on (SERVER-35029) a
cluster stream shows each collection's drop and then a `dropDatabase` event and goes on, and
system.views writes are not CRUD events (they are view events, with showExpandedEvents only);
the cases expect the 7.0/8.0 behaviour."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/whole_cluster_metadata_notifications.js"
OTHER_DB = f"{DB}_other"
SETUP = (("command", {"create": "test"}), ("command", {"create": "test"}, OTHER_DB))


def _crud(db: str) -> tuple:
    return (
        ("command", {"insert": "test", "documents": [{"_id": 1}]}, db),
        (
            "command",
            {"update": "test", "updates": [{"q": {"_id": 1}, "u": {"$set": {"a": 1}}}]},
            db,
        ),
        ("command", {"delete": "test", "deletes": [{"q": {"_id": 1}, "limit": 1}]}, db),
    )


def _crud_events(db: str) -> tuple:
    ns = {"db": db, "coll": "test"}
    return (
        {
            "operationType": "insert",
            "ns": ns,
            "documentKey": {"_id": 1},
            "fullDocument": {"_id": 1},
        },
        {
            "operationType": "update",
            "ns": ns,
            "documentKey": {"_id": 1},
            "updateDescription": {
                "updatedFields": {"a": 1},
                "removedFields": [],
                "truncatedArrays": [],
            },
        },
        {"operationType": "delete", "ns": ns, "documentKey": {"_id": 1}},
    )


def _ns(coll: str) -> dict:
    return {"db": DB, "coll": coll}


def _case(name: str, **kwargs: object) -> Case:
    return Case(f"whole-cluster-metadata-{name}", SOURCE, "cluster", **kwargs)  # type: ignore[arg-type]


CASES = [
    _case(
        "crud-in-two-databases-then-drop-database",
        setup=SETUP,
        buckets=False,
        ops=(*_crud(DB), *_crud(OTHER_DB), ("command", {"dropDatabase": 1}, OTHER_DB)),
        expect=(
            *_crud_events(DB),
            *_crud_events(OTHER_DB),
            {"operationType": "drop", "ns": {"db": OTHER_DB, "coll": "test"}},
            {"operationType": "dropDatabase", "ns": {"db": OTHER_DB}},
        ),
    ),
    _case(
        "resume-from-before-a-drop",
        setup=SETUP[:1],
        ops=(("insert", "test", {"_id": 1}), ("drop", "test")),
        resume=("resumeAfter", 0),
        expect=({"operationType": "drop", "ns": _ns("test")},),
    ),
    _case(
        "rename",
        setup=SETUP[:1],
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
        setup=SETUP[:1],
        ops=(("drop", "test"),),
        expect=({"operationType": "drop", "ns": _ns("test")},),
    ),
    _case(
        "drop-in-other-database",
        setup=SETUP,
        buckets=False,
        ops=(("command", {"drop": "test"}, OTHER_DB),),
        expect=({"operationType": "drop", "ns": {"db": OTHER_DB, "coll": "test"}},),
    ),
    _case(
        "view-gives-no-event",
        setup=SETUP[:1],
        ops=(
            ("command", {"create": "view1", "viewOn": "test", "pipeline": []}),
            ("insert", "test", {"_id": 2}),
        ),
        expect=(
            {
                "operationType": "insert",
                "ns": _ns("test"),
                "documentKey": {"_id": 2},
                "fullDocument": {"_id": 2},
            },
        ),
    ),
]
