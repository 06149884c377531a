"""A cursor on one bucket: getMore semantics, lookups and stages, large-event splitting and the
resume-point check."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio
from bson import Timestamp

from buckets.bucket import Bucket
from buckets.event_run import EventRun, count_events, fields_of, plain_runs, raw_of
from buckets.reply import cut_reply, fit_shaped, splits
from buckets.stream import ParallelStream
from mongoformats.change_events import (
    EVENT_SORT_KEY,
    ChangeEvent,
    EventFields,
    event_token,
    events_from_fields,
)
from mongoformats.errors import MongoError
from mongoformats.large_events import MEASURE_ABOVE_BYTES, split_event
from mongoformats.resume_token import (
    decode_token,
    fragment_of,
    token_sort_key,
    token_text,
)
from mongoformats.wire import BATCH_BYTES_LIMIT, BATCH_ELEMENT_OVERHEAD

# A getMore that waits returns as soon as events come, and for a moved resume point alone only
# once it has waited this long: while a stream is written to, the merge's frontier moves at
# every release, and a reply per move to every bucket that got no event from it would be an
# empty round trip each (mongos's merger too returns a sorted tailable cursor's batch only once
# an event may go, async_results_merger.cpp `_readySortedTailable`). An idle bucket's resume
# point moves about once a second (stream.py IDLE_PROGRESS_S): it is still returned promptly.
RESUME_POINT_HOLD_S = 0.05


@dataclass(eq=False)
class BucketCursor:
    cursor_id: int
    stream: ParallelStream
    bucket: Bucket
    position: int
    owner: bytes  # the id of the session it was opened in (b"": none)
    ns: str
    batch_size: int | None = None
    user: str = ""  # who opened it, when the proxy requires authentication
    last_used: float = 0.0  # trio time of its creation or last getMore (idle cursors are killed)
    busy: bool = False  # a getMore is running on it
    read: bool = False  # a getMore has come for it (until then it pins no retention)
    # Where the consumer has surely been: the start of the last batch handed out. A consumer that
    # stops inside a batch (a Spark task reading up to its end token, which then kills the
    # cursor) resumes from a token in that batch, so the batch must outlive the cursor; freeing
    # up to `position` made the next micro-batch fall back to re-reading the oplogs.
    acked: int = -1

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

    def __post_init__(self) -> None:
        self.acked = self.position

    def stale(self) -> bool:
        """Whether what follows this cursor is no longer in its bucket: the bucket fell behind
        and the cursor has read what it holds, or the bucket rejoined past the cursor."""
        return self.lost or (
            self.bucket.lag.behind
            and self.position >= self.bucket.end
            and not self.split_rest
            and not self.fragments_sent
        )

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
        if named is None or not self._may_leave_replay():
            return
        if named.closed or named.error is not None:
            self.join = None  # torn down or failed: the replay stream goes on alone
            return
        target = named.buckets[self.bucket.index]
        target.rejoin_if_awaited()
        if target.position_after(start_point(self.last_token)[1]) is None:
            return  # the named bucket starts after this point, or is behind: read the replay
        self._move_to(named, target)

    def _may_leave_replay(self) -> bool:
        """Whether this cursor is in a state the named stream's bucket can take over: live, not
        inside a split event, past the resume token."""
        return not (
            self.killed or self.split_rest or self.fragments_sent or self.must_meet is not None
        )

    def _move_to(self, named: ParallelStream, target: Bucket) -> None:
        """Read from the named stream's bucket `target` from here on."""
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
        shaped = await self.stream.shaper.shape(
            [ev.raw for ev in batch], [ev.token for ev in batch]
        )
        return [
            (i, ev._replace(raw=raw))
            for i, (ev, raw) in enumerate(zip(batch, shaped, strict=True))
            if raw is not None
        ]

    async def next_batch(
        self, batch_size: int | None, max_time_ms: int | None, *, first: bool = False
    ) -> tuple[list[EventRun], dict[str, Any]]:
        """The next reply's events (as runs) and its postBatchResumeToken."""
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
        bucket.read_once = True
        if not first:
            await self._wait(max_time_ms)
        if not self._readable():
            return [], self.last_token  # the engine moves it to a replay of what follows
        if self.split_rest:  # mid-split: the fragments as they were cut, nothing read again
            event = bucket.event_at(self.position)
            batch, taken = self._fragments(event, plain_runs([event]))
        else:
            batch, taken = await self._read(limit)
        self._advance(batch, taken)
        return batch, self.last_token

    def _waits(self) -> bool:
        """Whether a getMore waits for events: none to read, and nothing ended or failed."""
        bucket, stream = self.bucket, self.stream
        return (
            self.position >= bucket.end
            and stream.error is None
            and not stream.ended
            and not self.killed
            and bucket.error is None
            and not self.stale()
        )

    async def _wait(self, max_time_ms: int | None) -> None:
        """Wait (up to maxTimeMS, or the stream's default) for events to read, an advanced resume
        point, or an end; CursorKilled if the cursor is killed meanwhile."""
        bucket = self.bucket
        bucket.notify()
        deadline = (
            trio.current_time()
            + (max_time_ms if max_time_ms is not None else self.stream.options.max_await_ms) / 1000
        )
        hold_until = trio.current_time() + RESUME_POINT_HOLD_S
        bucket.waiting += 1
        try:
            # One cancel scope for the whole wait (a live tail's merge wakes every waiting
            # getMore each round): its deadline comes nearer once the resume point has moved.
            with trio.move_on_at(deadline) as scope:
                while self._waits():
                    await bucket.changed.wait()
                    self._settle()
                    if self.position >= bucket.end and bucket.frontier > self.last_key:
                        if trio.current_time() >= hold_until:
                            break  # an idle bucket still returns the moved resume point promptly
                        scope.deadline = min(deadline, hold_until)
        finally:
            bucket.waiting -= 1
        if self.killed:
            raise _interrupted()

    def _readable(self) -> bool:
        """Raise the stream's or the bucket's error, or ChangeStreamHistoryLost; False if what
        follows this cursor is no longer in its bucket (stale)."""
        bucket = self.bucket
        # A new object at each raise: the kept one never gathers the frames it passes.
        if (error := self.stream.error) is not None:
            raise error.copied() if isinstance(error, MongoError) else error
        if bucket.error is not None and self.position >= bucket.end:
            raise bucket.error.copied()
        if self.stale():
            return False
        if self.position < bucket.base:
            raise MongoError(
                "ChangeStreamHistoryLost", "bucket history was dropped before this cursor read it"
            )
        return True

    def _advance(self, batch: list[EventRun], taken: list[EventRun]) -> None:
        """Move past the `taken` events once `batch` is the reply, and set the resume point."""
        bucket = self.bucket
        self.position += count_events(taken)
        bucket.delivered_total += count_events(batch)
        if batch:
            # The last event returned, as on a server: one a stage dropped is not a resume point
            # (a stream resumed from it would not meet it again). A drained bucket's frontier
            # moves it on below.
            self.last_key, self.last_token = batch[-1].last_key, batch[-1].last_token()
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

    async def _read(self, limit: int) -> tuple[list[EventRun], list[EventRun]]:
        """The next reply from the bucket's events at this cursor's position: (events to return,
        events consumed), after lookups, stages, the resume point and a split."""
        # Lookups and stages change events after this: the server measures what they make.
        shaped = self.stream.lookup is not None or bool(self.stream.options.stages)
        taken = cut_reply(
            self.bucket.items_from(self.position), limit, None if shaped else self.stream.sizer
        )
        batch = taken
        if shaped or self.must_meet is not None:
            events, taken = await self._checked(taken, shaped)
            batch = plain_runs(events)
        head = self._split_head(batch)
        if head is not None:
            return self._fragments(head, taken)
        return batch, taken

    def _split_head(self, batch: list[EventRun]) -> EventFields | None:
        """The reply's first event if it is returned in fragments (or already is being)."""
        if not batch:
            return None
        head = batch[0].sliced(0, 1)
        # Only an event over MEASURE_ABOVE_BYTES may split: the others are not made one by one.
        if not self.fragments_sent and head.nbytes <= MEASURE_ABOVE_BYTES:
            return None
        event = head.fields()[0]
        return event if self.fragments_sent or splits(event, self.stream.sizer) else None

    async def _checked(
        self, taken: list[EventRun], shaped: bool
    ) -> tuple[list[EventFields], list[EventRun]]:
        """The `taken` events after lookups and stages (if `shaped`) and the resume point check,
        one by one, and the taken events they consume."""
        batch = fields_of(taken)
        if shaped:
            # Before the position moves: a failed lookup fails this getMore and loses nothing.
            batch, consumed = fit_shaped(
                await self._shape(events_from_fields(batch)), self.stream.sizer
            )
            taken = plain_runs(fields_of(taken)[:consumed])
            if self.killed:  # while its lookups ran
                raise _interrupted()
        if self.must_meet is not None:
            batch = self._past_resume_point(batch)
        return batch, taken

    def _fragments(
        self, event: EventFields, taken: list[EventRun]
    ) -> tuple[list[EventRun], list[EventRun]]:
        """The reply for a split event that heads the batch: its next fragments, as many as fit
        (at least one), and the taken events it consumes (up to the event, and the event itself
        once its last fragment is out). The event is split on the first call and its fragments
        kept in `split_rest` for the getMores that follow. Resumed from a fragment, an event that
        now splits otherwise, or not at all, fails the stream as the server's does
        (ChangeStreamFatalError)."""
        pieces = self.split_rest or self._split(event)
        out: list[EventFields] = []
        size = 0
        for piece in pieces:
            size += len(raw_of(piece)) + BATCH_ELEMENT_OVERHEAD
            if out and size > BATCH_BYTES_LIMIT:
                break
            out.append(piece)
        consumed = fields_of(taken)
        key = EVENT_SORT_KEY(event)
        at = next(i for i, ev in enumerate(consumed) if EVENT_SORT_KEY(ev) == key)
        if len(out) < len(pieces):
            self.fragments_sent += len(out)
            self.split_rest = pieces[len(out) :]
            return plain_runs(out), plain_runs(consumed[:at])
        self.fragments_sent, self.split_rest = 0, []
        return plain_runs(out), plain_runs(consumed[: at + 1])

    def _split(self, event: EventFields) -> list[EventFields]:
        """`event`'s fragments from `fragments_sent` on, each with its fragment's token."""
        return [
            tuple(
                ChangeEvent._make(event)._replace(
                    sort_key=token_sort_key(token),
                    type_bits=bytes(token.get("_typeBits", b"")),
                    raw=raw,
                )
            )
            for token, raw in split_event(
                raw_of(event), merged=self.stream.sharded, skip=self.fragments_sent
            )
            or []
        ]

    def _past_resume_point(self, batch: list[EventFields]) -> list[EventFields]:
        """`batch` less the events up to the one resumed from; ChangeStreamFatalError if a later
        event comes first (the token's event was filtered out, or is in no such stream).
        Resumed from a fragment's token, the event stays, to be split again."""
        assert self.must_meet is not None
        for i, ev in enumerate(batch):
            key = EVENT_SORT_KEY(ev)
            if key == self.must_meet and self.fragments_sent and not self.met:
                self.met, self.must_meet = True, None
                return batch[i:]
            if key == self.must_meet:
                self.met = True
            elif key > self.must_meet:
                if not self.met:
                    raise MongoError(
                        "ChangeStreamFatalError",
                        "cannot resume stream; the resume token was not "
                        f"found. {token_text(event_token(ev))}",
                    )
                self.must_meet = None
                return batch[i:]
        return []


def _interrupted() -> MongoError:
    """What a getMore whose cursor was killed under it fails with, as mongos's does."""
    return MongoError("CursorKilled", "operation was interrupted")


def start_point(token: Mapping[str, Any]) -> tuple[Timestamp, bytes]:
    """Where a stream resumed from `token` starts: the token's time, and the bucket floor (the
    events above it are dealt). For a fragment's token the floor is just below its event, which
    is dealt again to be split: a KeyString ends with its end byte (4), so the event's key less
    that byte sorts below the event's and above every key below it, which differs earlier or goes
    on with a type byte (all above 4)."""
    data = decode_token(token)
    fragment = fragment_of(data)
    return data.cluster_time, fragment[0][:-1] if fragment is not None else token_sort_key(token)
