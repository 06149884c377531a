"""One parallel change stream: S shard readers -> MergedQueue -> N buckets, with bounded memory.

Data flow and backpressure (every arrow is bounded):

    ShardReader (one per shard) --ByteBudget(shard_buffer_bytes)--> channel --> merge pump
    merge pump --MergedQueue.pop_ready--> Bucket.put (ByteBudget of the bucket) --> getMore

A full bucket stops the pump; a stopped pump stops taking batches, whose byte budgets stay
charged, which stops the readers from issuing getMore. Memory is bounded by configuration.
In a named stream a full bucket stops the pump only briefly while another bucket's consumer
waits: then it falls behind, dropping what it is dealt, and its consumer catches up from a
replay of the oplogs (buckets/catch_up.py).

Retention: a bucket keeps events it has delivered for as long as its byte budget has room, so a
consumer that re-attaches with a recent token (a retried Spark task) is served from memory. An
older token is served by a private replay stream that re-reads the shards' oplogs, until the
consumer reaches what the bucket holds and moves to it. A token the bucket has not been dealt up to
yet (the stream was opened for another bucket's older token) is waited for: the events up to it
are passed over as they come, never returned.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import itertools
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import bson
import trio
from bson import Timestamp

from buckets._columnar.event_block import (
    EventBlock,
    as_fields,
    count_events,
    first_key,
    is_block,
    items_bytes,
    last_key,
)
from buckets._columnar.sizes import count_reaching, count_within, reply_prefix
from buckets.bucketing import buckets_for_event
from buckets.budget import ByteBudget
from buckets.catch_up import FALL_BEHIND_AFTER_S, Lag
from buckets.lookup import DocumentLookup
from buckets.memory_limit import (
    BUCKET_FLOOR_BYTES,
    SHARD_BATCH_BYTES,
    SHARD_FLOOR_BYTES,
    MemoryPool,
    PoolAccount,
    shaping_processes,
)
from buckets.merge import MergedQueue
from buckets.ports import Connection, Connector, ConnectUpstream
from buckets.reader import URGENT_NOTE_S, OplogTail, ShardBatch, ShardReader, mark_after
from buckets.reader_process import ReaderHost, ReaderPool, reader_pool
from buckets.shaping import Shaper
from buckets.topology import TOPOLOGY, Topology, TopologyWatcher
from mongoformats.change_events import (
    EV_DB,
    EV_NAMESPACES,
    EV_OP_TYPE,
    EV_RAW,
    EV_SHARD,
    EV_SORT_KEY,
    ChangeEvent,
    EventFields,
    OplogTransformer,
    event_token,
    events_from_fields,
    invalidate_event,
)
from mongoformats.change_stages import Stages
from mongoformats.codecs import PLAIN
from mongoformats.errors import MongoError
from mongoformats.large_events import MEASURE_ABOVE_BYTES, SPLIT_ABOVE_BYTES, event_bytes, event_too_large, split_event
from mongoformats.resume_token import (
    decode_token,
    fragment_of,
    high_water_mark,
    token_from_key,
    token_sort_key,
    token_text,
)
from mongoformats.wire import BATCH_BYTES_LIMIT, BATCH_ELEMENT_OVERHEAD

log = logging.getLogger("buckets.stream")

# What ParallelStream.oversize answers for an event to return in fragments.
SPLIT: Literal[True] = True
IDLE_PROGRESS_S = 1.0      # only a waiting consumer's resume point is behind: this often
_ROUTES_CACHED = 1 << 16   # namespace -> buckets routes a stream memoizes before starting over
_MERGED_AT_ONCE = 64       # shard batches the pump takes from its channel before a release


@dataclass(frozen=True)
class StreamOptions:
    n_buckets: int
    show_expanded_events: bool = False
    shard_buffer_bytes: int = 1 << 30        # per shard, as in the design (1 GiB)
    bucket_buffer_bytes: int = 64 << 20      # per bucket: pending plus retained events
    max_await_ms: int = 1000                 # a getMore waits this long for events by default
    reader_await_ms: int = 200
    # Processes that read the shards' oplogs and turn entries into events (one Python process is
    # one core; buckets/reader_process.py), and as many that apply `stages` (buckets/shaping.py);
    # 0 does both in the proxy process.
    reader_processes: int = 0
    # Expanded DDL events from the proxy's notes (upstream before 6.0) instead of native entries.
    ddl_notes: bool = False
    token_version: int = 2
    # Resumed from a token of an older version: (its clusterTime, its version); the events up to
    # that time keep the version (OplogTransformer's keep_version).
    keep_version: tuple[Timestamp, int] | None = None
    # With showExpandedEvents: migrateLastChunkFromShard, and create/createIndexes a migration wrote.
    show_system_events: bool = False
    match: dict[str, Any] | None = None      # a $match on events, applied before bucketing
    # Accelerated $changeStream: ("db", "coll") for a collection stream, ("db", None) for a database
    # stream; events outside it are dropped and the invalidating event ends the stream.
    scope: tuple[str, str | None] | None = None
    full_document: str = "default"           # or "updateLookup": updates carry the current document
    full_document_before_change: str = "off"  # or "whenAvailable" / "required": recorded pre-images
    # Stages after $changeStream applied to each event as it is returned, after the lookups (an
    # accelerated watch() with $project, $addFields, ..., or a $match that tests fullDocument).
    stages: Stages = ()  # compiled (change_stages.compile_stages)
    # $changeStreamSplitLargeEvent: an event over the split size is returned in fragments
    # (mongoformats/large_events.py) instead of failing the getMore that reaches it.
    split_large_events: bool = False
    # "namespace" or "documentKey": how events are dealt into buckets (buckets/bucketing.py).
    bucket_by: str = "namespace"

    @property
    def needs_pre_images(self) -> bool:
        """Recorded pre-images are read (for fullDocumentBeforeChange, or to compute post-images)."""
        return self.full_document_before_change != "off" or self.full_document in ("whenAvailable", "required")


class Bucket:
    """Events of one bucket in token order: [retained (delivered) ... pending].

    Held as segments: an EventFields tuple is one event, an EventBlock a run of them (a backlog's
    events stay columns from the splice to the reply). `starts[i]` is the absolute index of
    segment i's first event and `firsts[i]` its sort key, for finding a position or a key.
    """

    def __init__(self, index: int, limit_bytes: int, floor: bytes, floor_token: dict[str, Any],
                 account: PoolAccount | None = None) -> None:
        self.index = index
        self.segments: list[Any] = []
        self.starts: list[int] = []
        self.firsts: list[bytes] = []
        self.base = 0                  # absolute index of the first retained event
        self._end = 0                  # absolute index after the last
        self.floor = floor             # every event above this key is (or will be) held here
        # The stream's start point for this bucket: an attach without a token reads from here.
        self.start_floor = floor
        self.frontier_token = floor_token
        self.frontier = floor
        # `account`: its share of the proxy's memory limit (buckets/memory_limit.py).
        self.budget = ByteBudget(limit_bytes, account)
        if account is not None:
            account.shed = self._shed
        self.changed = trio.Event()
        self.cursors: set[BucketCursor] = set()
        self.delivered_total = 0
        self.dealt_total = 0           # events the merge dealt in (delivered_total counts them out)
        self.waiting = 0               # getMores parked on this bucket right now
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
        self.last_read = -math.inf     # trio time a getMore last came or left (none yet: never)
        self.merge_frontier = floor    # the merge's frontier, also while behind
        # Cursors reading a replay that move to this bucket once it holds their next event.
        self.awaiting: set[BucketCursor] = set()

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
        self.changed.set()
        self.changed = trio.Event()

    # -- positions -----------------------------------------------------------------------------------

    def _segment_at(self, position: int) -> int:
        """The index of the segment holding the event at absolute `position` (base <= it < end)."""
        return bisect.bisect_right(self.starts, position) - 1

    def key_at(self, position: int) -> bytes:
        s = self._segment_at(position)
        segment = self.segments[s]
        return segment.key(position - self.starts[s]) if is_block(segment) else segment[EV_SORT_KEY]

    def event_at(self, position: int) -> EventFields:
        s = self._segment_at(position)
        segment = self.segments[s]
        if is_block(segment):
            at = position - self.starts[s]
            return segment.sliced(at, at + 1).fields()[0]
        return segment

    def items_from(self, position: int) -> Iterator[tuple[Any, int]]:
        """(segment, offset of `position`'s event in it) from `position` to the end."""
        if position >= self._end:
            return
        s = self._segment_at(position)
        offset = position - self.starts[s]
        for segment in itertools.islice(self.segments, s, None):
            yield segment, offset
            offset = 0

    def keys_between(self, start: int, stop: int) -> list[bytes]:
        """The sort keys of the events at [start, stop)."""
        out: list[bytes] = []
        for segment, offset in self.items_from(start):
            if len(out) >= stop - start:
                break
            if is_block(segment):
                part = segment.sliced(offset, offset + stop - start - len(out))
                out += map(bytes, part.keys)
            else:
                out.append(segment[EV_SORT_KEY])
        return out

    def position_after(self, key: bytes) -> int | None:
        """Absolute index of the first event above `key`, or None if that history was dropped
        (or, fallen behind, not held)."""
        if key < self.floor or not self.lag.holds_after(key):
            return None
        s = bisect.bisect_right(self.firsts, key)
        if s == 0:
            return self.base
        segment = self.segments[s - 1]
        return self.starts[s - 1] + (segment.bisect_right(key) if is_block(segment) else 1)

    # -- retention -------------------------------------------------------------------------------------

    def _drop_delivered(self, need: int, *, hard: bool = False) -> None:
        """Free retained events that every live cursor (or, with none, the last to leave) has passed,
        oldest first (`hard`: also those only acked, the cache of re-attaches, see `_safe`).

        Frees down to 7/8 of the budget in one step, so the segment list shift is paid once per
        eighth of the budget rather than once per event (which made a full bucket quadratic).
        """
        if self.budget.used + need <= self.budget.limit:
            return
        safe = self._safe(hard=hard)
        target = self.budget.limit * 7 // 8 - need
        freed = 0
        position = self.base
        # A block's share is found with one cumulative sum (in C), not event by event.
        for segment, offset in self.items_from(self.base):
            if position >= safe or self.budget.used - freed <= target:
                break
            if is_block(segment):
                part = segment.sliced(offset, offset + safe - position)
                k, nbytes = count_reaching(part.sizes, self.budget.used - freed - target)
                freed += nbytes
                position += k
            else:
                freed += len(segment[EV_RAW])
                position += 1
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
        pinned = ([c.position if hard else c.acked for c in cursors if c.read]
                  or [c.position if hard else c.acked for c in cursors])
        return min(min(pinned, default=self.read_mark), self._end)

    def unpin(self) -> None:
        """Let go of the shard blocks this bucket's events point into (a shard's budget is full,
        and only their release gives it bytes back): retained events no cursor needs are
        dropped, and the rest copied into memory of their own."""
        self._drop_delivered(self.budget.limit)
        for i, segment in enumerate(self.segments):
            if is_block(segment) and segment.pins:
                self.segments[i] = segment.own()

    def _forget(self, position: int, nbytes: int) -> None:
        """Drop the retained events before absolute `position`, which hold `nbytes` of the budget."""
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

    def detach(self, cursor: BucketCursor) -> None:
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
            self.error = error
            self.notify()

    # -- taking events ----------------------------------------------------------------------------------

    def _append(self, item: Any) -> None:
        n = len(item) if is_block(item) else 1
        self.segments.append(item)
        self.starts.append(self._end)
        self.firsts.append(first_key(item))
        self._end += n
        self.dealt_total += n

    def put_nowait(self, event: Any) -> bool:
        """Append `event` (one event's fields, or a block of events, whole) if it fits now (the
        pump's fast path); False if the caller must `put`.

        Does not wake readers: the pump calls `notify()` once per merged batch, not per event.
        """
        if last_key(event) <= self.floor or self.error is not None:
            return True  # a resumed stream: this bucket already had it; or a failed bucket
        n = event.nbytes if is_block(event) else len(event[EV_RAW])
        lag = self.lag
        if lag.behind and not self._rejoin(lag.rejoin_point(self.merge_frontier, self.floor)):
            lag.drop(count_events([event]), n, last_key(event))
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
        return bool(self.awaiting) and not any(c.read and not c.lost and c.position < self._end
                                               for c in self.cursors)

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

    async def put_many(self, events: list[Any]) -> None:
        """Append `events` (token order; EventFields and EventBlocks) and wake consumers; one budget
        charge when they all fit, else a part at a time, waiting for consumers as `put` does."""
        if self.error is not None:
            return  # failed: nothing after its error is read
        if first_key(events[0]) <= self.floor:  # a resumed stream: this bucket already had some
            events = _above(events, self.floor)
            if not events:
                return
        n = items_bytes(events)
        self._drop_delivered(n)
        # (try_acquire lets one oversized item into an empty budget; a whole share must fit.)
        fits = self.budget.used + n <= self.budget.limit
        if not self.lag.behind and fits and self.budget.try_acquire(n):
            for item in events:
                self._append(item)
        else:
            for item in events:
                if is_block(item):
                    await self._put_block(item)
                elif not self.put_nowait(item):
                    await self.put(item)
        self.notify()

    async def _put_block(self, block: EventBlock) -> None:
        """A block that does not fit at once goes in as parts that do, as consumers make room."""
        while len(block):
            if self.lag.behind and self.put_nowait(block):
                return  # dropped whole (or it rejoined and took it)
            self._drop_delivered(block.nbytes)
            room = self.budget.room()  # in the budget and in the proxy's memory pool
            k = count_within(block.sizes, room)
            if k == 0:
                await self.put(block.sliced(0, 1))  # waits (or takes one oversized event alone)
                k = 1
            elif not self.put_nowait(block.sliced(0, k)):  # fits: the room was just measured
                await self.put(block.sliced(0, k))
            block = block.sliced(k)

    async def put(self, event: Any) -> None:
        """Append `event`, waiting while the bucket is full (a consumer must read first:
        backpressure), or while the proxy's memory pool is (a consumer of this stream or another
        must read). An isolated bucket waits so only while no other bucket's consumer waits for
        events, or briefly: once it has waited FALL_BEHIND_AFTER_S (its consumer is slow), or its
        consumer has not read for that long (stalled or gone: at once), it falls behind
        (buckets/catch_up.py)."""
        since = trio.current_time()
        while not self.put_nowait(event):
            self.notify()
            n = event.nbytes if is_block(event) else len(event[EV_RAW])
            held_back = trio.current_time() - min(since, self.last_read) >= FALL_BEHIND_AFTER_S
            if self.isolated and held_back and self.holds_back():
                self._drop_delivered(n, hard=True)  # retention is a cache: it goes first
                if not self.budget.try_acquire(n):
                    self._fall_behind()
                    self.lag.drop(count_events([event]), n, last_key(event))
                    break
                self._append(event)
                break
            if self.budget.blocked_by_pool(n):
                self.budget.wake_when_pool_frees(self.notify)
            if self.isolated:  # woken by its consumers, and to look at the others now and then
                with trio.move_on_after(FALL_BEHIND_AFTER_S / 4):
                    await self.changed.wait()
            else:
                await self.changed.wait()
        self.notify()

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


def _kind_event(kind: tuple[str, str, str, Any]) -> EventFields:
    """An event of a block's kind (operationType, db, coll, namespaces), for routing it."""
    op_type, db, coll, namespaces = kind
    return (b"", b"", op_type, db, coll, b"", namespaces, "", None)


def _above(items: list[Any], key: bytes) -> list[Any]:
    """The events of `items` (in token order) above `key`."""
    out = []
    for item in items:
        if last_key(item) <= key:
            continue
        if is_block(item) and item.first_key <= key:
            item = item.sliced(item.bisect_right(key))
        out.append(item)
    return out


@dataclass(eq=False)
class BucketCursor:
    cursor_id: int
    stream: ParallelStream
    bucket: Bucket
    position: int
    owner: bytes             # the id of the session it was opened in (b"": none)
    ns: str
    batch_size: int | None = None
    user: str = ""           # who opened it, when the proxy requires authentication
    last_used: float = 0.0   # trio time of its creation or last getMore (idle cursors are killed)
    busy: bool = False       # a getMore is running on it
    read: bool = False       # a getMore has come for it (until then it pins no retention)
    # Where the consumer has surely been: the start of the last batch handed out. A consumer that
    # stops inside a batch (a Spark task reading up to its end token, which then kills the
    # cursor) resumes from a token in that batch, so the batch must outlive the cursor; freeing
    # up to `position` made the next micro-batch fall back to re-reading the oplogs.
    acked: int = -1

    def __post_init__(self) -> None:
        self.acked = self.position
    last_key: bytes = b""
    last_token: dict[str, Any] = field(default_factory=dict)
    exhausted: bool = False
    # Killed (killCursors, a killed session, a timeout): a getMore parked on it fails with
    # CursorKilled, as mongos interrupts the operation that has a cursor checked out.
    killed: bool = False
    # A watch() resumed from an event's token must meet that event again, after its scope and
    # stages, before any later one, as mongos's EnsureResumeTokenPresent stage requires: the
    # event's key until then (the cursor starts at the high-water mark of its time), else None.
    must_meet: bytes | None = None
    met: bool = False
    # Fragments of the split event at `position` already returned (or, resumed from a fragment's
    # token, that fragment's number plus one): the event is consumed once its last one is out.
    fragments_sent: int = 0
    # The fragments of that event still to return. The server splits an event once and queues
    # its fragments; split again for each getMore, an event whose updateLookup document changed
    # in between would come back in pieces of two different events.
    split_rest: list[EventFields] = field(default_factory=list)
    # Resumed after this key (start_point's), which the bucket had not yet been dealt up to: a
    # stream opened for another bucket's older token is still catching up, and the events up to
    # the key, which this consumer has read, are yet to come. They are passed over as they
    # arrive; None once the bucket holds (or has passed) everything up to the key.
    resume_key: bytes | None = None
    # Resumed from a fragment's token: (the split event's key, the fragment's number), until the
    # event is reached (settled with resume_key).
    resume_fragment: tuple[bytes, int] | None = None
    # Reading a replay stream (resumed from a token older than its named stream's bucket held):
    # the named stream, whose bucket this cursor moves to once it has read up to where that
    # bucket holds every event, and what to call then (the engine closes the replay stream).
    # Until then the named bucket keeps what it was dealt for this consumer, and, full, holds
    # its stream back: a consumer left on the replay would hold it back for good.
    join: ParallelStream | None = None
    joined: Callable[[], None] | None = None
    # Left before the gap of a bucket that fell behind and rejoined the merge after it: what
    # follows this cursor's resume point is re-read by a replay (the engine's getMore moves it).
    lost: bool = False

    def stale(self) -> bool:
        """Whether what follows this cursor is no longer in its bucket: the bucket fell behind
        and the cursor has read what it holds, or the bucket rejoined past the cursor."""
        return self.lost or (self.bucket.lag.behind and self.position >= self.bucket.end
                             and not self.split_rest and not self.fragments_sent)

    def follow(self, named: ParallelStream, joined: Callable[[], None]) -> None:
        """Read on from a replay stream, and move to `named`'s bucket once it holds the events
        after this cursor (that bucket rejoins the merge for it if it fell behind)."""
        self.join, self.joined, self.lost = named, joined, False
        named.buckets[self.bucket.index].awaiting.add(self)

    def resume_after(self, token: Mapping[str, Any]) -> None:
        """Place the cursor after `token`: it returns the bucket's events above it and, resumed
        from a fragment, the split event's later fragments; never one at or before it, even those
        the bucket is dealt only later. The caller checked that the bucket still holds the events
        above the token (position_after is not None)."""
        self.last_key, self.last_token = token_sort_key(token), dict(token)
        self.resume_key = start_point(token)[1]
        self.resume_fragment = fragment_of(token)
        self._settle()

    def _join_named_stream(self) -> None:
        """Move from the replay stream to the named stream's bucket once that bucket holds every
        event after this cursor's resume point (not inside a split event or before the resume
        token was met: those states are the replay bucket's)."""
        named = self.join
        if (named is None or self.killed or self.split_rest or self.fragments_sent
                or self.must_meet is not None):
            return
        if named.closed or named.error is not None:
            self.join = None  # torn down or failed: the replay stream goes on alone
            return
        target = named.buckets[self.bucket.index]
        target.rejoin_if_awaited()
        if target.position_after(start_point(self.last_token)[1]) is None:
            return  # the named bucket starts after this point, or is behind: read the replay
        self.bucket.detach(self)
        self.stream, self.bucket, self.join = named, target, None
        self.position = target.base
        target.cursors.add(self)
        self.resume_after(self.last_token)
        self.acked = self.position
        if not target.awaiting:
            target.lag.settle()  # every consumer that was behind is back
        if self.joined is not None:
            self.joined()

    def _settle(self) -> None:
        """Pass over the events at or below `resume_key` the bucket now holds; once it holds an
        event above the key, or its frontier is past the key (all up to it was dealt), the cursor
        stands at its resume point for good."""
        key = self.resume_key
        if key is None:
            return
        bucket = self.bucket
        position = bucket.position_after(key)
        if position is None:  # dropped below it: next_batch reports the history lost
            return
        if position > self.position:
            # The passed-over events are behind the consumer: they need not stay retained, and a
            # merge waiting for room in this bucket may go on.
            self.position = self.acked = position
            bucket.notify()
        if position >= bucket.end and bucket.frontier < key:
            return  # more events up to the key may still be dealt
        self.resume_key = None
        fragment, self.resume_fragment = self.resume_fragment, None
        if fragment is None or position >= bucket.end:
            return
        if bucket.key_at(position) == fragment[0]:
            self.fragments_sent = fragment[1] + 1  # in the split event: past the fragments returned

    async def _shape(self, batch: list[ChangeEvent]) -> list[tuple[int, ChangeEvent]]:
        """Lookups, then the user's stages, as the server orders them; (index in `batch`, event)
        for each event that remains."""
        lookup, options = self.stream.lookup, self.stream.options
        if lookup is not None:
            full, before = options.full_document, options.full_document_before_change
            pre = await lookup.pre_images(batch) if options.needs_pre_images else {}
            if full == "updateLookup":
                batch = await lookup.with_post_images(batch)
            elif full in ("whenAvailable", "required"):
                batch = lookup.with_recorded_post_images(batch, pre, required=full == "required")
            if before != "off":
                batch = lookup.with_pre_images(batch, pre, required=before == "required")
        if not options.stages:
            return list(enumerate(batch))
        # The invalidate too: the user's stages follow $changeStream's CheckInvalidate stage.
        shaped = await self.stream.shaper.shape([ev.raw for ev in batch], [ev.token for ev in batch])
        return [(i, ev._replace(raw=raw)) for i, (ev, raw) in enumerate(zip(batch, shaped, strict=True))
                if raw is not None]

    async def next_batch(self, batch_size: int | None, max_time_ms: int | None,
                         *, first: bool = False) -> tuple[list[Any], dict[str, Any]]:
        bucket = self.bucket
        limit = batch_size or self.batch_size or 1 << 30
        # Asking for more means the previous batch was taken, before this getMore waits: a
        # bucket whose budget that batch's retained events fill has room only once they may go,
        # and a merge waiting to put more is woken to drop them. (Acked after the wait, every
        # getMore on such a bucket waited out its maxTimeMS: a bucket budget smaller than a reply
        # drained at a batch per maxTimeMS.)
        self._settle()
        self.acked = self.position
        bucket.last_read = trio.current_time()  # its consumer reads: not stalled (Bucket.put)
        if not first:
            bucket.notify()
            deadline = trio.current_time() + (max_time_ms if max_time_ms is not None
                                              else self.stream.options.max_await_ms) / 1000
            bucket.waiting += 1
            try:
                while (self.position >= bucket.end and self.stream.error is None and not self.stream.ended
                       and not self.killed and bucket.error is None and not self.stale()):
                    with trio.move_on_at(deadline):
                        await bucket.changed.wait()
                        self._settle()
                        if self.position >= bucket.end and bucket.frontier > self.last_key:
                            break  # an idle bucket still returns the advanced resume point promptly
                        continue
                    break
            finally:
                bucket.waiting -= 1
            if self.killed:
                raise _interrupted()
        if self.stream.error is not None:
            raise self.stream.error
        if bucket.error is not None and self.position >= bucket.end:
            raise bucket.error
        if self.stale():
            return [], self.last_token  # the engine moves it to a replay of what follows
        if self.position < bucket.base:
            raise MongoError("ChangeStreamHistoryLost", "bucket history was dropped before this cursor read it")
        if self.split_rest:  # mid-split: the fragments as they were cut, nothing read or shaped again
            event = bucket.event_at(self.position)
            batch, taken = self._fragments(event, [event])
        else:
            batch, taken = await self._read(limit)
        self.position += count_events(taken)
        bucket.delivered_total += count_events(batch)
        if batch:
            # The last event returned, as on a server: one a stage dropped is not a resume point
            # (a stream resumed from it would not meet it again). A drained bucket's frontier
            # moves it on below.
            last = batch[-1]
            self.last_key = last_key(last)
            self.last_token = token_from_key(self.last_key) if is_block(last) else event_token(last)
        if self.position >= bucket.end and bucket.frontier > self.last_key:
            # Drained: everything up to the merge frontier was dealt out, so the frontier is a
            # resume point that moves even while this bucket is idle.
            self.last_key, self.last_token = bucket.frontier, bucket.frontier_token
        bucket.notify()
        bucket.last_read = trio.current_time()
        self.exhausted = self.stream.ended and self.position >= bucket.end
        if self.exhausted and self.stream.end_token is not None:
            # The server closes the cursor on ChangeStreamInvalidated, whose token (the
            # invalidate's) is the last postBatchResumeToken, also when a stage dropped the
            # invalidate (the cursor code of mongos and mongod catches that exception and sets it).
            self.last_token = self.stream.end_token
            self.last_key = token_sort_key(self.last_token)
        self._join_named_stream()
        return batch, self.last_token

    async def _read(self, limit: int) -> tuple[list[Any], list[Any]]:
        """The next reply from the bucket's events at this cursor's position: (events to return,
        events consumed; EventFields, or EventBlocks while nothing is shaped), after lookups,
        stages, the resume point and a split."""
        batch: list[Any] = []
        count = size = 0
        lookup, options = self.stream.lookup, self.stream.options
        # Lookups and stages change events after this: the server measures what they make (_fit).
        shaped = lookup is not None or bool(options.stages)

        def take(ev: EventFields) -> bool:
            """Add one event if it goes in this reply; whether the next may follow it."""
            nonlocal count, size
            cost = len(ev[EV_RAW]) + BATCH_ELEMENT_OVERHEAD
            if count >= limit or (batch and size + cost > BATCH_BYTES_LIMIT):
                return False
            if cost > MEASURE_ABOVE_BYTES and not shaped and (big := self.stream.oversize(ev[EV_RAW])) is not None:
                if batch:
                    return False  # the events before it first; the next getMore fails or splits it
                if big is not SPLIT:
                    raise big
                batch.append(ev)  # alone: its fragments are the reply
                count += 1
                return False
            batch.append(ev)
            count, size = count + 1, size + cost
            return True

        for segment, offset in self.bucket.items_from(self.position):
            if not is_block(segment):
                if not take(segment):
                    break
                continue
            # A block's events that fit are taken as one slice, found with a cumulative sum; an
            # event to measure (a large one) or the first that does not fit goes through `take`.
            while offset < len(segment):
                part = segment.sliced(offset, offset + limit - count)
                fit, cost = reply_prefix(part.sizes, BATCH_BYTES_LIMIT - size, BATCH_ELEMENT_OVERHEAD,
                                         MEASURE_ABOVE_BYTES)
                if fit:
                    batch.append(part.sliced(0, fit))
                    count, size, offset = count + fit, size + cost, offset + fit
                if fit == len(part) or not take(part.sliced(fit, fit + 1).fields()[0]):
                    break
                offset += 1
            if offset < len(segment) or count >= limit:
                break
        if shaped or self.must_meet is not None:
            batch = as_fields(batch)  # shaped and checked event by event
        taken = batch
        if shaped:
            # Before the position moves: a failed lookup fails this getMore and loses nothing.
            batch, consumed = _fit(await self._shape(events_from_fields(batch)), self.stream.oversize)
            taken = taken[:consumed]
            if self.killed:  # while its lookups ran
                raise _interrupted()
        if self.must_meet is not None:
            batch = self._past_resume_point(batch)
        if batch and not is_block(batch[0]) and (self.fragments_sent or (
                len(batch[0][EV_RAW]) > MEASURE_ABOVE_BYTES and self.stream.oversize(batch[0][EV_RAW]) is SPLIT)):
            batch, taken = self._fragments(batch[0], as_fields(taken))
        return batch, taken

    def _fragments(self, event: EventFields, taken: list[EventFields]) -> tuple[list[EventFields], list[EventFields]]:
        """The reply for a split event that heads the batch: its next fragments, as many as fit
        (at least one), and the taken events it consumes (up to the event, and the event itself
        once its last fragment is out). The event is split on the first call and its fragments
        kept in `split_rest` for the getMores that follow. Resumed from a fragment, an event that
        now splits otherwise, or not at all, fails the stream as the server's does
        (ChangeStreamFatalError)."""
        pieces = self.split_rest or [
            tuple(ChangeEvent._make(event)._replace(sort_key=token_sort_key(token),
                                                    type_bits=bytes(token.get("_typeBits", b"")), raw=raw))
            for token, raw in split_event(event[EV_RAW], merged=self.stream.sharded, skip=self.fragments_sent) or []]
        out: list[EventFields] = []
        size = 0
        for piece in pieces:
            size += len(piece[EV_RAW]) + BATCH_ELEMENT_OVERHEAD
            if out and size > BATCH_BYTES_LIMIT:
                break
            out.append(piece)
        at = next(i for i, ev in enumerate(taken) if ev[EV_SORT_KEY] == event[EV_SORT_KEY])
        if len(out) < len(pieces):
            self.fragments_sent += len(out)
            self.split_rest = pieces[len(out):]
            return out, taken[:at]
        self.fragments_sent, self.split_rest = 0, []
        return out, taken[:at + 1]

    def _past_resume_point(self, batch: list[EventFields]) -> list[EventFields]:
        """`batch` less the events up to the one resumed from; ChangeStreamFatalError if a later
        event comes first (the token's event was filtered out, or is in no such stream).
        Resumed from a fragment's token, the event stays, to be split again."""
        assert self.must_meet is not None
        for i, ev in enumerate(batch):
            key = ev[EV_SORT_KEY]
            if key == self.must_meet and self.fragments_sent and not self.met:
                self.met, self.must_meet = True, None
                return batch[i:]
            if key == self.must_meet:
                self.met = True
            elif key > self.must_meet:
                if not self.met:
                    raise MongoError("ChangeStreamFatalError", "cannot resume stream; the resume token was not "
                                     f"found. {token_text(event_token(ev))}")
                self.must_meet = None
                return batch[i:]
        return []


class ParallelStream:
    def __init__(self, name: str, options: StreamOptions, topology: Topology, start: Timestamp,
                 floors: list[bytes], *, keep: set[int] | None = None,
                 connect_upstream: ConnectUpstream | None = None, connect_member: Connector,
                 readers_pool: ReaderPool | None = None, memory: MemoryPool | None = None) -> None:
        self.name = name
        self._memory = memory  # the proxy-wide pool the budgets also take their bytes from
        self._closing = False
        shaping = shaping_processes(bool(options.stages), options.reader_processes)
        # Its shaping processes, at a reader process's size (they start the same interpreter).
        self._shaping = memory.account(shaping * memory.process_bytes, reader=False) \
            if memory is not None and shaping else None
        self._pool = readers_pool  # the engine's reader processes (None: the stream starts its own)
        self.options = options
        self.sharded = topology.sharded  # mongos sizes events as its shards send them, with their sort key
        self.start = start
        n = options.n_buckets
        self.keep = keep if keep is not None else set(range(n))
        self._hosts: list[ReaderHost] = []    # reader processes, with readerProcesses
        self.shaper = Shaper(options.stages, options.reader_processes)  # the stages, over as many processes
        self._connect_member = connect_member
        self.lookup = DocumentLookup(connect_upstream, self._connect_shard) if connect_upstream is not None and (
            options.full_document == "updateLookup" or options.needs_pre_images) else None
        self.buckets = {i: Bucket(i, options.bucket_buffer_bytes, floors[i],
                                  token_from_key(floors[i]),
                                  self._account(BUCKET_FLOOR_BYTES, reader=False))
                        for i in self.keep}
        self._skip = min(floors[i] for i in self.keep)
        self.shard_budgets: dict[str, ByteBudget] = {}
        self._routes: dict[tuple[str, ...], tuple[int, ...]] = {}
        self.readers: dict[str, ShardReader] = {}
        self.merge = MergedQueue(())
        for sid, hosts in topology.shards.items():
            self._new_reader(sid, hosts, start)
        # Without an upstream to ask (a fixed shard list, or a replica set), nothing is added and
        # nothing waits on it.
        self.watcher: TopologyWatcher | None = None
        if connect_upstream is not None and topology.sharded:
            self.watcher = TopologyWatcher(connect_upstream, topology,
                                           holds_back=lambda: self._shard_holds_back(TOPOLOGY))
            self.merge.add_shard(TOPOLOGY, max(mark_after(topology.as_of), self.merge.frontier()))
        self.error: Exception | None = None
        self.events_merged = 0
        self.replays = 0     # attaches older than retention, served by re-reading the oplogs
        self.last_active = 0.0
        self.started = trio.Event()
        self._frontier = b""
        self.ended = False   # an accelerated single-collection or database stream was invalidated
        # Its invalidate's token: where a cursor that read to the end resumes (startAfter).
        self.end_token: dict[str, Any] | None = None
        self._cancel = trio.CancelScope()


    async def _connect_shard(self, sid: str) -> Connection:
        """A connection to a member of shard `sid` (pre-images live on the shard that wrote them)."""
        return await self._connect_member(self.readers[sid].hosts, secondary=True)

    def _new_reader(self, sid: str, hosts: list[tuple[str, int]], start: Timestamp) -> ShardReader:
        options = self.options
        scope = options.scope
        # The reader holds a batch in hand while it waits for room: counted beside the budget.
        account = self._account(SHARD_FLOOR_BYTES, reader=True, in_hand=SHARD_BATCH_BYTES)
        self.shard_budgets[sid] = ByteBudget(options.shard_buffer_bytes, account)
        tail = OplogTail(sid, hosts, start=start, skip_key=self._skip, await_ms=options.reader_await_ms,
                         transformer=OplogTransformer(show_expanded_events=options.show_expanded_events,
                                                      show_system_events=options.show_system_events,
                                                      token_version=options.token_version,
                                                      keep_version=options.keep_version,
                                                      view_events=scope is None or scope[1] is None,
                                                      ddl_notes=options.ddl_notes),
                         connect_member=self._connect_member)
        reader = self.readers[sid] = ShardReader(tail, budget=self.shard_budgets[sid])
        if self._hosts:  # with readerProcesses: shards are dealt over the reader processes in turn
            reader.elsewhere = self._hosts[(len(self.readers) - 1) % len(self._hosts)]
        reader.wants_progress = self._shard_holds_back
        reader.relieve = self._unpin
        # A shard that joins later starts with the mark of its start time: above the frontier,
        # since it was not listed when the frontier was last allowed to move.
        # (Resumed from an older token at its time: that version's mark, which sorts below the
        # events at the time that keep the version.)
        keep = options.keep_version
        version = keep[1] if keep is not None and keep[0] == start else options.token_version
        self.merge.add_shard(sid, token_sort_key(high_water_mark(start, version)))
        return reader

    def isolate(self) -> None:
        """A full bucket falls behind instead of stopping the merge (a named stream's buckets,
        each read by its own consumer; buckets/catch_up.py)."""
        now = trio.current_time()
        for bucket in self.buckets.values():
            bucket.isolated = True
            bucket.last_read = now  # its consumers are yet to come: none has stalled yet
            bucket.holds_back = functools.partial(self._others_wait, bucket.index)

    def _others_wait(self, index: int) -> bool:
        return any(b.waiting for i, b in self.buckets.items() if i != index)

    def _unpin(self) -> None:
        for bucket in self.buckets.values():
            bucket.unpin()

    def has_cursors(self) -> bool:
        """Whether a consumer reads this stream, or reads a replay to come back to it."""
        return any(b.cursors or b.awaiting for b in self.buckets.values())

    def _account(self, floor: int, *, reader: bool, in_hand: int = 0) -> PoolAccount | None:
        """A new budget's account in the proxy's memory pool (none without one, or once closing)."""
        if self._memory is None or self._closing:
            return None
        return self._memory.account(floor, reader=reader, in_hand=in_hand)

    def _budgets(self) -> list[ByteBudget]:
        return [*self.shard_budgets.values(), *(b.budget for b in self.buckets.values())]

    def memory(self) -> dict[str, int]:
        """What this stream's budgets hold, their floors, and what the proxy's memory pool counts
        for them (the larger of the two, budget by budget; buckets/memory_limit.py)."""
        accounts = [b.account for b in self._budgets() if b.account is not None]
        if self._shaping is not None:
            accounts.append(self._shaping)
        return {"heldBytes": sum(b.used for b in self._budgets()),
                "floorBytes": sum(a.floor for a in accounts),
                "countedBytes": sum(a.counted for a in accounts),
                "memoryWaits": sum(b.pool_waits for b in self._budgets())}

    def close(self) -> None:
        """Stop reading; once `run` has unwound, the retained events are dropped (see `_release`).
        The memory pool stops counting the stream at once: a stream admitted in its place gets
        the room now, as the events are dropped within the loop's next turns."""
        self._cancel.cancel()
        self._closing = True
        for budget in self._budgets():
            if budget.account is not None:
                budget.account.close()
        if self._shaping is not None:
            self._shaping.close()

    @property
    def closed(self) -> bool:
        return self._cancel.cancel_called

    def _release(self) -> None:
        """Drop the events a closed stream holds. A stream sits in reference cycles (its readers
        call back into it, its tasks' frames hold it), and the proxy's collector thresholds make
        full collections rare (_columnar.allocator.tune_gc_for_throughput): left to the
        collector, a closed stream's retention (up to every bucket budget) stayed allocated."""
        for bucket in self.buckets.values():
            bucket.clear()
        self.merge.drop_pending()

    async def run(self) -> None:
        with self._cancel:
            try:
                send, recv = trio.open_memory_channel[ShardBatch](2 * len(self.readers) + 2)
                async with self._reader_processes(), trio.open_nursery() as nursery:
                    checks = []
                    for reader in self.readers.values():
                        checks.append(trio.Event())
                        nursery.start_soon(reader.run, send.clone(), checks[-1])
                    if self.watcher is not None:
                        nursery.start_soon(self._watch_topology, nursery, send.clone())
                    send.close()
                    nursery.start_soon(self.shaper.warm_up)
                    nursery.start_soon(self._announce_start, checks)
                    await self._pump(recv)
            except* MongoError as group:
                self._fail(_first_leaf(group))
            except* Exception as group:
                # A bug (or an entry the transform cannot handle) fails this stream with
                # InternalError, as a server fails one cursor; other streams and the proxy go on.
                bug = _first_leaf(group)
                log.error("stream %s: internal error", self.name, exc_info=bug)
                self._fail(MongoError("InternalError", f"parallel change stream {self.name!r} failed: "
                                      f"{type(bug).__name__}: {bug}"))
            finally:
                self.started.set()
                if self.lookup is not None:
                    with trio.CancelScope(shield=True):
                        await self.lookup.aclose()
                if self._cancel.cancel_called:
                    self._release()

    def _fail(self, exc: Exception) -> None:
        log.warning("stream %s failed: %s", self.name, exc)
        self.error = exc
        for b in self.buckets.values():
            b.notify()

    @contextlib.asynccontextmanager
    async def _reader_processes(self) -> AsyncIterator[None]:
        """With readerProcesses, the shards' tails run in that many of the engine's reader processes
        (a private pool when the stream has no engine)."""
        if not self.options.reader_processes:
            yield
            return
        async with contextlib.AsyncExitStack() as stack:
            pool = self._pool if self._pool is not None else await stack.enter_async_context(reader_pool())
            hosts = self._hosts = await pool.hosts(self.options.reader_processes)
            for i, reader in enumerate(self.readers.values()):
                reader.elsewhere = hosts[i % len(hosts)]
            yield

    async def _watch_topology(self, nursery: trio.Nursery, send: trio.MemorySendChannel[ShardBatch]) -> None:
        assert self.watcher is not None

        async def advance(as_of: Timestamp) -> None:
            await send.send(ShardBatch(TOPOLOGY, [], mark_after(as_of), 0))

        def add_shard(sid: str, hosts: list[tuple[str, int]], joined: Timestamp) -> None:
            reader = self._new_reader(sid, hosts, max(joined, self.start, key=lambda ts: (ts.time, ts.inc)))
            nursery.start_soon(reader.run, send.clone())

        async with send:
            await self.watcher.run(advance, add_shard)

    async def _announce_start(self, checks: list[trio.Event]) -> None:
        for event in checks:
            await event.wait()
        self.started.set()

    async def _pump(self, recv: trio.MemoryReceiveChannel[ShardBatch]) -> None:
        merge = self.merge
        tag_shard = self.options.needs_pre_images
        async for first in recv:
            # Every batch already waiting is merged with this one: fewer, larger releases (each
            # release cuts the shards' blocks at the frontier, and each piece is dealt apart).
            arrived = [first]
            with contextlib.suppress(trio.WouldBlock, trio.EndOfChannel):
                while len(arrived) < _MERGED_AT_ONCE:
                    arrived.append(recv.receive_nowait())
            for batch in arrived:
                events = batch.events
                if tag_shard:  # pre-images are read from the shard that wrote the event: remember which
                    events = [(*ev[:EV_SHARD], batch.shard, *ev[EV_SHARD + 1:]) for ev in as_fields(events)]
                merge.extend(batch.shard, events)
                merge.advance(batch.shard, batch.mark)
            ready, freed = merge.pop_ready()
            # Events that wait on some marks: idle shards write a note now, not at their next
            # getMore timeout, and the shard list is re-read (live-tail latency). (Not guarded
            # by len(merge), which counts a block's events: this runs for every release.)
            for shard in merge.blocking_shards():
                reader = self.readers.get(shard)
                if reader is not None:
                    reader.nudge()
                elif shard == TOPOLOGY and self.watcher is not None:
                    self.watcher.nudge()
            await self._deal(ready)
            # Budgets are released once per merged batch, not once per event.
            for shard, nbytes in freed.items():
                self.shard_budgets[shard].release(nbytes)
            # What was just dealt may hold a waiting reader's budget full (the reader asked
            # before it was dealt, or reads in a reader process and cannot ask).
            if any(reader.starved for reader in self.readers.values()):
                self._unpin()
            self.events_merged += count_events(ready)
            frontier = merge.frontier()
            if frontier > self._frontier:
                # Every mark is a high-water-mark token key, so the frontier is itself a token;
                # idle buckets report it as their postBatchResumeToken.
                self._frontier = frontier
                token = token_from_key(frontier)
                for bucket in self.buckets.values():
                    bucket.advance_frontier(frontier, token)
            # Nor may this frame hold the blocks while it waits for the next batch: a waiting
            # reader's batch comes only once they are let go.
            del first, arrived, batch, events, ready

    async def _deal(self, ready: list[EventFields]) -> None:
        """Deal merged events into their buckets: each bucket's share is appended in one step."""
        scope, match, buckets = self.options.scope, self.options.match, self.buckets
        shares: dict[int, list[Any]] = {}
        by_document = self.options.bucket_by == "documentKey"
        if scope is not None or match is not None or by_document:
            # filtered event by event, or routed by each event's documentKey
            ready = as_fields(ready)
        for ev in ready:
            if type(ev) is EventBlock:
                self._deal_block(ev, shares)
                continue
            if self.ended:
                break
            if scope is not None and not _in_scope(ev, scope):
                continue
            if scope is not None and _invalidates(ev, scope):
                await self._put_shares(shares)
                shares = {}
                await self._end_with(ev, match)
                break
            if match is not None:
                try:
                    if not _event_matches(ev, match):
                        continue
                except MongoError as exc:
                    # Only the buckets of the event's namespaces meet it; each fails once its
                    # consumers have read what came before.
                    await self._put_shares(shares)
                    shares = {}
                    for b in self._route(ev):
                        buckets[b].fail(exc)
                    continue
            route = self._routes.get(ev[EV_NAMESPACES]) if not by_document else None
            if route is None:
                route = self._route(ev)
            for b in route:
                share = shares.get(b)
                if share is None:
                    shares[b] = [ev]
                else:
                    share.append(ev)
        await self._put_shares(shares)

    async def _end_with(self, ev: EventFields, match: dict[str, Any] | None) -> None:
        """End the stream at its invalidating event `ev`: the event, then its invalidate, each
        through the user's $match, which comes after $changeStream's own CheckInvalidate stage
        (document_source_change_stream.cpp). A $match that drops the invalidate does not keep
        the stream open: the server's cursor closes on ChangeStreamInvalidated all the same."""
        end = tuple(invalidate_event(ChangeEvent._make(ev), wall=bson.decode(ev[EV_RAW], PLAIN).get("wallTime")))
        self.end_token = event_token(end)
        for bucket in self.buckets.values():
            for item in (ev, end):
                try:
                    if match is not None and not _event_matches(item, match):
                        continue
                except MongoError as exc:
                    bucket.fail(exc)
                    break
                await bucket.put(item)
        self.ended = True

    def _deal_block(self, block: EventBlock, shares: dict[int, list[Any]]) -> None:
        """A block's share of each bucket, taken as columns: an event goes where its kind's
        namespaces route it."""
        routes = []
        for kind in block.kind_table:
            route = self._routes.get(kind[3])
            routes.append(self._route(_kind_event(kind)) if route is None else route)
        for b, share in block.shares(routes).items():
            shares.setdefault(b, []).append(share)

    def _route(self, ev: EventFields) -> tuple[int, ...]:
        """The kept buckets of `ev`'s namespaces, memoized: most streams see few namespaces.
        By documentKey, each event's own (never memoized: it depends on the document)."""
        if self.options.bucket_by == "documentKey":
            return tuple(b for b in buckets_for_event(ev, self.options.n_buckets, "documentKey")
                         if b in self.buckets)
        if len(self._routes) >= _ROUTES_CACHED:
            self._routes.clear()
        route = self._routes[ev[EV_NAMESPACES]] = tuple(b for b in buckets_for_event(ev, self.options.n_buckets)
                                                    if b in self.buckets)
        return route

    async def _put_shares(self, shares: dict[int, list[Any]]) -> None:
        for b, share in shares.items():
            await self.buckets[b].put_many(share)

    def _shard_holds_back(self, shard: str) -> float | None:
        """How soon `shard`'s mark should move (seconds between nudges), or None if it holds
        nothing back. Pending events wait on it: soon (URGENT_NOTE_S). Only a waiting
        consumer's resume point does: lazily (IDLE_PROGRESS_S), so an idle cluster with consumers
        attached gets a note a second per shard, not fifty."""
        if shard in self.merge.blocking_shards():
            return URGENT_NOTE_S
        waiting = any(b.waiting for b in self.buckets.values())
        if waiting and self.merge.mark_of(shard) <= self.merge.frontier():
            return IDLE_PROGRESS_S
        return None

    @property
    def frontier_key(self) -> bytes:
        return max(self._frontier, min(b.floor for b in self.buckets.values()))

    def plan_end(self, after: list[bytes], max_events: int | None) -> bytes:
        """The end key of a micro-batch starting after `after` (one key per bucket).

        Without a limit it is the frontier: every event at or below it has been dealt. With one,
        it is lowered so that at most `max_events` retained events fall in (after_i, end]; if
        bucket history was dropped the count is unknown there and the frontier is used.
        """
        frontier = self.frontier_key
        if max_events is None:
            return frontier
        import heapq

        runs = []
        for i, bucket in self.buckets.items():
            lo = bucket.position_after(max(after[i], bucket.floor))
            hi = bucket.position_after(max(frontier, bucket.floor))
            if lo is None or hi is None:
                return frontier  # fallen behind: what it holds there is unknown
            runs.append(bucket.keys_between(lo, min(hi, lo + max_events + 1)))
        merged = list(heapq.merge(*runs))
        # Keys repeat across buckets for multi-bucket events; count each key once per bucket run.
        if len(merged) <= max_events:
            return frontier
        end = merged[max_events - 1]
        return end

    def oversize(self, raw: bytes) -> MongoError | Literal[True] | None:
        """What a server does with an event of this size: split it (SPLIT, with the split stage and
        over the split size), fail with BSONObjectTooLarge (returned) or return it whole (None)."""
        if self.options.split_large_events:
            return SPLIT if event_bytes(raw, merged=self.sharded) > SPLIT_ABOVE_BYTES else None
        return event_too_large(raw, merged=self.sharded)

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name, "nBuckets": self.options.n_buckets, "bucketBy": self.options.bucket_by,
            "eventsMerged": self.events_merged,
            "mergeQueue": len(self.merge), "replays": self.replays, "stageRunsInProcesses": self.shaper.runs_sent,
            "memory": self.memory(),
            "error": str(self.error) if self.error else None,
            "shards": [{"shard": s, "host": r.stats.host, "lastTs": r.stats.last_ts,
                        "lagSeconds": max(0.0, time.time() - r.stats.last_ts.time) if r.stats.last_ts.time else None,
                        "entriesRead": r.stats.entries,
                        "events": r.stats.events, "bufferBytes": r.buffered,
                        "bufferLimitBytes": self.shard_budgets[s].limit, "noops": r.stats.noops,
                        "reconnects": r.stats.reconnects, "connected": r.stats.connected,
                        "lastError": r.stats.last_error or None,
                        "lastErrorAt": (datetime.fromtimestamp(r.stats.last_error_at, UTC)
                                        if r.stats.last_error else None),
                        "readerProcess": r.elsewhere.index if r.elsewhere is not None else None,
                        "noopFallback": r.stats.noop_unavailable or None} for s, r in self.readers.items()],
            "topology": self.watcher.status() if self.watcher is not None else None,
            "buckets": [{"bucket": i, "depth": b.depth(), "retained": b.retained, "bytes": b.budget.used,
                         "limitBytes": b.budget.limit, "dealt": b.dealt_total, "delivered": b.delivered_total,
                         "cursors": len(b.cursors), "error": str(b.error) if b.error else None,
                         "consumerPosition": max((c.last_token for c in b.cursors), default=None,
                                                 key=lambda t: t.get("_data", "") if t else ""),
                         **_lag_status(b)}
                        for i, b in sorted(self.buckets.items())],
        }


def _lag_status(bucket: Bucket) -> dict[str, Any]:
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
    return {"state": lag.state(bool(bucket.awaiting)),
            "clusterTime": at_ts, "mergeClusterTime": merge_ts,
            "behindSeconds": max(0, merge_ts.time - at_ts.time) if at_ts and merge_ts else 0,
            "droppedEvents": lag.dropped_events, "droppedBytes": lag.dropped_bytes,
            "fellBehind": lag.fell_behind, "droppedTotal": lag.dropped_total}


def _key_time(key: bytes) -> Timestamp | None:
    """The cluster time of a sort key (None for the empty key of a bucket that has seen none)."""
    if not key:
        return None
    with contextlib.suppress(Exception):  # a key cut below an event (start_point) may not decode
        return decode_token(token_from_key(key)).cluster_time
    return None


def _fit(shaped: list[tuple[int, ChangeEvent]],
         oversize: Callable[[bytes], MongoError | Literal[True] | None]) -> tuple[list[EventFields], int | None]:
    """The longest head of the shaped events within a reply's batch limit (at least one), and how
    many of the taken events it consumed (None: all of them). Lookups and stages grow events after
    the batch was cut; what does not fit is returned by the next getMore. An event grown past
    what a server can return (a document looked up beside a large update) ends the head; the
    getMore that reaches it fails with BSONObjectTooLarge, as the server's does, or, with the
    split stage, returns it alone, to be split."""
    size = 0
    for k, (_, ev) in enumerate(shaped):
        size += len(ev.raw) + BATCH_ELEMENT_OVERHEAD
        if k and size > BATCH_BYTES_LIMIT:
            return [e for _, e in shaped[:k]], shaped[k][0]
        if len(ev.raw) > MEASURE_ABOVE_BYTES and (big := oversize(ev.raw)) is not None:
            if k:
                return [e for _, e in shaped[:k]], shaped[k][0]
            if big is not SPLIT:
                raise big
            return [ev], shaped[1][0] if len(shaped) > 1 else None
    return [e for _, e in shaped], None


def _interrupted() -> MongoError:
    """What a getMore whose cursor was killed under it fails with, as mongos's does."""
    return MongoError("CursorKilled", "operation was interrupted")


def _first_leaf(group: BaseExceptionGroup[Any]) -> Exception:
    first = group.exceptions[0]
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    assert isinstance(first, Exception)
    return first


def _in_scope(ev: EventFields, scope: tuple[str, str | None]) -> bool:
    """buildOperationFilter (change_stream_filter_helpers.cpp): an event of a namespace the stream
    watches (a rename by its source or its target, `o.to`); dropDatabase on a database stream
    only ("Omit dropDatabase on single-collection streams")."""
    db, coll = scope
    if coll is None:
        return bool(ev[EV_DB] == db) or any(ns.partition(".")[0] == db for ns in ev[EV_NAMESPACES])
    return f"{db}.{coll}" in ev[EV_NAMESPACES]


def _invalidates(ev: EventFields, scope: tuple[str, str | None]) -> bool:
    """isInvalidatingCommand: drop/rename end a collection stream; dropDatabase a database stream."""
    op_type = ev[EV_OP_TYPE]
    if scope[1] is None:
        return bool(op_type == "dropDatabase")
    return bool(op_type in ("drop", "rename"))


def _event_matches(ev: EventFields, match: dict[str, Any]) -> bool:
    from mongoformats.mql import matches

    return matches(bson.decode(ev[EV_RAW], PLAIN), match)


def start_point(token: Mapping[str, Any]) -> tuple[Timestamp, bytes]:
    """Where a stream resumed from `token` starts: the token's time, and the bucket floor (the
    events above it are dealt). For a fragment's token the floor is just below its event, which
    is dealt again to be split: a KeyString ends with its end byte (4), so the event's key less
    that byte sorts below the event's and above every key below it, which differs earlier or goes
    on with a type byte (all above 4)."""
    data = decode_token(token)
    fragment = fragment_of(data)
    return data.cluster_time, fragment[0][:-1] if fragment is not None else token_sort_key(token)
