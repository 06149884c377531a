"""jstests/change_streams/metadata_notifications.js: what a collection stream shows for drops,
renames and dropDatabase (each followed by an invalidate), and resuming with resumeAfter or
startAfter from those events. The collection is unsharded.

The index holds a pre-6.0 version of this jstest; the events and error codes it asserts hold
unchanged for 7.0/8.0 (the stream shapes of M6-M8 and M29 in the fidelity audit)."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/metadata_notifications.js"
INVALIDATE = {"operationType": "invalidate"}
CRUD_DROP = (
    ("command", {"create": "test"}),
    ("insert", "test", {"_id": 0}),
    ("insert", "test", {"_id": 1}),
    ("update", "test", {"_id": 1}, {"$set": {"a": 1}}),
    ("delete", "test", {"_id": 1}),
    ("drop", "test"),
)
AFTER_RECREATE = (("command", {"create": "test"}), ("insert", "test", {"_id": "after recreate"}))
RENAME = ("admin", {"renameCollection": f"{DB}.test", "to": f"{DB}.renamed_coll"})
RENAME_BACK = ("admin", {"renameCollection": f"{DB}.renamed_coll", "to": f"{DB}.test"})


def _rename(source: str, target: str) -> dict:
    return {
        "operationType": "rename",
        "ns": {"db": DB, "coll": source},
        "to": {"db": DB, "coll": target},
    }


def _insert(coll: str, key: object) -> dict:
    return {
        "operationType": "insert",
        "ns": {"db": DB, "coll": coll},
        "fullDocument": {"_id": key},
        "documentKey": {"_id": key},
    }


def _case(name: str, **kwargs: object) -> Case:
    return Case(f"metadata-{name}", SOURCE, "collection", coll="test", **kwargs)  # type: ignore[arg-type]


CASES = [
    # The jstest's stream projects each event to its _id and operationType.
    _case(
        "nonexistent-collection-then-crud-and-drop",
        ops=(("command", {"dropDatabase": 1}), *CRUD_DROP),
        pipeline=({"$project": {"operationType": 1}},),
        expect=(
            {"operationType": "insert"},
            {"operationType": "insert"},
            {"operationType": "update"},
            {"operationType": "delete"},
            {"operationType": "drop"},
            INVALIDATE,
        ),
    ),
    _case("start-after-invalidate-of-drop", ops=CRUD_DROP, resume=("startAfter", 5), expect=()),
    _case(
        "resume-after-drop-gives-invalidate",
        ops=(*CRUD_DROP, *AFTER_RECREATE),
        resume=("resumeAfter", 4),
        expect=(INVALIDATE,),
    ),
    _case("resume-after-invalidate-refused", ops=CRUD_DROP, resume=("resumeAfter", 5), error=260),
    _case(
        "start-after-drop-gives-invalidate",
        ops=(*CRUD_DROP, *AFTER_RECREATE),
        resume=("startAfter", 4),
        expect=(INVALIDATE,),
    ),
    _case(
        "start-after-invalidate-sees-recreated",
        ops=(*CRUD_DROP, *AFTER_RECREATE),
        resume=("startAfter", 5),
        expect=(_insert("test", "after recreate"),),
    ),
    _case(
        "rename-source",
        setup=(("insert", "test", {"_id": 0}),),
        ops=(RENAME,),
        expect=(_rename("test", "renamed_coll"), INVALIDATE),
    ),
    _case(
        "rename-target",
        setup=(("insert", "renamed_coll", {"_id": 0}),),
        ops=(RENAME_BACK,),
        expect=(_rename("renamed_coll", "test"), INVALIDATE),
    ),
    _case(
        "resume-after-rename-gives-invalidate",
        setup=(("insert", "renamed_coll", {"_id": 0}),),
        ops=(RENAME_BACK, ("insert", "test", {"_id": "after rename"})),
        resume=("resumeAfter", 0),
        expect=(INVALIDATE,),
    ),
    _case(
        "resume-after-rename-invalidate-refused",
        setup=(("insert", "renamed_coll", {"_id": 0}),),
        ops=(RENAME_BACK,),
        resume=("resumeAfter", 1),
        error=260,
    ),
    _case(
        "start-after-rename-gives-invalidate",
        setup=(("insert", "renamed_coll", {"_id": 0}),),
        ops=(RENAME_BACK, ("insert", "test", {"_id": "after rename"})),
        resume=("startAfter", 0),
        expect=(INVALIDATE,),
    ),
    _case(
        "start-after-rename-invalidate-sees-insert",
        setup=(("insert", "renamed_coll", {"_id": 0}),),
        ops=(RENAME_BACK, ("insert", "test", {"_id": "after rename"})),
        resume=("startAfter", 1),
        expect=(_insert("test", "after rename"),),
    ),
    Case(
        "metadata-rename-drop-target",
        SOURCE,
        "collection",
        coll="renamed_coll",
        setup=(("insert", "test", {"_id": 1}), ("insert", "renamed_coll", {"_id": 0})),
        ops=(
            (
                "admin",
                {"renameCollection": f"{DB}.test", "to": f"{DB}.renamed_coll", "dropTarget": True},
            ),
        ),
        expect=(_rename("test", "renamed_coll"), INVALIDATE),
    ),
    _case(
        "drop-database-drops-then-invalidates",
        setup=(("insert", "test", {"_id": 0}),),
        ops=(("command", {"dropDatabase": 1}),),
        expect=({"operationType": "drop", "ns": {"db": DB, "coll": "test"}}, INVALIDATE),
    ),
]
