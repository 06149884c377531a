"""OplogTransformer's stream-shape options, entry by entry (no sockets): a single-collection
stream's transformer makes no view events, and one resumed from an older token keeps that token's
version up to its clusterTime (ChangeStreamEventTransformation::makeResumeToken)."""

from __future__ import annotations

import uuid

import bson
from bson import Binary, Timestamp

from mongoformats.change_events import OplogTransformer
from mongoformats.resume_token import decode_token

_UI = Binary(uuid.UUID(int=7).bytes, 4)


def _insert(secs: int, _id: int) -> bytes:
    return bson.encode(
        {
            "op": "i",
            "ns": "d.c",
            "ui": _UI,
            "o": {"_id": _id},
            "o2": {"_id": _id},
            "ts": Timestamp(secs, 1),
            "t": 1,
            "v": 2,
            "wall": None,
        }
    )


def _view_insert() -> bytes:
    return bson.encode(
        {
            "op": "i",
            "ns": "d.system.views",
            "ui": _UI,
            "o": {"_id": "d.v", "viewOn": "c", "pipeline": []},
            "ts": Timestamp(5, 1),
            "t": 1,
            "v": 2,
        }
    )


def test_view_events_only_where_the_stream_takes_them():
    assert [
        ev.op_type for ev in OplogTransformer(show_expanded_events=True).transform(_view_insert())
    ] == ["create"]
    single = OplogTransformer(show_expanded_events=True, view_events=False)
    assert single.transform(_view_insert()) == []


def test_events_up_to_an_older_token_keep_its_version():
    transformer = OplogTransformer(keep_version=(Timestamp(10, 1), 1))
    at, after = transformer.transform(_insert(10, 1)), transformer.transform(_insert(11, 2))
    old, new = decode_token(at[0].token), decode_token(after[0].token)
    # A v1 classic event's eventIdentifier is the documentKey itself.
    assert (old.version, old.event_identifier) == (1, {"_id": 1})
    assert (new.version, new.event_identifier) == (
        2,
        {"operationType": "insert", "documentKey": {"_id": 2}},
    )
    assert transformer.keep_version is None  # past the resume time: the fast path again


def test_a_token_of_the_current_version_changes_nothing():
    assert OplogTransformer(keep_version=(Timestamp(10, 1), 2)).keep_version is None
