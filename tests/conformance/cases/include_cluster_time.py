"""jstests/change_streams/include_cluster_time.js: every event carries the cluster time of its
write (`clusterTime`), the invalidate too.

The index holds a 2018-era version of this jstest, in which a collection's drop gave only the
invalidate; from 4.0.1 on a `drop` event comes first, which the case expects."""

from tests.conformance.model import DB, PRESENT, Case

SOURCE = "jstests/change_streams/include_cluster_time.js"
COLL = "include_cluster_time"
NS = {"db": DB, "coll": COLL}

CASES = [
    Case(
        "include-cluster-time",
        SOURCE,
        "collection",
        coll=COLL,
        setup=(("command", {"create": COLL}),),
        ops=(
            ("insert", COLL, {"_id": 0}),
            ("update", COLL, {"_id": 0}, {"$set": {"updated": True}}),
            ("delete", COLL, {"_id": 0}),
            ("drop", COLL),
        ),
        expect=(
            {
                "operationType": "insert",
                "clusterTime": PRESENT,
                "ns": NS,
                "documentKey": {"_id": 0},
                "fullDocument": {"_id": 0},
            },
            {
                "operationType": "update",
                "clusterTime": PRESENT,
                "ns": NS,
                "documentKey": {"_id": 0},
                "updateDescription": {
                    "updatedFields": {"updated": True},
                    "removedFields": [],
                    "truncatedArrays": [],
                },
            },
            {
                "operationType": "delete",
                "clusterTime": PRESENT,
                "ns": NS,
                "documentKey": {"_id": 0},
            },
            {"operationType": "drop", "clusterTime": PRESENT, "ns": NS},
            {"operationType": "invalidate", "clusterTime": PRESENT},
        ),
    )
]
