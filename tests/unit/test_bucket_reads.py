"""What a getMore's read of a bucket costs: it starts at the cursor's segment.

A live tail deals a run of one or a few events at a time, each a segment of the bucket, and
the bucket retains what was read until its budget needs the room; a read that walked the
segment list from its start would cost each getMore the bucket's whole retention.
"""

from __future__ import annotations

from typing import Any

from bson import Timestamp

from buckets.bucket import Bucket
from buckets.event_run import PlainRun
from mongoformats.resume_token import high_water_mark, token_sort_key
from tests.unit.test_bucket_resume import event


class _NoWalk(list[Any]):
    """A segment list that may be indexed but not walked."""

    def __iter__(self) -> Any:
        raise AssertionError("the bucket's segments were walked from the start")


def _bucket(dealt: int) -> Bucket:
    floor = high_water_mark(Timestamp(1, 0))
    bucket = Bucket(0, 1 << 20, token_sort_key(floor), floor)
    for t in range(1, dealt + 1):
        assert bucket.put_nowait(PlainRun([event(t)]))
    return bucket


def test_reading_from_a_position_indexes_its_segment_and_the_following_ones() -> None:
    bucket = _bucket(50)
    expected = [(s, 0) for s in bucket.segments[40:]]
    bucket.segments = _NoWalk(bucket.segments)
    assert list(bucket.items_from(40)) == expected
    assert bucket.keys_between(48, 50) == [s.first_key for s, _ in expected[-2:]]


def test_reading_past_the_end_yields_nothing() -> None:
    bucket = _bucket(3)
    assert list(bucket.items_from(3)) == []
