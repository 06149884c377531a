"""Cutting a getMore reply (buckets/reply.py), without sockets or trio: the count and byte limits,
and what a too-large event does to the reply that reaches it, as a server's getMore does
(BSONObjectTooLarge, or with $changeStreamSplitLargeEvent the event alone, to be split)."""

from __future__ import annotations

import uuid
from typing import Any

import bson
import pytest
from bson import Timestamp

from buckets.event_run import PlainRun, fields_of
from buckets.reply import EventSizer, Size, cut_reply, fit_shaped, splits
from mongoformats.change_events import EV_RAW, ChangeEvent
from mongoformats.errors import MongoError
from mongoformats.large_events import MAX_EVENT_BYTES, SPLIT_ABOVE_BYTES
from mongoformats.resume_token import ResumeTokenData, encode_token
from mongoformats.wire import BATCH_BYTES_LIMIT

MB = 1 << 20


def event(t: int, nbytes: int = 0) -> tuple[Any, ...]:
    """The insert of _id t at cluster time (t, 1); its BSON `nbytes` long when given."""
    token = encode_token(
        ResumeTokenData(
            Timestamp(t, 1),
            uuid=uuid.UUID(int=7),
            event_identifier={"operationType": "insert", "documentKey": {"_id": t}},
        )
    )

    def raw(pad: str) -> bytes:
        return bson.encode(
            {
                "_id": token,
                "operationType": "insert",
                "clusterTime": Timestamp(t, 1),
                "ns": {"db": "d", "coll": "c"},
                "documentKey": {"_id": t},
                "x": pad,
            }
        )

    if nbytes:
        raw_bytes = raw("a" * (nbytes - len(raw(""))))
        assert len(raw_bytes) == nbytes
    else:
        raw_bytes = raw("")
    return tuple(ChangeEvent.for_token(token, "insert", "d", "c", raw_bytes, ("d.c",)))


def items(events: list[tuple[Any, ...]]) -> list[tuple[Any, int]]:
    """As Bucket.items_from gives events held one by one."""
    return [(PlainRun([ev]), 0) for ev in events]


def cut(*args: Any) -> list[tuple[Any, ...]]:
    """The events of the reply cut_reply cuts."""
    return fields_of(cut_reply(*args))


def test_a_reply_holds_at_most_the_batch_size():
    events = [event(t) for t in range(1, 6)]
    assert cut(items(events), 3, EventSizer()) == events[:3]
    assert cut(items(events), 10, EventSizer()) == events


def test_a_reply_holds_at_most_the_batch_bytes_and_at_least_one_event():
    events = [event(t, 6 * MB) for t in range(1, 5)]
    reply = cut(items(events), 100, EventSizer())
    assert reply == events[:2] and sum(len(ev[EV_RAW]) for ev in events[:3]) > BATCH_BYTES_LIMIT


def test_a_too_large_event_fails_the_reply_that_starts_with_it():
    big = event(2, MAX_EVENT_BYTES + 1)
    with pytest.raises(MongoError) as info:
        cut(items([big, event(3)]), 10, EventSizer())
    assert info.value.code == 10334 and info.value.errmsg.startswith(
        f"BSONObj size: {MAX_EVENT_BYTES + 1} (0x{MAX_EVENT_BYTES + 1:X}) is invalid."
    )
    # The events before it are returned first; the next getMore fails.
    small = event(1)
    assert cut(items([small, big]), 10, EventSizer()) == [small]


def test_with_the_split_stage_a_large_event_is_returned_alone():
    sizer = EventSizer(split=True)
    big, small = event(2, SPLIT_ABOVE_BYTES + 1), event(3)
    assert cut(items([big, small]), 10, sizer) == [big] and splits(big, sizer)
    assert cut(items([event(1), big]), 10, sizer) == [event(1)]


def test_events_to_be_shaped_are_not_measured_when_cut():
    big = event(2, MAX_EVENT_BYTES + 1)
    assert cut(items([big]), 10, None) == [big]


def test_the_sizer_draws_the_servers_lines():
    at_limit = event(1, MAX_EVENT_BYTES)[EV_RAW]
    over = event(1, MAX_EVENT_BYTES + 1)[EV_RAW]
    assert EventSizer().size(at_limit) is Size.FITS
    assert EventSizer().size(over) is Size.TOO_LARGE
    assert EventSizer(merged=True).size(at_limit) is Size.TOO_LARGE  # mongos adds the $sortKey
    assert EventSizer(split=True).size(event(1, SPLIT_ABOVE_BYTES)[EV_RAW]) is Size.FITS
    assert EventSizer(split=True).size(over) is Size.SPLIT
    assert EventSizer().error(over).code == 10334


def test_shaped_events_are_cut_again_as_they_grew():
    shaped = [(i, ChangeEvent._make(event(i + 1, 6 * MB))) for i in range(4)]
    head, consumed = fit_shaped(shaped, EventSizer())
    assert [ev.raw for ev in head] == [ev.raw for _, ev in shaped[:2]] and consumed == 2
    small = [(i, ChangeEvent._make(event(i + 1))) for i in range(3)]
    assert fit_shaped(small, EventSizer()) == ([ev for _, ev in small], None)
    with pytest.raises(MongoError):
        fit_shaped([(0, ChangeEvent._make(event(1, MAX_EVENT_BYTES + 1)))], EventSizer())
