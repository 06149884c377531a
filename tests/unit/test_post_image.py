"""post_image (the engine's fullDocument whenAvailable/required): a pre-image with an event's
updateDescription applied equals the document the update produced, for updates simcluster logs as
`$v: 2` diffs (property-tested over generated documents, update operators, several operators at
once, positional paths and pipeline updates)."""

from __future__ import annotations

from typing import Any

import bson
from hypothesis import given, settings
from hypothesis import strategies as st

from mongoformats.update_diff import post_image, update_description_from_diff
from simcluster.updates import pipeline_diff, update_with_entry

names = st.sampled_from(["a", "b", "c", "arr", "sub"])
scalars = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.none())
docs = st.fixed_dictionaries(
    {"_id": st.integers(0, 9)},
    optional={
        "a": scalars,
        "b": scalars,
        "arr": st.lists(scalars, max_size=5),
        "sub": st.fixed_dictionaries(
            {}, optional={"x": scalars, "y": st.lists(scalars, max_size=3)}
        ),
    },
)
updates = st.one_of(
    st.builds(lambda k, v: {"$set": {k: v}}, names, scalars),
    st.builds(lambda k: {"$unset": {k: ""}}, names),
    st.builds(lambda v: {"$set": {"sub.x": v}}, scalars),
    st.builds(lambda i, v: {"$set": {f"arr.{i}": v}}, st.integers(0, 6), scalars),
    st.builds(lambda v: {"$push": {"arr": v}}, scalars),
    st.builds(lambda end: {"$pop": {"arr": end}}, st.sampled_from([1, -1])),
    st.builds(lambda n: {"$push": {"arr": {"$each": [], "$slice": n}}}, st.integers(0, 3)),
    st.builds(lambda v: {"$push": {"arr": {"$each": [v, v]}}}, scalars),
    st.builds(lambda v: {"$addToSet": {"arr": v}}, scalars),
    st.builds(lambda v: {"$pull": {"arr": v}}, scalars),
    st.builds(lambda v: {"$set": {"arr.$[]": v}}, scalars),
    st.builds(lambda v: {"$set": {"sub": {"x": v}}}, scalars),
    st.builds(lambda v: {"$set": {"new.deep.f": v, "new.deep.g": v, "a": v}}, scalars),
    st.builds(lambda v: {"$unset": {"arr.0": ""}, "$set": {"b": v}, "$inc": {"n": 1}}, scalars),
    st.builds(lambda k: {"$rename": {k: "renamed"}}, st.sampled_from(["a", "b", "sub"])),
)


@settings(max_examples=300, deadline=None)
@given(docs, updates)
def test_post_image_equals_the_updated_document(
    before: dict[str, Any], update: dict[str, Any]
) -> None:
    if any(k.startswith("arr") for k in next(iter(update.values()))) and not isinstance(
        before.get("arr"), list
    ):
        before = {**before, "arr": [1, 2, 3]}
    if "sub.x" in next(iter(update.values())) and not isinstance(before.get("sub"), dict):
        before = {**before, "sub": {}}
    after, entry = update_with_entry(before, update)
    if entry is None:
        assert bson.encode(after) == bson.encode(before)  # no entry: nothing changed
        return
    description = update_description_from_diff(entry["diff"])
    assert bson.encode(post_image(before, description)) == bson.encode(
        after
    )  # field order and types too


@settings(max_examples=300, deadline=None)
@given(docs, docs)
def test_post_image_of_a_pipeline_update_equals_its_result(
    before: dict[str, Any], other: dict[str, Any]
) -> None:
    """A pipeline update whose result keeps the old fields' order ($set, $unset stages): the
    server's document diff, when it logs one, rebuilds the result."""
    after = {
        k: other.get(k, v) for k, v in before.items() if k == "_id" or k in other or len(k) % 2
    }
    after.update((k, v) for k, v in other.items() if k not in after)
    after["_id"] = before["_id"]
    if isinstance(before.get("sub"), dict) and isinstance(after.get("sub"), dict):
        # Inside a sub-document too: a field that moves there is logged as an insert, which an
        # updateDescription reports as an update in place (the server's own loss, not post_image's).
        old_sub, new_sub = before["sub"], after["sub"]
        after["sub"] = {k: new_sub[k] for k in old_sub if k in new_sub} | new_sub
    diff = pipeline_diff(before, after)
    if diff is not None:
        description = update_description_from_diff(diff)
        assert bson.encode(post_image(before, description)) == bson.encode(after)
