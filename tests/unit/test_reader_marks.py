"""A reader's mark: the merge key just above every event at the last timestamp read.

`mark_after` makes it from the two constant ends of a high-water-mark key around the
timestamp's bytes; it must be byte for byte what the token encoder makes of the next tick
(mongoformats/resume_token.py `high_water_mark`), or the merge would order marks and events
wrongly.
"""

from __future__ import annotations

from bson import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from buckets.reader import mark_after
from mongoformats.resume_token import high_water_mark, token_sort_key


def _encoded(ts: Timestamp) -> bytes:
    return token_sort_key(high_water_mark(Timestamp(ts.time, ts.inc + 1)))


@given(st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFE))
def test_a_mark_is_the_encoders_high_water_mark_of_the_next_tick(secs: int, inc: int) -> None:
    ts = Timestamp(secs, inc)
    assert mark_after(ts) == _encoded(ts)


def test_marks_order_as_their_timestamps() -> None:
    stamps = [Timestamp(1, 0), Timestamp(1, 1), Timestamp(1, 0xFFFF), Timestamp(2, 0)]
    marks = [mark_after(ts) for ts in stamps]
    assert marks == sorted(marks) and len(set(marks)) == len(marks)
