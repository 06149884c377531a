"""The live / behind / catching-up state of a bucket (buckets/catch_up.py), without sockets: a full
bucket of a named stream waits for its consumer only while no other bucket's consumer waits, then
falls behind, holding what it has and dropping what follows; it rejoins the merge after the gap once
a consumer waits on a replay to come back (tests/integration/test_fall_behind.py has it end to
end)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio
from bson import Timestamp

from buckets.bucket import Bucket
from buckets.catch_up import (
    BEHIND,
    CATCHING_UP,
    FALL_BEHIND_AFTER_S,
    FIRST_READ_GRACE_S,
    LIVE,
    MIN_WAIT_S,
    Lag,
)
from buckets.cursor import BucketCursor
from buckets.event_run import PlainRun, fields_of
from buckets.reply import EventSizer
from buckets.stream import StreamOptions
from mongoformats.change_events import EV_RAW, EV_SORT_KEY
from mongoformats.resume_token import high_water_mark, token_sort_key
from tests.unit.test_bucket_resume import event, token

K = [b"", *(bytes([0x10, k]) for k in range(1, 10))]  # K[1] < K[2] < ... (keys for the pure state)


def test_lag_falls_behind_drops_and_rejoins_after_everything_it_dropped() -> None:
    lag = Lag()
    assert not lag.behind and lag.state(awaiting=False) == LIVE and lag.holds_after(K[9])
    lag.fall(K[3])
    assert lag.behind and lag.state(awaiting=False) == BEHIND
    assert lag.holds_after(K[2]) and lag.holds_after(K[3]) and not lag.holds_after(K[4])
    lag.drop(2, 100, K[5])
    lag.drop(1, 50, K[6])
    assert (lag.dropped_events, lag.dropped_bytes, lag.dropped_total) == (3, 150, 3)
    assert lag.rejoin_point(frontier=K[4], floor=K[1]) == K[6], "after the last dropped event"
    assert lag.rejoin_point(frontier=K[8], floor=K[1]) == K[8], "after everything dealt"
    lag.settle()
    assert lag.dropped_events == 3, "still behind: what it dropped is pending"
    lag.rejoin()
    assert lag.state(awaiting=True) == CATCHING_UP and lag.holds_after(K[9])
    lag.settle()
    assert (lag.dropped_events, lag.dropped_bytes, lag.dropped_total, lag.fell_behind) == (
        0,
        0,
        3,
        1,
    )
    with pytest.raises(AssertionError):
        lag.drop(1, 1, K[7])  # a live bucket holds what it is dealt


def _bucket(limit_events: int, *, isolated: bool = True, others_wait: bool = True) -> Bucket:
    floor = high_water_mark(Timestamp(1, 0))
    size = len(event(1)[EV_RAW])
    bucket = Bucket(1, limit_events * size, token_sort_key(floor), floor)
    bucket.isolated = isolated
    bucket.holds_back = lambda: others_wait
    return bucket


def _cursor(bucket: Bucket) -> BucketCursor:
    stream: Any = None  # a bucket's own state: no stream behind it
    cur = BucketCursor(1, stream, bucket, bucket.base, owner=b"", ns="admin.x")
    cur.read = True
    bucket.cursors.add(cur)
    return cur


async def _put_all(bucket: Bucket, times: range) -> None:
    for t in times:
        await bucket.put(PlainRun([event(t)]))


async def test_a_full_bucket_falls_behind_once_another_consumer_waits(autojump_clock: Any) -> None:
    """10 events fit; 30 are dealt while the bucket's one consumer reads nothing and another
    bucket's waits: the first 10 are held, the 20 after them dropped and counted, the merge
    never waits for good, and the bucket's resume point stays at its 10th event."""
    bucket = _bucket(10)
    stalled = _cursor(bucket)
    with trio.fail_after(10 * FALL_BEHIND_AFTER_S):
        await _put_all(bucket, range(2, 32))
    assert bucket.end == 10 and bucket.budget.used <= bucket.budget.limit
    assert bucket.lag.behind and bucket.lag.dropped_events == 20
    tenth = event(11)[EV_SORT_KEY]
    assert bucket.lag.complete_to == tenth == bucket.frontier
    assert bucket.position_after(event(5)[EV_SORT_KEY]) is not None, "what it holds is served"
    assert bucket.position_after(event(12)[EV_SORT_KEY]) is None, "the gap is not"
    bucket.advance_frontier(
        token_sort_key(high_water_mark(Timestamp(40, 0))), high_water_mark(Timestamp(40, 0))
    )
    assert bucket.frontier == tenth, "behind, the resume point stays where it is complete"
    assert not stalled.stale(), "it still has 10 events to read"
    stalled.position = bucket.end
    assert stalled.stale(), "read to the gap: a replay serves what follows"


@pytest.mark.parametrize(("isolated", "others_wait"), [(False, True), (True, False)])
async def test_a_full_bucket_waits_when_it_holds_nobody_back(
    autojump_clock: Any, isolated: bool, others_wait: bool
) -> None:
    """A private stream's bucket (not isolated), or one beside no waiting consumer, applies
    backpressure: the merge waits for the consumer."""
    bucket = _bucket(10, isolated=isolated, others_wait=others_wait)
    _cursor(bucket)
    with trio.move_on_after(100 * FALL_BEHIND_AFTER_S) as waited:
        await _put_all(bucket, range(2, 32))
    assert waited.cancelled_caught and not bucket.lag.behind and bucket.end == 10


async def test_a_bucket_rejoins_after_its_gap_once_a_consumer_waits_to_come_back(
    autojump_clock: Any,
) -> None:
    """Behind, with a consumer on a replay waiting to come back and none reading what the bucket
    holds: the next event dealt makes it live again after the gap, its cache is dropped, a cursor
    left before the gap is `lost` (moved to a replay by the engine), and what follows is held."""
    bucket = _bucket(10)
    stalled = _cursor(bucket)
    await _put_all(bucket, range(2, 32))
    assert bucket.lag.behind
    reading = _cursor(bucket)  # a consumer still reading what the bucket holds keeps it behind
    waiting = BucketCursor(2, None, bucket, 0, owner=b"", ns="admin.x")  # type: ignore[arg-type]
    bucket.awaiting.add(waiting)
    await bucket.put(PlainRun([event(32)]))
    assert bucket.lag.behind and bucket.lag.dropped_events == 21
    bucket.cursors.discard(reading)
    stalled.position = bucket.end
    await bucket.put(PlainRun([event(33)]))
    assert not bucket.lag.behind and stalled.lost and stalled.stale()
    assert bucket.keys_between(bucket.base, bucket.end) == [event(33)[EV_SORT_KEY]]
    assert bucket.floor >= event(32)[EV_SORT_KEY], "everything up to the rejoin point was dealt"
    assert bucket.position_after(event(32)[EV_SORT_KEY]) == bucket.base, "a replay joins after it"
    assert bucket.position_after(event(20)[EV_SORT_KEY]) is None, "but not inside the gap"
    assert bucket.lag.state(awaiting=bool(bucket.awaiting)) == CATCHING_UP


@pytest.mark.parametrize("last_read", ["never", "long ago", "just now"])
async def test_a_stalled_consumer_falls_behind_at_once_a_slow_or_late_one_after_a_while(
    autojump_clock: Any, last_read: str
) -> None:
    """With another consumer waiting (on the test's virtual clock): a bucket whose consumer read
    it, but not for FALL_BEHIND_AFTER_S, falls behind as soon as it is full (stalled or gone); one
    whose consumer has just read (slow) holds the merge back for FALL_BEHIND_AFTER_S first; one
    no consumer has read yet (its consumer is yet to come) for FIRST_READ_GRACE_S."""
    bucket = _bucket(10)
    _cursor(bucket)
    await _put_all(bucket, range(2, 12))  # full
    if last_read == "never":
        bucket.last_read = trio.current_time()  # its cursor was made (ParallelStream.isolate)
    else:
        bucket.read_once = True
        bucket.last_read = trio.current_time() - (0 if last_read == "just now" else 10)
    began = trio.current_time()
    await bucket.put(PlainRun([event(12)]))
    assert bucket.lag.behind
    waited = trio.current_time() - began
    if last_read == "long ago":
        assert waited < FALL_BEHIND_AFTER_S
    else:
        patience = FALL_BEHIND_AFTER_S if last_read == "just now" else FIRST_READ_GRACE_S
        assert patience <= waited < patience + FALL_BEHIND_AFTER_S


async def test_a_consumer_parked_on_a_full_bucket_is_present_however_long_it_waited(
    autojump_clock: Any,
) -> None:
    """A getMore that has waited on the bucket for events since long before the merge filled it
    is a consumer present, not a stalled one: the full bucket wakes it and waits for it to read
    (while another consumer waits too) rather than falling behind and costing it a replay."""
    bucket = _bucket(10)
    cur = _cursor(bucket)
    bucket.read_once = True
    bucket.last_read = trio.current_time() - 10 * FALL_BEHIND_AFTER_S  # when its getMore came
    bucket.waiting = 1
    await _put_all(bucket, range(2, 12))  # full, without a checkpoint the getMore could run in

    async def parked_get_more() -> None:
        await bucket.changed.wait()  # woken by the full bucket's notify
        await trio.sleep(FALL_BEHIND_AFTER_S)  # and, on a busy machine, late to run
        bucket.waiting -= 1
        cur.position = cur.acked = bucket.end  # it read all ten
        bucket.last_read = trio.current_time()
        bucket.notify()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(parked_get_more)
        await trio.sleep(0)
        await bucket.put(PlainRun([event(12)]))
    assert not bucket.lag.behind and bucket.lag.fell_behind == 0
    assert bucket.key_at(bucket.end - 1) == event(12)[EV_SORT_KEY]


async def test_a_pause_of_the_whole_proxy_does_not_count_against_a_consumer(
    autojump_clock: Any,
) -> None:
    """The event loop stood still for several patiences (a compile, a collection) just after the
    consumer's last getMore left: its next getMore, sent meanwhile, is served within the bucket's
    first MIN_WAIT_S of waiting, and the bucket does not fall behind for it."""
    bucket = _bucket(10)
    cur = _cursor(bucket)
    bucket.read_once = True
    await _put_all(bucket, range(2, 12))  # full
    bucket.last_read = trio.current_time()
    autojump_clock.jump(5 * FALL_BEHIND_AFTER_S)  # the pause

    async def get_more_sent_during_the_pause() -> None:
        await trio.sleep(MIN_WAIT_S / 2)  # read off its socket once the loop runs again
        cur.position = cur.acked = bucket.end
        bucket.last_read = trio.current_time()
        bucket.notify()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(get_more_sent_during_the_pause)
        await bucket.put(PlainRun([event(12)]))
    assert not bucket.lag.behind and bucket.key_at(bucket.end - 1) == event(12)[EV_SORT_KEY]


def _stream(bucket: Bucket) -> Any:
    """What a cursor reads of its stream, for a stream holding `bucket` alone (no lookups, no
    stages, never ended)."""
    return SimpleNamespace(
        buckets={bucket.index: bucket},
        options=StreamOptions(n_buckets=2),
        error=None,
        ended=False,
        closed=False,
        lookup=None,
        end_token=None,
        sizer=EventSizer(),
    )


async def test_an_idle_bucket_rejoins_for_a_replay_that_has_caught_up(autojump_clock: Any) -> None:
    """The bucket fell behind and was dealt its last events while its consumer still read what it
    holds; the consumer then reads to the gap and moves to a replay. Nothing more is dealt (the
    writes stopped, nobody waits on the stream: its merge frontier stays put). The replay, read
    past the stream's merge frontier, hands the consumer back: the bucket rejoins for it, the
    consumer is on it again, live, and reads what follows, with nothing lost or twice."""
    named = _bucket(10)
    stalled = _cursor(named)
    await _put_all(named, range(2, 32))  # events 2..11 held, 12..31 dropped
    named.advance_frontier(_mark(35), high_water_mark(Timestamp(35, 0)))
    assert named.lag.behind and not stalled.stale(), "it still reads what the bucket holds"
    stalled.position, stalled.last_token = named.end, token(11)  # read up to the gap
    assert stalled.stale()
    # The engine's move to a replay (StreamCommands.replay_dropped), a replay dealt up to time 40.
    floor = high_water_mark(Timestamp(1, 0))
    replay = Bucket(1, 1 << 20, token_sort_key(floor), floor)
    for t in range(2, 32):
        assert replay.put_nowait(PlainRun([event(t)]))
    replay.advance_frontier(_mark(40), high_water_mark(Timestamp(40, 0)))
    named.detach(stalled)
    stalled.stream, stalled.bucket, stalled.position = _stream(replay), replay, replay.base
    replay.cursors.add(stalled)
    stalled.resume_after(token(11))
    joined: list[bool] = []
    stalled.follow(_stream(named), lambda: joined.append(True))
    assert named.lag.state(awaiting=bool(named.awaiting)) == CATCHING_UP
    got, _ = await stalled.next_batch(100, 0)
    assert [ev[EV_SORT_KEY] for ev in fields_of(got)] == [
        event(t)[EV_SORT_KEY] for t in range(12, 32)
    ]
    assert stalled.bucket is named and joined == [True], "back on its bucket"
    assert not named.lag.behind and named.lag.state(awaiting=bool(named.awaiting)) == LIVE
    await named.put(PlainRun([event(41)]))
    got, _ = await stalled.next_batch(100, 0)
    assert [ev[EV_SORT_KEY] for ev in fields_of(got)] == [event(41)[EV_SORT_KEY]], (
        "what follows, once"
    )


def _mark(t: int) -> bytes:
    """The key of the high-water mark at cluster time (t, 0): above every event before t."""
    return token_sort_key(high_water_mark(Timestamp(t, 0)))
