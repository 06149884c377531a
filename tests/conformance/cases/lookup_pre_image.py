"""jstests/change_streams/lookup_pre_image.js: `fullDocumentBeforeChange` off, whenAvailable and
required (with fullDocument: updateLookup) on a collection with changeStreamPreAndPostImages
enabled, and then disabled. The jstest opens the three streams side by side; each is a case.

The jstest reads each event before its next write, so that updateLookup finds the document the
update left; the runner reads after all writes, so the delete is a case of its own."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/lookup_pre_image.js"
COLL = "change_stream_pre_images"
NS = {"db": DB, "coll": COLL}


def _setup(enabled: bool) -> tuple:
    return (
        ("command", {"create": COLL}),
        ("command", {"collMod": COLL, "changeStreamPreAndPostImages": {"enabled": enabled}}),
    )


def _ops(key: str) -> tuple:
    return (
        ("insert", COLL, {"_id": key}),
        ("replace", COLL, {"_id": key}, {"foo": "bar"}),
        ("update", COLL, {"_id": key}, {"$set": {"foo": "baz"}}),
    )


def _events(key: str, pre: bool | None) -> tuple:
    """The four events; `pre` True: with pre-images, None: with null pre-images, False: without."""
    images: list = (
        [None] * 3
        if pre is None
        else [{"_id": key}, {"_id": key, "foo": "bar"}, {"_id": key, "foo": "baz"}]
    )
    before: list[dict] = [{}, *({"fullDocumentBeforeChange": image} for image in images)]
    if pre is False:
        before = [{}, {}, {}]
    return (
        {
            "operationType": "insert",
            "ns": NS,
            "documentKey": {"_id": key},
            "fullDocument": {"_id": key},
            **before[0],
        },
        {
            "operationType": "replace",
            "ns": NS,
            "documentKey": {"_id": key},
            "fullDocument": {"_id": key, "foo": "bar"},
            **before[1],
        },
        {
            "operationType": "update",
            "ns": NS,
            "documentKey": {"_id": key},
            "fullDocument": {"_id": key, "foo": "baz"},
            "updateDescription": {
                "updatedFields": {"foo": "baz"},
                "removedFields": [],
                "truncatedArrays": [],
            },
            **before[2],
        },
    )


def _delete(key: str, pre: bool | None) -> dict:
    image = (
        {}
        if pre is False
        else {"fullDocumentBeforeChange": {"_id": key, "foo": "baz"} if pre else None}
    )
    return {"operationType": "delete", "ns": NS, "documentKey": {"_id": key}, **image}


def _options(mode: str) -> dict:
    return {"fullDocumentBeforeChange": mode, "fullDocument": "updateLookup"}


def _case(name: str, enabled: bool, mode: str, **kwargs: object) -> Case:
    return Case(
        f"pre-image-{name}",
        SOURCE,
        "collection",
        coll=COLL,
        options=_options(mode),
        setup=_setup(enabled),
        ops=_ops("x" if enabled else "y"),
        **kwargs,
    )  # type: ignore[arg-type]


def _delete_case(name: str, enabled: bool, mode: str, pre: bool | None) -> Case:
    key = "x" if enabled else "y"
    return Case(
        f"pre-image-delete-{name}",
        SOURCE,
        "collection",
        coll=COLL,
        options=_options(mode),
        setup=(*_setup(enabled), ("insert", COLL, {"_id": key, "foo": "baz"})),
        ops=(("delete", COLL, {"_id": key}),),
        expect=(_delete(key, pre),),
    )


CASES = [
    _case("off", True, "off", expect=_events("x", False)),
    _case("when-available", True, "whenAvailable", expect=_events("x", True)),
    _case("required", True, "required", expect=_events("x", True)),
    _case("disabled-off", False, "off", expect=_events("y", False)),
    _case("disabled-when-available-is-null", False, "whenAvailable", expect=_events("y", None)),
    # NoMatchingDocument at the replace, the first event that needs a pre-image.
    _case("disabled-required-fails", False, "required", error=47),
    _delete_case("off", True, "off", False),
    _delete_case("when-available", True, "whenAvailable", True),
    _delete_case("required", True, "required", True),
    _delete_case("disabled-when-available-is-null", False, "whenAvailable", None),
]
