"""jstests/change_streams/lookup_post_image.js: the `fullDocument` option (absent, "default",
"updateLookup"), the null post-image of an update whose document is gone, and invalidates
without fullDocument.

The index holds a 2018-era version of this jstest; its update events are checked here only for
what that version asserts (operationType and fullDocument), which 7.0/8.0 keep unchanged."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/lookup_post_image.js"
COLL = "change_post_image"
NS = {"db": DB, "coll": COLL}


def _writes(key: str) -> tuple:
    return (
        ("insert", COLL, {"_id": key}),
        ("replace", COLL, {"_id": key}, {"_id": key, "replaced": True}),
        ("update", COLL, {"_id": key}, {"$set": {"updated": True}}),
    )


def _events(key: str, looked_up: bool) -> tuple:
    post = {"fullDocument": {"_id": key, "replaced": True, "updated": True}} if looked_up else {}
    return (
        {
            "operationType": "insert",
            "ns": NS,
            "documentKey": {"_id": key},
            "fullDocument": {"_id": key},
        },
        {
            "operationType": "replace",
            "ns": NS,
            "documentKey": {"_id": key},
            "fullDocument": {"_id": key, "replaced": True},
        },
        {
            "operationType": "update",
            "ns": NS,
            "documentKey": {"_id": key},
            "updateDescription": {
                "updatedFields": {"updated": True},
                "removedFields": [],
                "truncatedArrays": [],
            },
            **post,
        },
    )


SETUP = (("command", {"create": COLL}),)
LOOKUP = {"fullDocument": "updateLookup"}

CASES = [
    Case(
        "post-image-not-specified",
        SOURCE,
        "collection",
        coll=COLL,
        setup=SETUP,
        ops=_writes("fullDocument not specified"),
        expect=_events("fullDocument not specified", False),
    ),
    Case(
        "post-image-default",
        SOURCE,
        "collection",
        coll=COLL,
        setup=SETUP,
        options={"fullDocument": "default"},
        ops=_writes("fullDocument is default"),
        expect=_events("fullDocument is default", False),
    ),
    Case(
        "post-image-update-lookup",
        SOURCE,
        "collection",
        coll=COLL,
        setup=SETUP,
        options=LOOKUP,
        ops=_writes("fullDocument is lookup"),
        expect=_events("fullDocument is lookup", True),
    ),
    Case(
        "post-image-of-deleted-document-is-null",
        SOURCE,
        "collection",
        coll=COLL,
        options=LOOKUP,
        setup=(*SETUP, ("insert", COLL, {"_id": "fullDocument is lookup"})),
        pipeline=({"$match": {"operationType": "update"}},),
        ops=(
            ("update", COLL, {"_id": "fullDocument is lookup"}, {"$set": {"updatedAgain": True}}),
            ("delete", COLL, {"_id": "fullDocument is lookup"}),
        ),
        expect=(
            {
                "operationType": "update",
                "ns": NS,
                "documentKey": {"_id": "fullDocument is lookup"},
                "fullDocument": None,
                "updateDescription": {
                    "updatedFields": {"updatedAgain": True},
                    "removedFields": [],
                    "truncatedArrays": [],
                },
            },
        ),
    ),
    Case(
        "post-image-after-drop-is-null",
        SOURCE,
        "collection",
        coll=COLL,
        options=LOOKUP,
        setup=SETUP,
        pipeline=({"$match": {"operationType": {"$in": ["insert", "update"]}}},),
        ops=(
            ("insert", COLL, {"_id": "fullDocument is lookup 2"}),
            ("update", COLL, {"_id": "fullDocument is lookup 2"}, {"$set": {"updated": True}}),
            ("drop", COLL),
        ),
        expect=(
            {
                "operationType": "insert",
                "ns": NS,
                "documentKey": {"_id": "fullDocument is lookup 2"},
                "fullDocument": {"_id": "fullDocument is lookup 2"},
            },
            {
                "operationType": "update",
                "ns": NS,
                "documentKey": {"_id": "fullDocument is lookup 2"},
                "fullDocument": None,
                "updateDescription": {
                    "updatedFields": {"updated": True},
                    "removedFields": [],
                    "truncatedArrays": [],
                },
            },
        ),
    ),
    Case(
        "post-image-invalidate-has-no-full-document",
        SOURCE,
        "collection",
        coll="collInvalidate",
        options=LOOKUP,
        setup=(("command", {"create": "collInvalidate"}),),
        ops=(
            ("insert", "collInvalidate", {"_id": "testing invalidate"}),
            ("drop", "collInvalidate"),
        ),
        expect=(
            {
                "operationType": "insert",
                "ns": {"db": DB, "coll": "collInvalidate"},
                "documentKey": {"_id": "testing invalidate"},
                "fullDocument": {"_id": "testing invalidate"},
            },
            {"operationType": "drop", "ns": {"db": DB, "coll": "collInvalidate"}},
            {"operationType": "invalidate"},
        ),
    ),
    Case(
        "post-image-real-get-more",
        SOURCE,
        "collection",
        coll="real_get_more",
        options=LOOKUP,
        setup=(("insert", "real_get_more", {"_id": "getMoreEnabled"}),),
        ops=(("update", "real_get_more", {"_id": "getMoreEnabled"}, {"$set": {"updated": True}}),),
        expect=(
            {
                "operationType": "update",
                "ns": {"db": DB, "coll": "real_get_more"},
                "documentKey": {"_id": "getMoreEnabled"},
                "fullDocument": {"_id": "getMoreEnabled", "updated": True},
                "updateDescription": {
                    "updatedFields": {"updated": True},
                    "removedFields": [],
                    "truncatedArrays": [],
                },
            },
        ),
    ),
]
