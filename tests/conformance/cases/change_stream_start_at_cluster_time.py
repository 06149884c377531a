"""jstests/change_streams/change_stream_start_at_cluster_time.js: `startAtOperationTime` includes
the event at that cluster time, and cannot be combined with `resumeAfter` (40674).

The index holds a 4.0-era version of this jstest; both rules are unchanged in 7.0/8.0."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/change_stream_start_at_cluster_time.js"
COLL = "change_stream_start_at_cluster_time"
NS = {"db": DB, "coll": COLL}
SETUP = (("command", {"create": COLL}), ("insert", COLL, {"_id": -1}), ("insert", COLL, {"_id": 1}))
UPDATES = (
    ("update", COLL, {"_id": -1}, {"$set": {"updated": True}}),
    ("update", COLL, {"_id": 1}, {"$set": {"updated": True}}),
)

CASES = [
    Case(
        "start-at-operation-time-is-inclusive",
        SOURCE,
        "collection",
        coll=COLL,
        setup=SETUP,
        ops=UPDATES,
        resume=("startAtOperationTime", 0),
        expect=(
            {"operationType": "update", "ns": NS, "documentKey": {"_id": -1}},
            {"operationType": "update", "ns": NS, "documentKey": {"_id": 1}},
        ),
    ),
    Case(
        "start-at-operation-time-with-resume-after-refused",
        SOURCE,
        "collection",
        coll=COLL,
        setup=SETUP,
        ops=UPDATES,
        resume=("resumeAfter+startAtOperationTime", 1),
        raw_options=("startAtOperationTime",),
        error=40674,
    ),
]
