"""jstests/change_streams/whole_db.js: a database stream shows inserts into every collection of
the database, including user collections whose names merely contain "system", and their drops.
A database stream cannot be opened on admin or config (InvalidNamespace).

The index holds a 2018-era version of this jstest; the events it asserts are unchanged in
7.0/8.0."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/whole_db.js"


def _insert(coll: str, doc: dict) -> dict:
    return {
        "documentKey": {"_id": doc["_id"]},
        "fullDocument": doc,
        "ns": {"db": DB, "coll": coll},
        "operationType": "insert",
    }


CASES = [
    Case(
        "whole-db-inserts-into-two-collections",
        SOURCE,
        "database",
        ops=(("insert", "t1", {"_id": 0, "a": 1}), ("insert", "t2", {"_id": 0, "a": 2})),
        expect=(_insert("t1", {"_id": 0, "a": 1}), _insert("t2", {"_id": 0, "a": 2})),
    ),
    *[
        Case(
            f"whole-db-user-collection-named-{name.replace('.', '-')}",
            SOURCE,
            "database",
            ops=(("insert", name, {"_id": 0, "a": 1}), ("drop", name)),
            expect=(
                _insert(name, {"_id": 0, "a": 1}),
                {"operationType": "drop", "ns": {"db": DB, "coll": name}},
            ),
        )
        for name in ("system", "systems.views", "ssystem.views", "test.system")
    ],
]
