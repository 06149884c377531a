"""jstests/change_streams/show_expanded_events.js (requires_fcv_61): database-stream events with
showExpandedEvents, each carrying the collection's UUID (`collectionUUID`), except dropDatabase;
renames carry `operationDescription.to` and, when they replace a collection, its UUID as
`dropTarget`."""

from tests.conformance.model import DB, Case, uuid_of
from tests.conformance.runner import END_COLL

SOURCE = "jstests/change_streams/show_expanded_events.js"
COLL = "enriched_events"
RENAMED = "enriched_events_renamed"
NS = {"db": DB, "coll": COLL}
RENAMED_NS = {"db": DB, "coll": RENAMED}
EXPANDED = {"showExpandedEvents": True}
SETUP = (("command", {"create": COLL}),)
ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}


def _rename(drop_target: bool) -> tuple:
    return (
        "admin",
        {"renameCollection": f"{DB}.{COLL}", "to": f"{DB}.{RENAMED}", "dropTarget": drop_target},
    )


def _case(name: str, ops: tuple, expect: tuple, setup: tuple = SETUP, **kwargs: object) -> Case:
    return Case(
        f"expanded-{name}",
        SOURCE,
        "database",
        options=EXPANDED,
        setup=setup,
        ops=ops,
        expect=expect,
        **kwargs,
    )  # type: ignore[arg-type]


CASES = [
    _case(
        "crud",
        (
            ("insert", COLL, {"_id": 0, "a": 1}),
            ("replace", COLL, {"_id": 0}, {"_id": 0, "a": 2}),
            ("update", COLL, {"_id": 0}, {"$inc": {"a": 1}}),
            ("delete", COLL, {"_id": 0}),
        ),
        (
            {
                "ns": NS,
                "operationType": "insert",
                "documentKey": {"_id": 0},
                "fullDocument": {"_id": 0, "a": 1},
                "collectionUUID": uuid_of(COLL),
            },
            {
                "ns": NS,
                "operationType": "replace",
                "documentKey": {"_id": 0},
                "fullDocument": {"_id": 0, "a": 2},
                "collectionUUID": uuid_of(COLL),
            },
            {
                "ns": NS,
                "operationType": "update",
                "documentKey": {"_id": 0},
                "collectionUUID": uuid_of(COLL),
                "updateDescription": {
                    "removedFields": [],
                    "updatedFields": {"a": 3},
                    "truncatedArrays": [],
                    "disambiguatedPaths": {},
                },
            },
            {
                "ns": NS,
                "operationType": "delete",
                "documentKey": {"_id": 0},
                "collectionUUID": uuid_of(COLL),
            },
        ),
    ),
    _case(
        "drop",
        (("drop", COLL),),
        ({"ns": NS, "operationType": "drop", "collectionUUID": uuid_of(f"before:{COLL}")},),
    ),
    _case(
        "rename",
        (_rename(False),),
        (
            {
                "ns": NS,
                "operationType": "rename",
                "to": RENAMED_NS,
                "operationDescription": {"to": RENAMED_NS},
                "collectionUUID": uuid_of(RENAMED),
            },
        ),
    ),
    _case(
        "rename-drop-target-absent",
        (_rename(True),),
        (
            {
                "ns": NS,
                "operationType": "rename",
                "to": RENAMED_NS,
                "operationDescription": {"to": RENAMED_NS},
                "collectionUUID": uuid_of(RENAMED),
            },
        ),
    ),
    _case(
        "rename-drop-target-present",
        (_rename(True),),
        (
            {
                "ns": NS,
                "operationType": "rename",
                "to": RENAMED_NS,
                "collectionUUID": uuid_of(f"before:{COLL}"),
                "operationDescription": {
                    "dropTarget": uuid_of(f"before:{RENAMED}"),
                    "to": RENAMED_NS,
                },
            },
        ),
        setup=(*SETUP, ("command", {"create": RENAMED})),
    ),
    # The jstest's database is empty when it is dropped; here each collection's drop comes first.
    _case(
        "drop-database",
        (("command", {"dropDatabase": 1}),),
        (
            {"ns": NS, "operationType": "drop"},
            {"ns": {"db": DB, "coll": END_COLL}, "operationType": "drop"},
            {"ns": {"db": DB}, "operationType": "dropDatabase"},
            {"operationType": "invalidate"},
        ),
        unordered=True,
    ),
]
