"""When a getMore that waits on its bucket returns: at once for events, and for a moved resume
point alone only once it has waited RESUME_POINT_HOLD_S (buckets/cursor.py).

While a stream is written to, the merge's frontier moves at every release; a waiting getMore
that returned for each move would cost its bucket's consumer an empty round trip each. mongos's
merger returns a sorted tailable cursor's batch only once an event may go
(src/mongo/s/query/async_results_merger.cpp, `_readySortedTailable`: an empty merge queue is
never ready), and its empty batch with the new postBatchResumeToken at the await timeout.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
from bson import Timestamp
from trio.testing import MockClock

from buckets.bucket import Bucket
from buckets.cursor import RESUME_POINT_HOLD_S, BucketCursor
from buckets.event_run import PlainRun
from mongoformats.resume_token import high_water_mark, token_sort_key
from tests.unit.test_bucket_resume import event


def _waiting_cursor() -> tuple[Bucket, BucketCursor]:
    floor = high_water_mark(Timestamp(1, 0))
    bucket = Bucket(0, 1 << 20, token_sort_key(floor), floor)
    stream = SimpleNamespace(error=None, ended=False, options=SimpleNamespace(max_await_ms=1000))
    cur = BucketCursor(1, stream, bucket, bucket.base, owner=b"", ns="admin.x")  # type: ignore[arg-type]
    return bucket, cur


def _advance(bucket: Bucket, secs: int) -> None:
    mark = high_water_mark(Timestamp(secs, 0))
    bucket.advance_frontier(token_sort_key(mark), mark)


async def _returned_after(cur: BucketCursor, act: Any) -> float:
    """How long `cur`'s wait (maxTimeMS 1000) lasted, with `act` run once it has begun."""
    began = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cur._wait, 1000)
        await trio.sleep(0.001)
        act()
    return trio.current_time() - began


async def test_a_moved_resume_point_returns_once_the_wait_has_lasted_the_hold(
    autojump_clock: MockClock,
) -> None:
    bucket, cur = _waiting_cursor()
    waited = await _returned_after(cur, lambda: _advance(bucket, 5))
    assert RESUME_POINT_HOLD_S <= waited < 1.0
    assert bucket.frontier > cur.last_key  # (the reply then carries it: _advance)


async def test_events_end_the_wait_at_once_while_a_moved_resume_point_is_held(
    autojump_clock: MockClock,
) -> None:
    bucket, cur = _waiting_cursor()

    def move_then_deal() -> None:
        _advance(bucket, 5)
        bucket.notify()
        assert bucket.put_nowait(PlainRun([event(6)]))
        bucket.notify()

    waited = await _returned_after(cur, move_then_deal)
    assert waited < RESUME_POINT_HOLD_S


async def test_a_resume_point_moved_after_the_hold_returns_at_once(
    autojump_clock: MockClock,
) -> None:
    bucket, cur = _waiting_cursor()
    began = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cur._wait, 1000)
        await trio.sleep(2 * RESUME_POINT_HOLD_S)
        _advance(bucket, 5)
    assert trio.current_time() - began < 3 * RESUME_POINT_HOLD_S


async def test_a_notify_wakes_each_wait_begun_before_it_and_none_after(
    autojump_clock: MockClock,
) -> None:
    """Bucket.changed is made only for a waiter: notifies with nobody waiting make none, and a
    wait begun after a notify waits for the next one."""
    bucket, _ = _waiting_cursor()
    bucket.notify()
    bucket.notify()  # nobody waits: nothing to set
    woken: list[int] = []

    async def wait(k: int) -> None:
        await bucket.changed.wait()
        woken.append(k)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, 1)
        nursery.start_soon(wait, 2)
        await trio.sleep(1)
        assert woken == []
        bucket.notify()
        await trio.sleep(1)
        assert sorted(woken) == [1, 2]
        nursery.start_soon(wait, 3)
        await trio.sleep(1)
        assert len(woken) == 2  # the earlier notify does not wake a later wait
        bucket.notify()
    assert sorted(woken) == [1, 2, 3]


async def _woken(wakes: int, *, then_events: bool) -> float:
    """How long a waiting getMore waits while the merge moves its bucket's resume point `wakes`
    times (a live tail's every release), events put after them if `then_events`."""
    bucket, cur = _waiting_cursor()
    began = trio.current_time()
    ended: list[float] = []

    async def wait() -> None:
        await cur._wait(1000)
        ended.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        for secs in range(5, 5 + wakes):
            await trio.sleep(RESUME_POINT_HOLD_S / 20)
            _advance(bucket, secs)
        if then_events:
            assert bucket.put_nowait(PlainRun([event(20)]))
            bucket.notify()
    return ended[0] - began


async def test_a_wait_woken_many_times_keeps_its_deadlines(autojump_clock: MockClock) -> None:
    """A live tail's merge wakes a waiting getMore at every release: the first move of the
    resume point brings the wait's end to the hold, however many wakes follow, and events
    still end it at once."""
    waited = await _woken(45, then_events=False)
    assert RESUME_POINT_HOLD_S <= waited <= RESUME_POINT_HOLD_S * 1.1
    assert await _woken(10, then_events=True) < RESUME_POINT_HOLD_S
