"""Events larger than a server can return, the parts without a server: the size limit with
mongos's merge metadata, and $changeStreamSplitLargeEvent's fragments with their tokens
(tests/integration/test_large_events.py: natively, through the proxy and from the engine)."""

from __future__ import annotations

import uuid

import bson
import pytest
from bson import Timestamp

from mongoformats.errors import MongoError
from mongoformats.large_events import (
    MAX_EVENT_BYTES,
    SPLIT_ABOVE_BYTES,
    event_too_large,
    split_event,
)
from mongoformats.resume_token import (
    ResumeTokenData,
    decode_token,
    encode_token,
    token_sort_key,
)

TEN_MB = 10 * 1024 * 1024


def _event(**fields):
    token = encode_token(
        ResumeTokenData(
            Timestamp(100, 1),
            uuid=uuid.UUID(int=7),
            event_identifier={"operationType": "update", "documentKey": {"_id": 1}},
        )
    )
    return bson.encode(
        {
            "_id": token,
            "operationType": "update",
            "clusterTime": Timestamp(100, 1),
            "ns": {"db": "d", "coll": "c"},
            "documentKey": {"_id": 1},
            **fields,
        }
    )


def test_the_size_limit_is_the_servers_with_mongos_merge_metadata():
    pad = len(_event(x=""))
    at_limit = _event(x="a" * (MAX_EVENT_BYTES - pad))
    assert len(at_limit) == MAX_EVENT_BYTES and event_too_large(at_limit) is None
    error = event_too_large(_event(x="a" * (MAX_EVENT_BYTES - pad + 1)))
    assert error is not None and error.code == 10334
    assert error.errmsg.startswith(
        f"BSONObj size: {MAX_EVENT_BYTES + 1} (0x{MAX_EVENT_BYTES + 1:X}) is invalid. "
        'Size must be between 0 and 16793600(16MB) First element: _id: { _data: "82'
    )
    # On mongos the shard measures the event with its `$sortKey: [token]`.
    merged = event_too_large(at_limit, merged=True)
    assert merged is not None and merged.code == 10334


def test_split_deals_fields_by_size_into_fragments_with_fragment_tokens():
    raw = _event(
        updateDescription={"updatedFields": {"v": "z" * TEN_MB}},
        fullDocumentBeforeChange={"_id": 1, "v": "q" * TEN_MB},
    )
    assert split_event(_event(small=1)) is None
    split = split_event(raw)
    fragments = [bson.decode(f) for _, f in split]
    assert [token for token, _ in split] == [f["_id"] for f in fragments]
    assert [f["splitEvent"] for f in fragments] == [
        {"fragment": 1, "of": 2},
        {"fragment": 2, "of": 2},
    ]
    # Every field but _id once, smallest first (then by name), each fragment within the limit:
    # the pre-image's element is 4 bytes shorter than the update description's.
    assert list(fragments[0]) == [
        "_id",
        "splitEvent",
        "clusterTime",
        "operationType",
        "documentKey",
        "ns",
        "fullDocumentBeforeChange",
    ]
    assert list(fragments[1]) == ["_id", "splitEvent", "updateDescription"]
    assert all(len(f) <= SPLIT_ABOVE_BYTES for _, f in split)
    whole = bson.decode(raw)
    assert {k: v for f in fragments for k, v in f.items() if k not in ("_id", "splitEvent")} == {
        k: v for k, v in whole.items() if k != "_id"
    }
    # The fragments' tokens: the event's with fragmentNum, sorting after it and in order.
    assert [decode_token(f["_id"]).fragment_num for f in fragments] == [0, 1]
    keys = [token_sort_key(whole["_id"]), *(token_sort_key(f["_id"]) for f in fragments)]
    assert keys == sorted(keys) and len(set(keys)) == 3
    # Resuming past fragment 1 returns fragment 2; past the last, nothing; a split that no longer
    # matches the token fails the stream, as the server's does.
    assert split_event(raw, skip=1) == split[1:] and split_event(raw, skip=2) == []
    for bad_raw, skip in ((raw, 3), (_event(small=1), 1)):
        with pytest.raises(MongoError) as err:
            split_event(bad_raw, skip=skip)
        assert err.value.code == 280
