"""jstests/change_streams/lookup_pit_pre_and_post_image.js: point-in-time pre- and post-images
(`fullDocumentBeforeChange` and `fullDocument` set to whenAvailable or required) before and after
changeStreamPreAndPostImages is enabled on the collection. Without recorded images, whenAvailable
gives null and required fails with NoMatchingDocument (47).

The jstest runs each option set as one sequence; here each is two cases: the update made while
images are off, and the update, replacement and delete made after they are enabled."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/lookup_pit_pre_and_post_image.js"
NS = {"db": DB, "coll": "test"}
ORIGINAL = {"_id": 1, "x": 1}
UPDATED = {"_id": 1, "x": 3}
UPDATED_2 = {"_id": 1, "x": 5}
REPLACED = {"_id": 1, "z": 1}
ENABLE = ("command", {"collMod": "test", "changeStreamPreAndPostImages": {"enabled": True}})
INC = ("update", "test", {"_id": 1}, {"$inc": {"x": 2}})
# (fullDocumentBeforeChange, fullDocument) as the jstest's option sets give them.
OPTION_SETS = [
    (None, None),
    ("whenAvailable", None),
    (None, "whenAvailable"),
    ("whenAvailable", "whenAvailable"),
    ("required", None),
    (None, "required"),
    ("required", "required"),
    ("whenAvailable", "required"),
    ("required", "whenAvailable"),
]


def _images(before_mode: str | None, after_mode: str | None, before: object, after: object) -> dict:
    images: dict = {}
    if before_mode:
        images["fullDocumentBeforeChange"] = before
    if after_mode:
        images["fullDocument"] = after
    return images


def _cases(before_mode: str | None, after_mode: str | None) -> list[Case]:
    options = {
        k: v
        for k, v in (("fullDocumentBeforeChange", before_mode), ("fullDocument", after_mode))
        if v
    }
    label = f"{before_mode or 'off'}-{after_mode or 'default'}"
    insert = {
        "operationType": "insert",
        "ns": NS,
        "documentKey": {"_id": 1},
        "fullDocument": ORIGINAL,
    }
    required = "required" in (before_mode, after_mode)
    disabled = Case(
        f"pit-images-{label}-disabled",
        SOURCE,
        "collection",
        coll="test",
        options=options,
        setup=(("command", {"create": "test"}),),
        ops=(("insert", "test", ORIGINAL), INC),
        error=47 if required else None,
        expect=()
        if required
        else (
            insert,
            {
                "operationType": "update",
                "ns": NS,
                "documentKey": {"_id": 1},
                **_images(before_mode, after_mode, None, None),
            },
        ),
    )
    enabled = Case(
        f"pit-images-{label}-enabled",
        SOURCE,
        "collection",
        coll="test",
        options=options,
        setup=(("command", {"create": "test"}), ("insert", "test", ORIGINAL), INC, ENABLE),
        ops=(INC, ("replace", "test", {"_id": 1}, REPLACED), ("delete", "test", {"_id": 1})),
        expect=(
            {
                "operationType": "update",
                "ns": NS,
                "documentKey": {"_id": 1},
                **_images(before_mode, after_mode, UPDATED, UPDATED_2),
            },
            {
                "operationType": "replace",
                "ns": NS,
                "documentKey": {"_id": 1},
                "fullDocument": REPLACED,
                **_images(before_mode, None, UPDATED_2, None),
            },
            {
                "operationType": "delete",
                "ns": NS,
                "documentKey": {"_id": 1},
                **_images(before_mode, None, REPLACED, None),
            },
        ),
    )
    return [disabled, enabled]


CASES = [
    case for before_mode, after_mode in OPTION_SETS for case in _cases(before_mode, after_mode)
]
