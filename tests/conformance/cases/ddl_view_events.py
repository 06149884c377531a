"""jstests/change_streams/ddl_view_events.js (requires_fcv_60): view DDL as change events on a
database stream with showExpandedEvents (`create`, `modify` and `drop` with the view definition
as operationDescription), resuming from them, and what collection streams see of views."""

from tests.conformance.model import DB, PRESENT, Case

SOURCE = "jstests/change_streams/ddl_view_events.js"
EXPANDED = {"showExpandedEvents": True}
PIPELINE = [{"$match": {"a": 2}}, {"$project": {"a": 1}}]
UPDATED = [{"$match": {"a": 1}}, {"$project": {"a": 1}}]
BASE = (("command", {"create": "base"}), ("insert", "base", {"_id": 1}))


def _view(name: str, on: str, pipeline: list = PIPELINE) -> tuple:
    return ("command", {"create": name, "viewOn": on, "pipeline": pipeline})


def _ns(coll: str) -> dict:
    return {"db": DB, "coll": coll}


VIEW_OPS = (
    _view("view", "base"),
    _view("viewOnView", "view"),
    ("command", {"collMod": "viewOnView", "viewOn": "view", "pipeline": UPDATED}),
    ("drop", "view"),
    ("drop", "viewOnView"),
)
VIEW_EVENTS = (
    {
        "operationType": "create",
        "ns": _ns("view"),
        "operationDescription": {"viewOn": "base", "pipeline": PIPELINE},
    },
    {
        "operationType": "create",
        "ns": _ns("viewOnView"),
        "operationDescription": {"viewOn": "view", "pipeline": PIPELINE},
    },
    {
        "operationType": "modify",
        "ns": _ns("viewOnView"),
        "operationDescription": {"viewOn": "view", "pipeline": UPDATED},
    },
    {"operationType": "drop", "ns": _ns("view")},
    {"operationType": "drop", "ns": _ns("viewOnView")},
)
TS_OPS = (
    ("command", {"create": "timeseries_coll", "timeseries": {"timeField": "time"}}),
    ("command", {"collMod": "timeseries_coll", "timeseries": {"granularity": "minutes"}}),
    ("drop", "timeseries_coll"),
)

CASES = [
    Case(
        "view-create-modify-drop",
        SOURCE,
        "database",
        options=EXPANDED,
        setup=BASE,
        ops=VIEW_OPS,
        expect=VIEW_EVENTS,
    ),
    *[
        Case(
            f"view-resume-after-event-{i}",
            SOURCE,
            "database",
            options=EXPANDED,
            setup=BASE,
            ops=VIEW_OPS,
            resume=("resumeAfter", i),
            expect=VIEW_EVENTS[i + 1 :],
        )
        for i in range(len(VIEW_EVENTS) - 1)
    ],
    Case(
        "view-timeseries-create-modify-drop",
        SOURCE,
        "database",
        options=EXPANDED,
        setup=BASE,
        ops=TS_OPS,
        expect=(
            {
                "operationType": "create",
                "ns": _ns("timeseries_coll"),
                "operationDescription": {
                    "viewOn": "system.buckets.timeseries_coll",
                    "pipeline": [
                        {
                            "$_internalUnpackBucket": {
                                "timeField": "time",
                                "bucketMaxSpanSeconds": 3600,
                            }
                        }
                    ],
                },
            },
            {
                "operationType": "modify",
                "ns": _ns("timeseries_coll"),
                "operationDescription": {
                    "viewOn": "system.buckets.timeseries_coll",
                    "pipeline": [
                        {
                            "$_internalUnpackBucket": {
                                "timeField": "time",
                                "bucketMaxSpanSeconds": 86400,
                            }
                        }
                    ],
                },
            },
            {"operationType": "drop", "ns": _ns("timeseries_coll")},
        ),
    ),
    # A change stream cannot be opened on a view: CommandNotSupportedOnView.
    Case(
        "view-collection-stream-on-view-refused",
        SOURCE,
        "collection",
        coll="view",
        options=EXPANDED,
        setup=(*BASE, _view("view", "base")),
        ops=(),
        error=166,
    ),
    # Not through buckets: a cluster-wide stream filtered to a namespace shows view events by
    # design.
    Case(
        "view-collection-stream-sees-only-the-collection",
        SOURCE,
        "collection",
        coll="view",
        options=EXPANDED,
        setup=BASE,
        buckets=False,
        ops=(_view("view", "base"), ("drop", "view"), ("command", {"create": "view"})),
        expect=(
            {
                "operationType": "create",
                "ns": _ns("view"),
                "collectionUUID": PRESENT,
                "operationDescription": {"idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}},
            },
        ),
    ),
    Case(
        "view-collection-stream-on-base-ignores-views",
        SOURCE,
        "collection",
        coll="base",
        options=EXPANDED,
        setup=BASE,
        ops=(_view("view", "base"), ("drop", "view"), ("insert", "base", {"_id": 0})),
        expect=(
            {
                "operationType": "insert",
                "ns": _ns("base"),
                "collectionUUID": PRESENT,
                "fullDocument": {"_id": 0},
                "documentKey": {"_id": 0},
            },
        ),
    ),
]
