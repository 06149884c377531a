"""The stages after $changeStream, applied in the proxy: $project by the server's rules, and
everything apply_stages does not evaluate named by unsupported_in_stages (so the proxy leaves
such a watch() to mongos)."""

import pytest
from bson import Decimal128, Int64, MinKey

from mongoformats.change_stages import apply_stages, compile_stages, unsupported_in_stages
from mongoformats.errors import MongoError
from mongoformats.expressions import evaluate

TOKEN = {"_data": "82AA"}


def project(doc, spec):
    """`doc` (given an `_id` token, which $project keeps where it is) through one $project."""
    out = apply_stages({"_id": TOKEN, **doc}, compile_stages([{"$project": spec}]), TOKEN)
    assert out.pop("_id") == TOKEN
    return out


def as_list(doc):
    return [(k, as_list(v) if isinstance(v, dict) else v) for k, v in doc.items()]


@pytest.mark.parametrize(
    ("doc", "spec", "want"),
    [
        # Included fields keep the input's order, whatever the spec's.
        ({"b": 1, "a": 0, "c": 2}, {"a": 1, "b": True, "c": 5}, {"b": 1, "a": 0, "c": 2}),
        # Computed fields follow the inclusions, in the spec's order, even one replacing a field.
        ({"b": 1, "a": 1}, {"b": {"$literal": "new"}, "a": 1}, {"a": 1, "b": "new"}),
        ({"x": 1}, {"second": "$x", "first": "lit"}, {"second": 1, "first": "lit"}),
        # A dotted inclusion: a sub-document keeps its own order; a missing or scalar parent is
        # left out.
        ({"a": {"c": 2, "b": 1, "d": 3}}, {"a.b": 1, "a.c": 1}, {"a": {"c": 2, "b": 1}}),
        ({"a": {"c": 1}}, {"a.b": 1}, {"a": {}}),
        ({"a": "scalar"}, {"a.b": 1}, {}),
        # Through an array, element by element: what is neither document nor array is dropped.
        (
            {"a": [1, {}, {"b": 1, "c": 2}, [], [1, {"c": 1}]]},
            {"a.b": 1},
            {"a": [{}, {"b": 1}, [], [{}]]},
        ),
        # A computed dotted field makes documents of scalars, in arrays too, and of a missing
        # parent.
        ({"a": [1, {"b": 1, "c": 2}, []]}, {"a.b": "new"}, {"a": [{"b": "new"}, {"b": "new"}, []]}),
        ({}, {"s.t": "v"}, {"s": {"t": "v"}}),
        # A nested rule keeps its field's input position, even when it computes into a scalar.
        ({"b": 4, "a": 1}, {"b.c": "new", "a": 1}, {"b": {"c": "new"}, "a": 1}),
        # Dotted paths and nested documents of fields are the same rules.
        (
            {"a": {"b": 1, "c": 2, "d": 3}},
            {"a.b": 1, "a": {"d": 1, "X": "x"}},
            {"a": {"b": 1, "d": 3, "X": "x"}},
        ),
        # _id alone: 1 keeps only it, 0 drops only it (here the token, see below).
        ({"a": 1}, {"_id": 1}, {}),
        # Exclusion, dotted and through arrays.
        ({"a": [{"b": 1, "c": 2}, 5], "d": 1}, {"a.b": 0, "d": 0}, {"a": [{"c": 2}, 5]}),
        # Expressions: arrays of expressions and $literal; a path that finds nothing leaves its
        # field out, is null in an array; a path through an array collects what its elements hold.
        (
            {"x": 1},
            {"v": ["$x", {"$literal": "$x"}, {"k": "$x", "m": "$no"}, "$no"], "w": "$no"},
            {"v": [1, "$x", {"k": 1}, None]},
        ),
        ({"a": [{"b": 1}, {"c": 2}, 3, [{"b": 4}]]}, {"v": "$a.b"}, {"v": [1, [4]]}),
    ],
)
def test_project_follows_the_servers_rules(doc, spec, want):
    got = project(doc, spec)
    assert as_list(got) == as_list(want)


@pytest.mark.parametrize(
    ("doc", "spec", "want"),
    [
        # A field set anew keeps its place; new fields follow in the spec's order; true is a value.
        (
            {"first": 0, "second": 1, "third": 2},
            {"new": True, "second": "$third"},
            {"first": 0, "second": 2, "third": 2, "new": True},
        ),
        # A nested rule keeps the sub-document's other fields and appends new ones.
        ({"a": {"c": 1, "b": 0}}, {"a.b": 1, "a": {"d": "$a.c"}}, {"a": {"c": 1, "b": 1, "d": 1}}),
        # ... makes documents of scalars and of missing parents ...
        ({"a": {"b": "other"}}, {"a.b.c": "v"}, {"a": {"b": {"c": "v"}}}),
        # ... and applies to each element of an array, nested arrays too.
        (
            {"a": [1, {}, {"c": 2}, [], [1, {"c": 1}]]},
            {"a.b": True},
            {
                "a": [
                    {"b": True},
                    {"b": True},
                    {"c": 2, "b": True},
                    [],
                    [{"b": True}, {"c": 1, "b": True}],
                ]
            },
        ),
    ],
)
def test_add_fields_follows_the_servers_rules(doc, spec, want):
    for name in ("$addFields", "$set"):
        out = apply_stages({"_id": TOKEN, **doc}, compile_stages([{name: spec}]), TOKEN)
        assert out.pop("_id") == TOKEN
        assert as_list(out) == as_list(want)


def test_unset_removes_dotted_paths_through_arrays():
    doc = {"_id": TOKEN, "a": [{"b": 1, "c": 2}, 3], "d": 4}
    out = apply_stages(doc, compile_stages([{"$unset": ["a.b", "d"]}]), TOKEN)
    assert out == {"_id": TOKEN, "a": [{"c": 2}, 3]}


def test_project_that_drops_the_token_fails_the_stream():
    with pytest.raises(MongoError) as err:
        apply_stages(
            {"_id": TOKEN, "a": 1}, compile_stages([{"$project": {"a": 1, "_id": 0}}]), TOKEN
        )
    assert err.value.code == 280


# Debezium's pipeline in its default regex filter mode (ChangeStreamPipelineFactory): the event
# under `event` beside its namespace, matched there, then made the root again.
DEBEZIUM = [
    {
        "$replaceRoot": {
            "newRoot": {"namespace": {"$concat": ["$ns.db", ".", "$ns.coll"]}, "event": "$$ROOT"}
        }
    },
    {
        "$match": {
            "$and": [
                {"namespace": {"$regex": "shop\\.(orders|items)", "$options": "i"}},
                {"event.operationType": {"$in": ["insert", "update", "replace", "delete"]}},
            ]
        }
    },
    {"$replaceRoot": {"newRoot": "$event"}},
]

# What Debezium puts first in its oversize "skip" mode: events whose documents are over a size
# limit are dropped. $bsonSize of a missing document is null, which is below every number.
DEBEZIUM_SKIP = [
    {
        "$match": {
            "$and": [
                {"$expr": {"$lte": [{"$bsonSize": "$fullDocument"}, 40]}},
                {"$expr": {"$lte": [{"$bsonSize": "$fullDocumentBeforeChange"}, 40]}},
            ]
        }
    }
]


def test_debeziums_pipeline_returns_the_events_it_matches_unchanged():
    event = {
        "_id": TOKEN,
        "operationType": "insert",
        "ns": {"db": "shop", "coll": "Orders"},
        "documentKey": {"_id": 1},
    }
    stages = compile_stages(DEBEZIUM)
    assert apply_stages(dict(event), stages, TOKEN) == event
    assert apply_stages({**event, "ns": {"db": "shop", "coll": "carts"}}, stages, TOKEN) is None
    assert apply_stages({**event, "ns": {"db": "shop"}}, stages, TOKEN) is None  # namespace null


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["$s", "-", "$s"], "x-x"),
        (["$s", "$missing", 5], None),
        (["$s", None], None),
        ("$s", "x"),
        ([], ""),
    ],
)
def test_concat_is_null_at_the_first_null_or_missing_argument(args, want):
    out = apply_stages(
        {"_id": TOKEN, "s": "x"}, compile_stages([{"$set": {"c": {"$concat": args}}}]), TOKEN
    )
    assert out["c"] == want


def test_concat_of_a_non_string_and_a_root_that_is_no_document_fail_as_the_server_does():
    with pytest.raises(MongoError) as err:
        apply_stages(
            {"_id": TOKEN, "n": 1},
            compile_stages([{"$set": {"c": {"$concat": ["$n", "$missing"]}}}]),
            TOKEN,
        )
    assert (err.value.code, err.value.errmsg) == (16702, "$concat only supports strings, not int")
    with pytest.raises(MongoError) as err:
        apply_stages({"_id": TOKEN}, compile_stages([{"$replaceWith": "$missing"}]), TOKEN)
    assert err.value.code == 40228 and err.value.errmsg.startswith(
        "'replacement document' must evaluate to an object, but resulting value was: MISSING. "
        "Type of resulting value: 'missing'."
    )
    assert apply_stages(
        {"_id": TOKEN, "a": 1}, compile_stages([{"$set": {"a": "$$REMOVE"}}]), TOKEN
    ) == {"_id": TOKEN}


@pytest.mark.parametrize(
    ("stages", "named"),
    [
        (
            [
                {"$match": {"operationType": {"$in": ["insert"]}}},
                {"$project": {"ns.coll": 1, "x": "$ns.db"}},
                {"$set": {"k": ["$operationType", 1]}},
                {"$unset": ["wallTime"]},
            ],
            None,
        ),
        ([{"$match": {"$or": [{"a": 1}, {"b": {"$not": {"$gt": 2}}}], "$comment": "c"}}], None),
        (
            [{"$replaceRoot": {"newRoot": "$fullDocument"}}],
            "a $replaceRoot whose new root may not be a document",
        ),
        ([{"$replaceWith": {"$mergeObjects": ["$$ROOT", {"a": 1}]}}], "$mergeObjects"),
        (
            [{"$replaceRoot": {"newRoot": {"e": "$$ROOT"}, "x": 1}}],
            "a $replaceRoot spec other than {newRoot: <expression>}",
        ),
        (DEBEZIUM, None),
        # A field known to be a document no longer is once a projection may have changed it.
        (
            DEBEZIUM[:2] + [{"$set": {"event": 1}}, DEBEZIUM[2]],
            "a $replaceRoot whose new root may not be a document",
        ),
        ([{"$match": {"$expr": {"$eq": ["$operationType", "insert"]}}}], None),
        (DEBEZIUM_SKIP + DEBEZIUM, None),
        ([{"$match": {"a": {"$elemMatch": {"$expr": {"$eq": ["$b", 1]}}}}}], "$expr"),
        ([{"$match": {"$expr": {"$lte": [1]}}}], "$lte with 1 arguments"),
        (
            [{"$match": {"$expr": {"$eq": [1, 1], "x": 1}}}],
            "an expression object with an operator and other fields",
        ),
        ([{"$match": {"$expr": {"$bsonSize": ["$a", "$b"]}}}], "$bsonSize with 2 arguments"),
        ([{"$match": {"$expr": {"$mergeObjects": ["$a"]}}}], "$mergeObjects"),
        ([{"$set": {"x": {"$ifNull": ["$a", "$b", 0]}}}], None),
        ([{"$set": {"x": {"$ifNull": ["$a"]}}}], "$ifNull with 1 arguments"),
        ([{"$set": {"x": "$a..b"}}], "the field path '$a..b'"),
        ([{"$match": {"$where": "true"}}], "$where"),
        ([{"$match": {"a": {"$mod": [2, 0]}}}], "$mod"),
        ([{"$match": {"a": {"$elemMatch": {"b": {"$bitsAllSet": 1}}}}}], "$bitsAllSet"),
        ([{"$match": {"a": {"$in": 5}}}], "$in without an array"),
        ([{"$project": {"x": {"$concat": ["$a", "b"]}}}], None),
        ([{"$project": {"x": {"$toUpper": "$a"}}}], "$toUpper"),
        ([{"$project": {"x": "$$ROOT", "y": "$$CURRENT.a"}}], None),
        ([{"$project": {"x": "$$CLUSTER_TIME"}}], "$$CLUSTER_TIME"),
        ([{"$project": {"a": 1, "b": 0}}], "a $project that mixes inclusion and exclusion"),
        ([{"$project": {"a": 1, "a.b": 1}}], "a path collision at 'a.b'"),
        (
            [{"$set": {"fullDocument.x": 1, "ns": {"db": "x"}}}, {"$unset": ["fullDocument.y"]}],
            None,
        ),
        ([{"$set": {"a.$b": 1}}], "the field name 'a.$b'"),
        ([{"$unset": []}], "an $unset without field names"),
        ([{"$addFields": {"a": "$$NOW"}}], "$$NOW"),
    ],
)
def test_unsupported_in_stages_names_what_apply_stages_does_not_evaluate(stages, named):
    assert unsupported_in_stages(stages) == named


def test_debeziums_skip_mode_drops_only_events_whose_documents_are_over_its_limit():
    event = {
        "_id": TOKEN,
        "operationType": "update",
        "ns": {"db": "shop", "coll": "orders"},
        "documentKey": {"_id": 1},
    }
    stages = compile_stages(DEBEZIUM_SKIP + DEBEZIUM)
    assert apply_stages(dict(event), stages, TOKEN) == event  # no documents: null <= 40
    small = {
        **event,
        "fullDocument": {"_id": 1, "s": "x" * 18},
    }  # 40 bytes: 4 + 9 (_id) + 26 (s) + 1
    assert apply_stages(dict(small), stages, TOKEN) == small
    assert apply_stages({**small, "fullDocument": {"_id": 1, "s": "x" * 19}}, stages, TOKEN) is None
    assert (
        apply_stages(
            {**event, "fullDocumentBeforeChange": {"_id": 1, "s": "x" * 19}}, stages, TOKEN
        )
        is None
    )
    assert apply_stages({**event, "fullDocument": None}, stages, TOKEN) == {
        **event,
        "fullDocument": None,
    }


def expr(doc, e):
    """Whether `doc` passes {$match: {$expr: e}}."""
    return (
        apply_stages({"_id": TOKEN, **doc}, compile_stages([{"$match": {"$expr": e}}]), TOKEN)
        is not None
    )


@pytest.mark.parametrize(
    ("e", "want"),
    [
        # Value::compare: a missing value ranks below null (with undefined), above MinKey; no type
        # bracketing: a string is above every number.
        ({"$lt": ["$missing", None]}, True),
        ({"$eq": ["$missing", None]}, False),
        ({"$eq": ["$n", None]}, True),
        ({"$gt": ["$missing", {"$literal": MinKey()}]}, True),
        ({"$gt": ["abc", 10**9]}, True),
        ({"$eq": ["$i", 1.0]}, True),
        ({"$gte": ["$i", Int64(2)]}, False),
        ({"$ne": ["$s", "x"]}, False),
        ({"$cmp": ["$s", "y"]}, True),
        ({"$cmp": ["$s", "x"]}, False),  # -1 is true, 0 false
        # $in compares as $eq does: null is not missing.
        ({"$in": ["$s", ["a", "x"]]}, True),
        ({"$in": ["$missing", [None]]}, False),
        ({"$in": ["$i", [1.0]]}, True),
        # Conditions as coerceToBool takes them: numeric zero, null and missing are false, NaN and
        # "" true.
        ({"$and": ["$i", "$s", "$nan", "$empty"]}, True),
        ({"$or": ["$zero", "$n", "$missing", False]}, False),
        ({"$not": "$zero"}, True),
        ({"$not": ["$i"]}, False),
        ({"$and": []}, True),
        ({"$or": []}, False),
        ("$d0", False),
        ("$d1", True),
        # $bsonSize: a document's encoded size; null for null and missing.
        ({"$eq": [{"$bsonSize": "$doc"}, 12]}, True),
        ({"$eq": [{"$bsonSize": "$missing"}, None]}, True),
        ({"$eq": [{"$bsonSize": "$$ROOT"}, None]}, False),
        # $ifNull: the first input neither null nor missing, else the last argument (missing too).
        ({"$eq": [{"$ifNull": ["$missing", "$n", "$s", "y"]}, "x"]}, True),
        ({"$eq": [{"$ifNull": ["$missing", "$n", "y"]}, "y"]}, True),
        ({"$eq": [{"$ifNull": ["$n", "$missing"]}, None]}, False),
        ({"$lt": [{"$ifNull": ["$n", "$missing"]}, None]}, True),
        ({"$eq": [{"$ifNull": ["$zero", 1]}, 0]}, True),
    ],
)
def test_expr_evaluates_as_the_server_does(e, want):
    doc = {
        "i": 1,
        "s": "x",
        "n": None,
        "nan": float("nan"),
        "empty": "",
        "zero": 0.0,
        "doc": {"a": 1},
        "d0": Decimal128("0.00"),
        "d1": Decimal128("NaN"),
    }
    assert expr(doc, e) is want


@pytest.mark.parametrize(
    ("e", "code", "message"),
    [
        ({"$bsonSize": "$s"}, 31393, "$bsonSize requires a document input, found: string"),
        (
            {"$in": [1, "$missing"]},
            40081,
            "$in requires an array as a second argument, found: missing",
        ),
        ({"$in": [1, "$s"]}, 40081, "$in requires an array as a second argument, found: string"),
    ],
)
def test_expr_errors_are_the_servers(e, code, message):
    with pytest.raises(MongoError) as err:
        expr({"s": "x"}, e)
    assert (err.value.code, err.value.errmsg) == (code, message)


def test_evaluate_refuses_variables_and_operators_it_does_not_know():
    """An undefined user variable is the server's 17276 ("Use of undefined variable", Variables::
    getValue in src/mongo/db/pipeline/variables.cpp); system variables and operators it does not
    implement are NotImplemented (unsupported_in_stages leaves those pipelines to the server)."""
    doc = {"a": {"b": 1}}
    assert evaluate(doc, "$$ROOT.a.b") == 1
    assert evaluate(doc, {"$literal": "$a"}) == "$a"
    assert evaluate(doc, {"x": "$a.b", "y": "$missing"}) == {"x": 1}
    for e, code_name in (
        ("$$user", "Location17276"),
        ("$$NOW", "NotImplemented"),
        ({"$mergeObjects": ["$a"]}, "NotImplemented"),
    ):
        with pytest.raises(MongoError) as caught:
            evaluate(doc, e)
        assert caught.value.code_name == code_name, e
