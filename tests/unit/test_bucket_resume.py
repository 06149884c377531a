"""A bucket cursor placed after a resume token its bucket has not been dealt up to yet (the stream
was opened for an older token and is catching up): it passes over the events up to the token as they
arrive and returns none of them (tests/integration/test_resume_exactly_once.py has it end to
end)."""

from __future__ import annotations

import uuid
from typing import Any

from bson import Timestamp
from trio.testing import MockClock

from buckets.bucket import Bucket
from buckets.cursor import BucketCursor
from buckets.event_run import PlainRun
from mongoformats.change_events import EV_RAW, EV_SORT_KEY, ChangeEvent
from mongoformats.resume_token import ResumeTokenData, encode_token, high_water_mark, token_sort_key

UUID = uuid.UUID(int=7)


def token(t: int, fragment: int | None = None) -> dict[str, Any]:
    """The token of the insert of _id t at cluster time (t, 1), or of its fragment."""
    return encode_token(
        ResumeTokenData(
            Timestamp(t, 1),
            uuid=UUID,
            fragment_num=fragment,
            event_identifier={"operationType": "insert", "documentKey": {"_id": t}},
        )
    )


def event(t: int) -> tuple[Any, ...]:
    return tuple(
        ChangeEvent.for_token(token(t), "insert", "db", "c", b"\x05\x00\x00\x00\x00", ("db.c",))
    )


def bucket_and_cursor(
    dealt: int, resume: dict[str, Any], limit: int = 1 << 20
) -> tuple[Bucket, BucketCursor]:
    """A bucket opened at time 1, dealt the events 1..dealt; a cursor resumed after `resume`."""
    floor = high_water_mark(Timestamp(1, 0))
    bucket = Bucket(0, limit, token_sort_key(floor), floor)
    for t in range(1, dealt + 1):
        assert bucket.put_nowait(PlainRun([event(t)]))
    cur = BucketCursor(1, None, bucket, bucket.base, owner=b"", ns="admin.x")  # type: ignore[arg-type]
    cur.resume_after(resume)
    return bucket, cur


def keys_from(bucket: Bucket, position: int) -> list[bytes]:
    return bucket.keys_between(position, bucket.end)


async def test_events_up_to_the_token_dealt_after_the_attach_are_passed_over(
    autojump_clock: MockClock,
) -> None:
    bucket, cur = bucket_and_cursor(10, token(20))
    assert cur.position == bucket.end and cur.resume_key is not None
    for t in range(11, 26):
        bucket.put_nowait(PlainRun([event(t)]))
    cur._settle()
    assert cur.resume_key is None
    assert keys_from(bucket, cur.position) == [event(t)[EV_SORT_KEY] for t in range(21, 26)]
    assert cur.last_token == token(20)


async def test_a_token_the_bucket_holds_places_the_cursor_at_once(
    autojump_clock: MockClock,
) -> None:
    bucket, cur = bucket_and_cursor(10, token(4))
    assert cur.resume_key is None
    assert keys_from(bucket, cur.position) == [event(t)[EV_SORT_KEY] for t in range(5, 11)]


async def test_a_frontier_past_the_token_settles_a_bucket_that_got_no_event_up_to_it(
    autojump_clock: MockClock,
) -> None:
    bucket, cur = bucket_and_cursor(3, token(20))
    bucket.advance_frontier(
        token_sort_key(high_water_mark(Timestamp(21, 0))), high_water_mark(Timestamp(21, 0))
    )
    cur._settle()
    assert cur.resume_key is None and cur.position == bucket.end


async def test_a_fragment_token_dealt_later_resumes_inside_its_event(
    autojump_clock: MockClock,
) -> None:
    """Resumed from fragment 1 of event 15: the event is returned again, from fragment 2."""
    bucket, cur = bucket_and_cursor(10, token(15, fragment=1))
    for t in range(11, 18):
        bucket.put_nowait(PlainRun([event(t)]))
    cur._settle()
    assert cur.resume_key is None and cur.fragments_sent == 2
    assert keys_from(bucket, cur.position)[0] == event(15)[EV_SORT_KEY]


async def test_passing_over_events_lets_a_full_bucket_free_them(autojump_clock: MockClock) -> None:
    """The passed-over events are behind the consumer: a full bucket may drop them and take more."""
    bucket, cur = bucket_and_cursor(0, token(100), limit=8 * len(event(1)[EV_RAW]))
    bucket.cursors.add(cur)
    for t in range(1, 103):
        # full: the cursor passes over what it holds
        if not bucket.put_nowait(PlainRun([event(t)])):
            cur._settle()
            assert bucket.put_nowait(PlainRun([event(t)]))
    cur._settle()
    assert cur.resume_key is None
    assert keys_from(bucket, cur.position) == [event(t)[EV_SORT_KEY] for t in (101, 102)]
