"""jstests/change_streams/does_not_implicitly_create_database.js: a collection stream opened on a
collection that does not exist yet shows the writes that later create it.

The runner makes the case's database before the stream opens (for its end marker), so the
jstest's check that opening the stream does not create the database is not repeated here; its
events are, with `truncatedArrays` (added in 4.2; the indexed version predates it)."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/does_not_implicitly_create_database.js"
NS = {"db": DB, "coll": "test"}

CASES = [
    Case(
        "no-implicit-create-writes-seen",
        SOURCE,
        "collection",
        coll="test",
        ops=(
            ("insert", "test", {"_id": 1}),
            ("insert", "test", {"_id": 2}),
            ("update", "test", {"_id": 1}, {"$set": {"updated": True}}),
            ("delete", "test", {"_id": 2}),
        ),
        expect=(
            {
                "documentKey": {"_id": 1},
                "fullDocument": {"_id": 1},
                "ns": NS,
                "operationType": "insert",
            },
            {
                "documentKey": {"_id": 2},
                "fullDocument": {"_id": 2},
                "ns": NS,
                "operationType": "insert",
            },
            {
                "documentKey": {"_id": 1},
                "ns": NS,
                "operationType": "update",
                "updateDescription": {
                    "removedFields": [],
                    "updatedFields": {"updated": True},
                    "truncatedArrays": [],
                },
            },
            {"documentKey": {"_id": 2}, "ns": NS, "operationType": "delete"},
        ),
    )
]
