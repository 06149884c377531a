"""jstests/change_streams/whole_cluster.js: a cluster-wide stream shows writes in every database.

The index holds a 4.0-era version of this jstest, in which dropDatabase invalidated a cluster
stream; from 4.0.1 on (SERVER-35029) a cluster stream shows each collection's drop and then a
`dropDatabase` event and goes on, which the case expects."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/whole_cluster.js"
OTHER_DB = f"{DB}_other"
SETUP = (("command", {"create": "t1"}), ("command", {"create": "t2"}, OTHER_DB))

CASES = [
    Case(
        "whole-cluster-inserts-in-two-databases",
        SOURCE,
        "cluster",
        setup=SETUP,
        buckets=False,
        ops=(
            ("insert", "t1", {"_id": 0, "a": 1}),
            ("command", {"insert": "t2", "documents": [{"_id": 0, "a": 2}]}, OTHER_DB),
        ),
        expect=(
            {
                "documentKey": {"_id": 0},
                "fullDocument": {"_id": 0, "a": 1},
                "ns": {"db": DB, "coll": "t1"},
                "operationType": "insert",
            },
            {
                "documentKey": {"_id": 0},
                "fullDocument": {"_id": 0, "a": 2},
                "ns": {"db": OTHER_DB, "coll": "t2"},
                "operationType": "insert",
            },
        ),
    ),
    Case(
        "whole-cluster-drop-database-does-not-invalidate",
        SOURCE,
        "cluster",
        setup=SETUP,
        buckets=False,
        ops=(("command", {"dropDatabase": 1}, OTHER_DB),),
        expect=(
            {"operationType": "drop", "ns": {"db": OTHER_DB, "coll": "t2"}},
            {"operationType": "dropDatabase", "ns": {"db": OTHER_DB}},
        ),
    ),
]
