"""A bucket: the events dealt to one of a stream's N buckets, retained and pending, with their
positions and byte budget (buckets/stream.py deals them in; buckets/cursor.py reads them out)."""

from __future__ import annotations

import bisect
import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import trio
from bson import Timestamp

from buckets.budget import ByteBudget
from buckets.catch_up import FALL_BEHIND_AFTER_S, FIRST_READ_GRACE_S, MIN_WAIT_S, WAIT_SLICE_S, Lag
from buckets.event_run import EventRun, runs_bytes
from buckets.memory_limit import PoolAccount
from mongoformats.change_events import EventFields
from mongoformats.errors import MongoError
from mongoformats.resume_token import decode_token, token_from_key


class Reader(Protocol):
    """What a bucket sees of a cursor that reads it (buckets/cursor.py's BucketCursor): its
    positions decide what retention may free, and a replay's cursor waits in `awaiting`."""

    cursor_id: int
    position: int
    acked: int
    read: bool
    lost: bool
    busy: bool
    last_used: float
    last_key: bytes
    last_token: dict[str, Any]

    @property
    def join(self) -> Joinable | None: ...


class Joinable(Protocol):
    """The named stream a replay's cursor moves to (buckets/stream.py's ParallelStream)."""

    @property
    def buckets(self) -> dict[int, Bucket]: ...


class Bucket:
    """Events of one bucket in token order: [retained (delivered) ... pending].

    Held as segments, each a run of events (buckets/event_run.py; a backlog's events stay
    columns from the splice to the reply). `starts[i]` is the absolute index of segment i's
    first event and `firsts[i]` its sort key, for finding a position or a key.
    """

    def __init__(
        self,
        index: int,
        limit_bytes: int,
        floor: bytes,
        floor_token: dict[str, Any],
        account: PoolAccount | None = None,
    ) -> None:
        self.index = index
        self.segments: list[EventRun] = []
        self.starts: list[int] = []
        self.firsts: list[bytes] = []
        self.base = 0  # absolute index of the first retained event
        self._end = 0  # absolute index after the last
        self.floor = floor  # every event above this key is (or will be) held here
        # The stream's start point for this bucket: an attach without a token reads from here.
        self.start_floor = floor
        self.frontier_token = floor_token
        self.frontier = floor
        # `account`: its share of the proxy's memory limit (buckets/memory_limit.py).
        self.budget = ByteBudget(limit_bytes, account)
        if account is not None:
            account.shed = self._shed
        # Made when a waiter asks for it (`changed`): most notifies (a round's frontier, each put)
        # find nobody waiting, and an Event per notify per bucket is most of a live round's cost.
        self._changed: trio.Event | None = None
        self.cursors: set[Reader] = set()
        self.delivered_total = 0
        self.dealt_total = 0  # events the merge dealt in (delivered_total counts them out)
        self.waiting = 0  # getMores parked on this bucket right now
        # How far consumers that have since left had read (absolute index). With no cursor open
        # (a Spark micro-batch ended; the next attaches after where it stopped), only events up
        # to here may be freed: the rest is what the next consumer will ask for.
        self.read_mark = 0
        # The error of an event this bucket could not take (its $match failed on it), met by a
        # cursor once it has read every event before it; the bucket takes nothing after it.
        self.error: MongoError | None = None
        # A bucket of a named stream falls behind when full instead of holding the merge back
        # (buckets/catch_up.py); a private stream's one consumer is its only reader, so there
        # a full bucket waits (backpressure).
        self.isolated = False
        # Whether a getMore of another bucket of the stream waits for events (set with isolated).
        self.holds_back: Callable[[], bool] = lambda: False
        self.lag = Lag()
        self.last_read = -math.inf  # trio time a getMore last came or left (none yet: never)
        self.read_once = False  # a getMore has read this bucket (Bucket.put's patience)
        self.merge_frontier = floor  # the merge's frontier, also while behind
        # Cursors reading a replay that move to this bucket once it holds their next event.
        self.awaiting: set[Reader] = set()

    @property
    def end(self) -> int:
        return self._end

    @property
    def retained(self) -> int:
        return self._end - self.base

    def depth(self) -> int:
        """Events no live cursor has read yet."""
        low = min((c.position for c in self.cursors), default=self.end)
        return self.end - low

    def notify(self) -> None:
        """Wake every getMore (and a full-bucket put) waiting on this bucket. While some budget
        waits for the proxy's memory pool, what consumers have read goes first (`_shed`)."""
        if self.budget.account is not None and self.budget.account.pool.waiting:
            self._shed()
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    @property
    def changed(self) -> trio.Event:
        """Set at the next `notify`: what getMores and full-bucket puts wait on."""
        changed = self._changed
        if changed is None:
            changed = self._changed = trio.Event()
        return changed

    # -- positions --------------------------------------------------------------------------------

    def _segment_at(self, position: int) -> int:
        """The index of the segment holding the event at absolute `position` (base <= it < end)."""
        return bisect.bisect_right(self.starts, position) - 1

    def key_at(self, position: int) -> bytes:
        s = self._segment_at(position)
        return self.segments[s].key(position - self.starts[s])

    def event_at(self, position: int) -> EventFields:
        s = self._segment_at(position)
        at = position - self.starts[s]
        return self.segments[s].sliced(at, at + 1).fields()[0]

    def items_from(self, position: int) -> Iterator[tuple[EventRun, int]]:
        """(segment, offset of `position`'s event in it) from `position` to the end."""
        if position >= self._end:
            return
        s = self._segment_at(position)
        offset = position - self.starts[s]
        # By index from segment s: a live tail's bucket retains a segment per dealt run, so a
        # walk from the list's start would cost each getMore the bucket's whole retention.
        segments = self.segments
        while s < len(segments):
            yield segments[s], offset
            s, offset = s + 1, 0

    def keys_between(self, start: int, stop: int) -> list[bytes]:
        """The sort keys of the events at [start, stop)."""
        out: list[bytes] = []
        for segment, offset in self.items_from(start):
            if len(out) >= stop - start:
                break
            out += segment.sliced(offset, offset + stop - start - len(out)).keys()
        return out

    def position_after(self, key: bytes) -> int | None:
        """Absolute index of the first event above `key`, or None if that history was dropped
        (or, fallen behind, not held)."""
        if key < self.floor or not self.lag.holds_after(key):
            return None
        s = bisect.bisect_right(self.firsts, key)
        if s == 0:
            return self.base
        return self.starts[s - 1] + self.segments[s - 1].bisect_right(key)

    # -- retention --------------------------------------------------------------------------------

    def _drop_delivered(self, need: int, *, hard: bool = False) -> None:
        """Free retained events that every live cursor (or, with none, the last to leave) has
        passed, oldest first (`hard`: also those only acked, the cache of re-attaches, see
        `_safe`).

        Frees down to 7/8 of the budget in one step, so the segment list shift is paid once per
        eighth of the budget rather than once per event (which would make a full bucket quadratic).
        """
        if self.budget.used + need <= self.budget.limit:
            return
        safe = self._safe(hard=hard)
        target = self.budget.limit * 7 // 8 - need
        freed = 0
        position = self.base
        for segment, offset in self.items_from(self.base):
            if position >= safe or self.budget.used - freed <= target:
                break
            part = segment.sliced(offset, offset + safe - position)
            k, nbytes = part.count_reaching(self.budget.used - freed - target)
            freed += nbytes
            position += k
        if position > self.base:
            self._forget(position, freed)

    def _shed(self) -> None:
        """Drop the delivered events every consumer has passed: retention serves re-attaches from
        memory, a cache that never holds a stream, this one or another, waiting for memory."""
        if self.base < self._safe():
            self._drop_delivered(self.budget.limit)

    def _safe(self, *, hard: bool = False) -> int:
        """Where retention may be freed up to: what every cursor that has been read has passed;
        with none read yet, every cursor; with none, the last consumer to leave. Beside a cursor
        that is read, one no getMore has read yet (the N cursors of an open whose buckets workers
        attach to on their own) pins nothing: what it would find dropped is re-read from the
        oplogs (the engine's getMore moves it to a replay). A cursor left before a fallen-behind
        bucket's gap (`lost`) pins nothing either: it is served by a replay. `hard`: up to each
        cursor's position instead of the start of its last batch (retention is a cache that
        never makes a bucket fall behind)."""
        cursors = [c for c in self.cursors if not c.lost]
        pinned = [c.position if hard else c.acked for c in cursors if c.read] or [
            c.position if hard else c.acked for c in cursors
        ]
        return min(min(pinned, default=self.read_mark), self._end)

    def unpin(self) -> None:
        """Let go of the shard blocks this bucket's events point into (a shard's budget is full,
        and only their release gives it bytes back): retained events no cursor needs are
        dropped, and the rest copied into memory of their own."""
        self._drop_delivered(self.budget.limit)
        for i, segment in enumerate(self.segments):
            if segment.pins:
                self.segments[i] = segment.own()

    def _forget(self, position: int, nbytes: int) -> None:
        """Drop the retained events before absolute `position`, which hold `nbytes` of the
        budget."""
        self.floor = self.key_at(position - 1)
        if position >= self._end:
            self.segments, self.starts, self.firsts = [], [], []
        else:
            s = self._segment_at(position)
            segment = self.segments[s]
            if position > self.starts[s]:  # a block cut: its tail stays
                rest = segment.sliced(position - self.starts[s])
                self.segments[s], self.starts[s], self.firsts[s] = rest, position, rest.first_key
            del self.segments[:s], self.starts[:s], self.firsts[:s]
        self.base = position
        self.budget.release(nbytes)

    def clear(self) -> None:
        """Drop every retained event (the stream is closing): its memory returns at once."""
        if self._end > self.base:
            self._forget(self._end, self.budget.used)
        self.notify()

    def detach(self, cursor: Reader) -> None:
        self.cursors.discard(cursor)
        if cursor.join is not None:  # a replay's cursor leaves: nobody waits to come back
            cursor.join.buckets[self.index].awaiting.discard(cursor)
        self.read_mark = max(self.read_mark, cursor.acked)
        self.notify()

    def fail(self, error: MongoError) -> None:
        """End this bucket at its current end with `error`: its cursors return the events before
        it, then fail, as a server's stream fails on the event its pipeline cannot evaluate. The
        other buckets go on: their namespaces never met the event."""
        if self.error is None:
            self.error = error.copied()  # (raised at each read: see MongoError.copied)
            self.notify()

    # -- taking events ----------------------------------------------------------------------------

    def _append(self, run: EventRun) -> None:
        n = len(run)
        self.segments.append(run)
        self.starts.append(self._end)
        self.firsts.append(run.first_key)
        self._end += n
        self.dealt_total += n

    def put_nowait(self, event: EventRun) -> bool:
        """Append the run `event` whole if it fits now (the pump's fast path); False if the
        caller must `put`.

        Does not wake readers: the pump calls `notify()` once per merged batch, not per event.
        """
        if event.last_key <= self.floor or self.error is not None:
            return True  # a resumed stream: this bucket already had it; or a failed bucket
        n = event.nbytes
        lag = self.lag
        if lag.behind and not self._rejoin(lag.rejoin_point(self.merge_frontier, self.floor)):
            lag.drop(len(event), n, event.last_key)
            return True
        self._drop_delivered(n)  # returns at once while the budget has room
        if not self.budget.try_acquire(n):
            return False
        self._append(event)
        return True

    # -- falling behind (buckets/catch_up.py) ---------------------------------------------------

    def _fall_behind(self) -> None:
        """Full: hold every event up to here and drop what follows, rather than stop the merge.
        The frontier stays at that point: a cursor that reads to the end resumes from it."""
        held = self.key_at(self._end - 1) if self._end > self.base else b""
        complete = max(self.frontier, self.floor, held)
        self.lag.fall(complete)
        if complete > self.frontier:
            self.frontier, self.frontier_token = complete, token_from_key(complete)
        self.notify()

    def _may_rejoin(self) -> bool:
        """A consumer waits on a replay to come back, and none still reads what the bucket holds
        before its gap (holding events after the gap beside them would hide it). With nobody
        waiting, a bucket whose consumer is gone stays behind and holds nothing new."""
        return bool(self.awaiting) and not any(
            c.read and not c.lost and c.position < self._end for c in self.cursors
        )

    def _rejoin(self, point: bytes) -> bool:
        """Live again from `point` (every event up to it was dealt), if it may: what it retains
        goes (a cache; every cursor left on this side of the gap is `lost` and moves to a
        replay), and every event after `point` is held."""
        if not self._may_rejoin():
            return False
        for cursor in self.cursors:
            cursor.lost = True
        if self._end > self.base:
            self._forget(self._end, self.budget.used)
        self.floor = max(self.floor, point)
        self.lag.rejoin()
        if point > self.frontier:
            self.frontier, self.frontier_token = point, token_from_key(point)
        self.notify()
        return True

    def rejoin_if_awaited(self) -> None:
        """Behind, rejoin now after everything dealt so far, if it may (`_may_rejoin`). The merge
        checks when it deals this bucket an event or moves its frontier; a stream that deals
        nothing more (its writes stopped, nobody waits on it) does neither, so a consumer on a
        replay that has caught up checks too, or it would wait to come back for good."""
        if self.lag.behind:
            self._rejoin(self.lag.rejoin_point(self.merge_frontier, self.floor))

    async def put_many(self, events: list[EventRun]) -> None:
        """Append the runs `events` (token order) and wake consumers; one budget
        charge when they all fit, else a part at a time, waiting for consumers as `put` does."""
        if self.error is not None:
            return  # failed: nothing after its error is read
        if events[0].first_key <= self.floor:  # a resumed stream: this bucket already had some
            events = _above(events, self.floor)
            if not events:
                return
        n = runs_bytes(events)
        self._drop_delivered(n)
        # (try_acquire lets one oversized item into an empty budget; a whole share must fit.)
        fits = self.budget.used + n <= self.budget.limit
        if not self.lag.behind and fits and self.budget.try_acquire(n):
            for item in events:
                self._append(item)
        else:
            for item in events:
                for piece in item.pieces():
                    await self._put_run(piece)
        self.notify()

    async def _put_run(self, block: EventRun) -> None:
        """A run that does not fit at once goes in as parts that do, as consumers make room."""
        while len(block):
            if self.lag.behind and self.put_nowait(block):
                return  # dropped whole (or it rejoined and took it)
            self._drop_delivered(block.nbytes)
            room = self.budget.room()  # in the budget and in the proxy's memory pool
            k = block.count_within(room)
            if k == 0:
                await self.put(block.sliced(0, 1))  # waits (or takes one oversized event alone)
                k = 1
            elif not self.put_nowait(block.sliced(0, k)):  # fits: the room was just measured
                await self.put(block.sliced(0, k))
            block = block.sliced(k)

    async def put(self, event: EventRun) -> None:
        """Append `event`, waiting while the bucket is full (a consumer must read first:
        backpressure), or while the proxy's memory pool is (a consumer of this stream or another
        must read). An isolated bucket waits so only while no other bucket's consumer waits for
        events, or briefly: once its consumer is slow or gone (`_slow_or_gone`), it falls behind
        (buckets/catch_up.py)."""
        waited = 0.0  # with the event loop running: see WAIT_SLICE_S
        while not self.put_nowait(event):
            self.notify()
            n = event.nbytes
            if self.isolated and self._slow_or_gone(waited) and self.holds_back():
                self._drop_delivered(n, hard=True)  # retention is a cache: it goes first
                if not self.budget.try_acquire(n):
                    self._fall_behind()
                    self.lag.drop(len(event), n, event.last_key)
                    break
                self._append(event)
                break
            if self.budget.blocked_by_pool(n):
                self.budget.wake_when_pool_frees(self.notify)
            if self.isolated:  # woken by its consumers, and to look at the others now and then
                began = trio.current_time()
                with trio.move_on_after(WAIT_SLICE_S):
                    await self.changed.wait()
                waited += min(trio.current_time() - began, WAIT_SLICE_S)
            else:
                await self.changed.wait()
        self.notify()

    def _slow_or_gone(self, waited: float) -> bool:
        """Whether this bucket's consumer is slow or gone, for a put that has `waited` so far:
        the put has waited the patience, or, once it has waited MIN_WAIT_S, no getMore has come
        for the patience (a consumer long away is gone). No consumer reads the bucket while its
        consumers are on replays: gone at once. A getMore parked on the bucket is a consumer
        present, however long it waited for events before: woken by `notify`, it reads what was
        just dealt once the merge yields."""
        if self.awaiting and all(c.lost for c in self.cursors):
            return True
        if self.waiting or waited < MIN_WAIT_S:
            return False
        patience = FALL_BEHIND_AFTER_S if self.read_once else FIRST_READ_GRACE_S
        return waited >= patience or trio.current_time() - self.last_read >= patience

    def advance_frontier(self, key: bytes, token: dict[str, Any]) -> None:
        self.merge_frontier = max(self.merge_frontier, key)
        # Fallen behind, the resume point stays where the bucket is complete, until it rejoins:
        # an idle one (dealt nothing since) rejoins here.
        if self.lag.behind and not self._rejoin(self.lag.rejoin_point(key, self.floor)):
            return
        # A failed bucket's resume point stays before its failing event.
        if key > self.frontier and self.error is None:
            self.frontier, self.frontier_token = key, token
            self.notify()


def _above(items: list[EventRun], key: bytes) -> list[EventRun]:
    """The events of `items` (in token order) above `key`."""
    out = []
    for item in items:
        if item.last_key <= key:
            continue
        if item.first_key <= key:
            item = item.sliced(item.bisect_right(key))
        out.append(item)
    return out


def lag_status(bucket: Bucket) -> dict[str, Any]:
    """How far a bucket's consumers are behind the merge (docs/commands.md): `clusterTime` is
    where the slowest consumer's events are complete up to (its replay's position while it
    catches up, the bucket's complete point while it is behind), beside the merge's."""
    lag = bucket.lag
    behind = [c.last_key for c in bucket.awaiting if c.last_key]
    if lag.complete_to is not None:
        behind.append(lag.complete_to)
    at = min(behind, default=bucket.frontier)
    merge = max(bucket.merge_frontier, bucket.frontier)
    at_ts, merge_ts = _key_time(at), _key_time(merge)
    return {
        "state": lag.state(bool(bucket.awaiting)),
        "clusterTime": at_ts,
        "mergeClusterTime": merge_ts,
        "behindSeconds": max(0, merge_ts.time - at_ts.time) if at_ts and merge_ts else 0,
        "droppedEvents": lag.dropped_events,
        "droppedBytes": lag.dropped_bytes,
        "fellBehind": lag.fell_behind,
        "droppedTotal": lag.dropped_total,
    }


def _key_time(key: bytes) -> Timestamp | None:
    """The cluster time of a sort key (None for the empty key of a bucket that has seen none)."""
    if not key:
        return None
    with contextlib.suppress(Exception):  # a key cut below an event (start_point) may not decode
        return decode_token(token_from_key(key)).cluster_time
    return None
