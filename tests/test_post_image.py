"""post_image (the engine's fullDocument whenAvailable/required): a pre-image with an event's
updateDescription applied equals the document the update produced, for updates simcluster logs as
`$v: 2` diffs (property-tested over generated documents and update operators)."""

from __future__ import annotations

from typing import Any

import bson
from hypothesis import given, settings
from hypothesis import strategies as st

from mongoformats.update_diff import post_image, update_description_from_diff
from simcluster import query as q

names = st.sampled_from(["a", "b", "c", "arr", "sub"])
scalars = st.one_of(st.integers(-5, 5), st.text(max_size=3), st.none())
docs = st.fixed_dictionaries({"_id": st.integers(0, 9)}, optional={
    "a": scalars, "b": scalars, "arr": st.lists(scalars, max_size=5),
    "sub": st.fixed_dictionaries({}, optional={"x": scalars, "y": st.lists(scalars, max_size=3)})})
updates = st.one_of(
    st.builds(lambda k, v: {"$set": {k: v}}, names, scalars),
    st.builds(lambda k: {"$unset": {k: ""}}, names),
    st.builds(lambda v: {"$set": {"sub.x": v}}, scalars),
    st.builds(lambda i, v: {"$set": {f"arr.{i}": v}}, st.integers(0, 6), scalars),
    st.builds(lambda v: {"$push": {"arr": v}}, scalars),
    st.builds(lambda end: {"$pop": {"arr": end}}, st.sampled_from([1, -1])),
    st.builds(lambda n: {"$push": {"arr": {"$each": [], "$slice": n}}}, st.integers(0, 3)),
)


@settings(max_examples=300, deadline=None)
@given(docs, updates)
def test_post_image_equals_the_updated_document(before: dict[str, Any], update: dict[str, Any]) -> None:
    if any(k.startswith("arr") for k in next(iter(update.values()))) and not isinstance(before.get("arr"), list):
        before = {**before, "arr": [1, 2, 3]}
    if "sub.x" in next(iter(update.values())) and not isinstance(before.get("sub"), dict):
        before = {**before, "sub": {}}
    after = q.apply_update(before, update)
    if after == before:
        return
    description = update_description_from_diff(q.compute_diff(before, after))
    assert bson.encode(post_image(before, description)) == bson.encode(after)  # field order and types too
