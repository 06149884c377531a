"""jstests/change_streams/expanded_update_description.js (requires_fcv_61): `updateDescription`
with showExpandedEvents, and which paths `disambiguatedPaths` reports.

The jstest runs its updates one after the other on one document; each case here replays the
earlier updates before the stream opens and watches only its own update."""

from tests.conformance.model import DB, Case

SOURCE = "jstests/change_streams/expanded_update_description.js"
NS = {"db": DB, "coll": "c"}
LARGE = "*" * 128
DOC = {
    "_id": 100,
    "topLevelArray": [{"subArray": [0, [0, [{"bottomArray": [1, 2, LARGE]}]], 2, 3, LARGE]}],
    "arrayForReplacement": [0, 1, 2, 3],
    "arrayForResize": [LARGE, 1],
    "obj": {
        "sub.obj": {"d.o.t.t.e.d.a.r.r.a.y..": [[{"a": {"b.c": 1, "field": LARGE}}, "truncated"]]}
    },
    "d.o.t.t.e.d.o.b.j.": {"sub.obj": {"b.c": 2}},
    "objectWithNumericField": {"0": {"1": "numeric", "field": LARGE}},
    "arrayWithNumericField": [[{"0": "numeric", "a": {"b.c": 1}, "field": LARGE}]],
    "arrayWithDotted.AndNumericFields": [[{"0": [{"1.2": {"a.b": None, "c": LARGE}}]}]],
}


def _set_field(name: str, value: object) -> dict:
    return {"$replaceWith": {"$setField": {"field": name, "input": "$$ROOT", "value": value}}}


# (case name, the update, the updateDescription the jstest expects)
STEPS = [
    (
        "array-indices-not-ambiguous",
        {
            "$set": {
                "a": 2,
                "topLevelArray.0.subArray.1.1.0.bottomArray.2": 3,
                "arrayForReplacement": [0],
            }
        },
        {
            "updatedFields": {
                "arrayForReplacement": [0],
                "a": 2,
                "topLevelArray.0.subArray.1.1.0.bottomArray.2": 3,
            },
            "removedFields": [],
            "truncatedArrays": [],
            "disambiguatedPaths": {},
        },
    ),
    (
        "numeric-field-in-array-is-a-string",
        {"$set": {"arrayWithNumericField.0.0.1": {"b.c": 1}}},
        {
            "updatedFields": {"arrayWithNumericField.0.0.1": {"b.c": 1}},
            "removedFields": [],
            "truncatedArrays": [],
            "disambiguatedPaths": {
                "arrayWithNumericField.0.0.1": ["arrayWithNumericField", 0, 0, "1"]
            },
        },
    ),
    (
        "numeric-object-fields",
        {"$set": {"objectWithNumericField.0.1": "updated"}},
        {
            "updatedFields": {"objectWithNumericField.0.1": "updated"},
            "removedFields": [],
            "truncatedArrays": [],
            "disambiguatedPaths": {
                "objectWithNumericField.0.1": ["objectWithNumericField", "0", "1"]
            },
        },
    ),
    (
        "unset-array-not-reported",
        [{"$unset": ["arrayForReplacement"]}],
        {
            "updatedFields": {},
            "removedFields": ["arrayForReplacement"],
            "truncatedArrays": [],
            "disambiguatedPaths": {},
        },
    ),
    (
        "truncated-array-not-reported",
        [_set_field("arrayForResize", [LARGE])],
        {
            "updatedFields": {},
            "removedFields": [],
            "truncatedArrays": [{"field": "arrayForResize", "newSize": 1}],
            "disambiguatedPaths": {},
        },
    ),
    (
        "top-level-dotted-fields",
        [_set_field("d.o.t.t.e.d.o.b.j.", {"subObj": 1}), _set_field("new.Field.", 1)],
        {
            "updatedFields": {"d.o.t.t.e.d.o.b.j.": {"subObj": 1}, "new.Field.": 1},
            "removedFields": [],
            "truncatedArrays": [],
            "disambiguatedPaths": {
                "d.o.t.t.e.d.o.b.j.": ["d.o.t.t.e.d.o.b.j."],
                "new.Field.": ["new.Field."],
            },
        },
    ),
    (
        "dotted-fields-and-array-indices",
        [
            {
                "$set": {
                    "obj": {
                        "$setField": {
                            "field": "sub.obj",
                            "input": "$obj",
                            "value": {
                                "$literal": {
                                    "d.o.t.t.e.d.a.r.r.a.y..": [[{"a": {"b.c": 2, "field": LARGE}}]]
                                }
                            },
                        }
                    }
                }
            }
        ],
        {
            "updatedFields": {"obj.sub.obj.d.o.t.t.e.d.a.r.r.a.y...0.0.a.b.c": 2},
            "removedFields": [],
            "truncatedArrays": [{"field": "obj.sub.obj.d.o.t.t.e.d.a.r.r.a.y...0", "newSize": 1}],
            "disambiguatedPaths": {
                "obj.sub.obj.d.o.t.t.e.d.a.r.r.a.y...0": [
                    "obj",
                    "sub.obj",
                    "d.o.t.t.e.d.a.r.r.a.y..",
                    0,
                ],
                "obj.sub.obj.d.o.t.t.e.d.a.r.r.a.y...0.0.a.b.c": [
                    "obj",
                    "sub.obj",
                    "d.o.t.t.e.d.a.r.r.a.y..",
                    0,
                    0,
                    "a",
                    "b.c",
                ],
            },
        },
    ),
    (
        "dotted-numeric-and-array-index",
        [
            _set_field(
                "arrayWithDotted.AndNumericFields",
                {"$literal": [[{"0": [{"1.2": {"a.b": True, "c": LARGE}}]}]]},
            )
        ],
        {
            "updatedFields": {"arrayWithDotted.AndNumericFields.0.0.0.0.1.2.a.b": True},
            "removedFields": [],
            "truncatedArrays": [],
            "disambiguatedPaths": {
                "arrayWithDotted.AndNumericFields.0.0.0.0.1.2.a.b": [
                    "arrayWithDotted.AndNumericFields",
                    0,
                    0,
                    "0",
                    0,
                    "1.2",
                    "a.b",
                ]
            },
        },
    ),
]


def _cases() -> list[Case]:
    out = []
    for i, (name, update, description) in enumerate(STEPS):
        before = tuple(("update", "c", {"_id": 100}, u) for _, u, _ in STEPS[:i])
        out.append(
            Case(
                f"expanded-update-{name}",
                SOURCE,
                "collection",
                options={"showExpandedEvents": True},
                setup=(("insert", "c", DOC), *before),
                ops=(("update", "c", {"_id": 100}, update),),
                expect=(
                    {
                        "documentKey": {"_id": 100},
                        "ns": NS,
                        "operationType": "update",
                        "updateDescription": description,
                    },
                ),
            )
        )
    return out


CASES = _cases()
