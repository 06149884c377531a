"""Reading one shard: an OplogTail (buckets/oplog_tail.py) reads and transforms, a ShardReader
feeds the merge.

Strategy: a tailable awaitData `find` from the start timestamp, then one exhaust getMore whose
batches the member streams unasked, as replication's oplog fetcher reads (the next batch is made
while this one is spliced, no round trip between them; a member that does not stream answers
each getMore once, and the tail asks again). On a secondary when one is up (the primary's load
is the user's), with majority read concern: the oplog is then read only up to the set's commit
point, so no event is ever for a write that a failover rolls back, and every member returns the
same bytes up to there, so a tail that loses its member resumes from its position on another one
without a gap or a duplicate. Each batch of entries (BATCH_ENTRIES a getMore) is transformed
(raw BSON in, raw BSON events out) and sent as one `ShardBatch` carrying the shard's new mark:
"the oplog is read through ts T, so nothing at or before T can follow". The batch's bytes are
charged to the shard's ByteBudget before it is sent, so a slow merge stops the tail (no batch is
read while the budget is full, and the member's stream waits on TCP's window).

The two halves are split so the reading can leave the proxy's process (readerProcesses, see
buckets/reader_process.py): an `OplogTail` is picklable until it runs and talks to whatever
`TailOutput` it is given. In the proxy process that is its ShardReader itself; in a reader
process it is the pipe back to the ShardReader, which stays in the proxy process with the
budget, the statistics and the notes that move idle shards on.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from bson import Timestamp

from buckets._columnar.items import count_events, hold_blocks
from buckets.budget import BudgetHold, ByteBudget
from buckets.oplog_tail import (
    FIRST_BATCH_ENTRIES,
    OplogTail,
)
from buckets.ports import Connection
from mongoformats.errors import ConnectionLost, MongoError, has_category
from mongoformats.resume_token import high_water_mark, token_sort_key

log = logging.getLogger("buckets.reader")

# A wants_progress interval this short means events wait on the shard's mark: its notes then
# follow demand (one written and not yet read back at a time), not a timer.
URGENT_NOTE_S = 0.02
PARKED_S = 0.005  # a reader in a getMore this long has read its shard's oplog to the end
# Notes on one shard at most this often. One note lets every waiting event go when the shard's
# clock has passed their cluster time; a shard whose clock lags theirs (clocks move on by
# gossip, src/mongo/db/vector_clock.h) writes its note below them, and the next one only one
# increment higher, until its clock's second catches up: this caps what that costs.
NOTE_SPACING_S = 0.005
# A note written and not read back this long is given up on (lost in a failover, or its entry
# sorts below the events that wait): another may be written.
NOTE_PATIENCE_S = 0.5
# The weight of a batch's gap in the average spacing of a shard's writes: the last few count.
_GAP_WEIGHT = 0.25
NOOP_NOTE = {"msg": "parallelChangeStream: advance the high-water mark of an idle shard"}


def _mark_layout() -> tuple[bytes, bytes]:
    """The bytes of a high-water-mark key before and after its timestamp's 8 big-endian bytes.

    Every key a reader delivers is one of these, one a batch: made from the two constant ends,
    not encoded value by value (`high_water_mark`), for a live tail's one-entry batches. The ends
    are taken from the encoder itself, and checked against it for a second timestamp."""
    probe = struct.pack(">II", 0x01020304, 0x05060708)
    key = token_sort_key(high_water_mark(Timestamp(0x01020304, 0x05060708)))
    head, found, tail = key.partition(probe)
    other = Timestamp(0x7FFFFFF0, 9)
    if not found or token_sort_key(high_water_mark(other)) != head + _ts_bytes(other) + tail:
        raise AssertionError("a high-water mark's key is not its timestamp between constant ends")
    return head, tail


def _ts_bytes(ts: Timestamp) -> bytes:
    return struct.pack(">II", ts.time, ts.inc)


_MARK_HEAD, _MARK_TAIL = _mark_layout()
_MAX_INC = 0xFFFFFFFF


def mark_after(ts: Timestamp) -> bytes:
    """The merge key just above every event at `ts`: the high-water mark of the next tick."""
    if ts.inc >= _MAX_INC:  # (the next tick is the next second's: the encoder says what it is)
        return token_sort_key(high_water_mark(Timestamp(ts.time, ts.inc + 1)))
    return _MARK_HEAD + struct.pack(">II", ts.time, ts.inc + 1) + _MARK_TAIL


@dataclass(slots=True)
class ShardBatch:
    shard: str
    events: list[Any]  # plain tuples (see EventFields) and EventBlocks (runs of events as columns)
    mark: bytes
    nbytes: int


@dataclass
class ShardStats:
    host: str = ""
    last_ts: Timestamp = field(default_factory=lambda: Timestamp(0, 0))
    entries: int = 0
    events: int = 0
    batches: int = 0
    noops: int = 0
    reconnects: int = 0
    noop_unavailable: str = ""
    connected: bool = (
        False  # reading from a member now (False until the first connect, and while lost)
    )
    last_error: str = ""  # why the reader last lost its member, or could not reach one
    last_error_at: float = 0.0  # wall-clock time of that


class ReadsElsewhere(Protocol):
    """Runs a ShardReader's tail somewhere else (a reader process) and reports to the reader."""

    index: int  # which of the stream's reader processes (for status)

    async def read(self, reader: ShardReader) -> None: ...


class ShardReader:
    """One shard's input to the merge, in the proxy process: charges each batch to the shard's
    budget and sends it on, and writes a note when the merge waits on this shard while it is idle.

    Its tail runs here (the reader is its TailOutput) or, with readerProcesses, in a reader
    process (`elsewhere`) that reports to the same methods.
    """

    def __init__(
        self, tail: OplogTail, *, budget: ByteBudget, elsewhere: ReadsElsewhere | None = None
    ) -> None:
        self.tail = tail
        self.shard_id = tail.shard_id
        self.hosts = tail.hosts
        self.budget = budget
        self.elsewhere = elsewhere
        self.stats = ShardStats()
        # How often this shard's mark should be nudged while the merge or a consumer waits, or None.
        self.wants_progress: Callable[[str], float | None] = lambda shard: None
        # Called when the shard's budget is full: the buckets let go of the blocks they point into.
        self.relieve: Callable[[], None] = lambda: None
        self._wants = 0  # the bytes of the last batch charged or waiting to be
        # Taken from the budget for the reader process running this tail, and not sent yet.
        self.granted = 0
        self._send: trio.MemorySendChannel[ShardBatch] | None = None
        self._checked: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        self._last_noop = -1e9
        self._primary: Connection | None = None
        self._notes = trio.Lock()  # one note at a time on the primary connection
        self._nudged = trio.Event()
        self._parked_since: float | None = None  # while an awaitData getMore waits for entries
        self._parking = trio.Event()  # set when the tail parks or stops being parked
        self._parks = 0  # how many times it has parked
        # A note put off for a reply that had arrived (see _until_idle): owed at the next nudge.
        self._owed = False
        # Whether the shard counts as idle as soon as the tail parks (else once it has parked
        # PARKED_S): its last reply was short of a full batch (the oplog was read to its end)
        # and held a note, or came back empty, or the shard's own writes come further apart than
        # PARKED_S (see _count).
        self._short = False
        self._last_reply = -1e9  # when the last batch was read
        # The shard's own writes' spacing: an average of the gaps between batches that held no
        # note; up to PARKED_S, a nudged shard more likely moves its mark by its next write than
        # a note would, so none is written until it has parked PARKED_S.
        self._gap = 1.0
        # When the note not yet read back was written (None: none is), and set on each delivery:
        # the next reply after a note was written holds it, unless it was on its way already.
        self._note_sent: float | None = None
        self._read_on = trio.Event()
        # A reader process's batches that arrived and are not yet in the merge's channel (see
        # arrived).
        self._arrived: ShardBatch | None = None
        self._arrival = trio.Event()

    async def run(
        self, send: trio.MemorySendChannel[ShardBatch], checked: trio.Event | None = None
    ) -> None:
        """Read until cancelled. `checked` is set once the oplog is known to reach back to the
        start point, so that opening a stream fails at once (ChangeStreamHistoryLost) instead of
        at the first getMore."""
        self._send, self._checked = send, checked
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._answer_nudges)
                if self.elsewhere is None:
                    await self.tail.run(self)
                else:
                    nursery.start_soon(self._forward_arrivals)
                    await self.elsewhere.read(self)
                nursery.cancel_scope.cancel()
        finally:
            # Batches that arrived after the merge stopped taking them (a closed stream's): up to
            # the shard's budget, left to the rare full collections if the reader kept them.
            self._arrived = None
            await self._close_primary()

    # -- TailOutput --------------------------------------------------------------------------------

    async def deliver(
        self, events: list[Any], nbytes: int, entries: int, last_ts: Timestamp
    ) -> None:
        assert self._send is not None
        self._count(events, entries, last_ts)
        await self.reserve(nbytes)
        self._hold(events)
        await self._send.send(ShardBatch(self.shard_id, events, mark_after(last_ts), nbytes))

    def arrived(self, events: list[Any], nbytes: int, entries: int, last_ts: Timestamp) -> None:
        """A batch from the reader process that runs this tail: taken at once, never waited on.

        Why not `deliver`: one connection relays the batches of every stream the process reads,
        so a relay that waited for this stream's merge (a consumer that stopped reading) held up
        every other stream of the process. The wait is the reader process's instead: it sends
        only bytes the shard's budget took first (`reserve`, when they were granted), so what
        waits here is bounded by that budget. Batches that arrive while the merge is
        behind are joined into one, so the marks of event-less batches (the shard's noops) take
        no room either.
        """
        self._count(events, entries, last_ts)
        self.granted -= nbytes
        self._hold(events)  # (its bytes were taken when they were granted: `reserve`)
        held = self._arrived
        if held is None:
            self._arrived = ShardBatch(self.shard_id, events, mark_after(last_ts), nbytes)
            self._arrival.set()
        else:
            held.events += events
            held.nbytes += nbytes
            held.mark = mark_after(last_ts)

    async def _forward_arrivals(self) -> None:
        assert self._send is not None
        while True:
            await self._arrival.wait()
            self._arrival = trio.Event()
            batch, self._arrived = self._arrived, None
            if batch is not None:
                await self._send.send(batch)
            del (
                batch
            )  # not held while waiting: its blocks' charges return once nothing refers to them

    async def reserve(self, nbytes: int) -> None:
        """Take `nbytes` of the shard's budget (and of the proxy's memory pool), waiting until
        they fit: for a batch read here, or one a reader process asks to send."""
        self._wants = nbytes
        if self.starved:
            self.relieve()
        await self.budget.acquire(nbytes)

    @property
    def buffered(self) -> int:
        """Bytes read and not yet let go by the merge and the buckets (not those granted ahead)."""
        return self.budget.used - self.granted

    @property
    def starved(self) -> bool:
        """Whether a batch like the last one would not fit in the shard's budget, or in the
        memory pool, now: the tail waits (here, or in its reader process) until bytes return."""
        budget, wants = self.budget, self._wants
        if not budget.fits(wants):
            return True
        account = budget.account
        # The pool's room is at least what the account has set aside and does not use (asked of
        # every reader after every release): a batch within that fits without adding it up.
        if account is None or wants <= account.floor - account.in_hand - account.held:
            return False
        return budget.blocked_by_pool(wants)

    def _hold(self, events: list[Any]) -> None:
        """Each block's charge returns when the block is let go, not when the merge deals it: the
        buckets' shares point into it (EventBlock.take)."""
        hold_blocks(events, lambda nbytes: BudgetHold(self.budget, nbytes))

    def _count(self, events: list[Any], entries: int, last_ts: Timestamp) -> None:
        now = trio.current_time()
        noted = self._note_sent is not None  # (the reply holds the note, unless it was late)
        if not noted:
            self._gap += (min(now - self._last_reply, 1.0) - self._gap) * _GAP_WEIGHT
        self._last_reply = now
        # Both the find's and the getMores' batches are at least FIRST_BATCH_ENTRIES long.
        self._short = entries < FIRST_BATCH_ENTRIES and (noted or self._gap >= PARKED_S)
        self._took_reply()
        stats = self.stats
        stats.entries += entries
        stats.events += count_events(events)
        stats.batches += 1
        stats.last_ts = last_ts

    async def checked(self) -> None:
        if self._checked is not None:
            self._checked.set()

    async def parked(self, waiting: bool) -> None:
        self._parked_since = trio.current_time() if waiting else None
        self._parks += waiting
        self._parking.set()
        self._parking = trio.Event()

    async def idle(self) -> None:
        self._short = True  # (a note written may still be on its way: not "read back")
        if (
            interval := self.wants_progress(self.shard_id)
        ) is not None and self._nursery is not None:
            self._nursery.start_soon(self._advance_idle_shard, interval)

    def _took_reply(self) -> None:
        """A batch was read: it holds the note written, if one was. Nudges until now are
        answered by it: the merge takes this batch after this and nudges again if it must."""
        self._note_sent = None
        self._owed = False
        if self._nudged.is_set():  # (none waits on a set event: it may be replaced)
            self._nudged = trio.Event()
        self._read_on.set()
        self._read_on = trio.Event()

    async def connected(self, host: str, reconnects: int) -> None:
        self.stats.host, self.stats.reconnects, self.stats.connected = host, reconnects, True

    async def lost(self, error: str, reconnects: int) -> None:
        stats = self.stats
        stats.connected, stats.reconnects, stats.last_error, stats.last_error_at = (
            False,
            reconnects,
            error,
            time.time(),
        )

    # -- notes -------------------------------------------------------------------------------------

    def nudge(self) -> None:
        """The merge holds events back on this shard's mark (a no-I/O call, for the pump)."""
        self._nudged.set()

    async def _answer_nudges(self) -> None:
        """Write a note as soon as pending events wait on this shard while it is idle, instead
        of when the tail's awaitData getMore times out (up to await_ms later).

        Notes follow demand, not a timer: the merge nudges after each release that leaves events
        waiting on this shard, and a note is written unless one written is still to be read back.
        The tail's next delivery holds that note, and the merge says once more whether events
        still wait (those that came after the note was written). So an event waits for at most
        two notes' round trips, and a shard gets at most one note per round trip (and per
        NOTE_SPACING_S), only while events wait on it. A tail that is reading moves its mark
        by itself: it counts as idle once its getMore has waited PARKED_S, so a catch-up writes
        no notes, and at once after a short reply if that held a note or the shard's own writes
        come further apart than PARKED_S: a shard written faster moves its mark by its next
        write sooner than a note would, and is noted only if that write does not come. Nothing
        here polls: the waits end on nudges, the tail's parking and deliveries, or one timer."""
        while True:
            await self._nudged.wait()
            self._nudged = trio.Event()
            if not await self._until_idle():
                continue
            if (
                sent := self._note_sent
            ) is not None and trio.current_time() - sent < NOTE_PATIENCE_S:
                with trio.move_on_at(sent + NOTE_PATIENCE_S):
                    await self._read_on.wait()
                if self._note_sent is None:
                    continue  # read back: the merge nudges again if events still wait
            if (wait := self._last_noop + NOTE_SPACING_S - trio.current_time()) > 0:
                await trio.sleep(wait)
            if not await self._write_note() and not self.stats.noop_unavailable:
                await trio.sleep(URGENT_NOTE_S)  # the primary was not reached: try again soon
                self._nudged.set()

    def _urgent(self) -> bool:
        interval = self.wants_progress(self.shard_id)
        return interval is not None and interval <= URGENT_NOTE_S

    async def _until_idle(self) -> bool:
        """Wait until the tail has read the shard's oplog to its end; False if meanwhile no
        events wait on it any more, or a batch it had received when it got there was delivered
        (a note would come after that batch)."""
        while self._urgent():
            parked = self._parked_since
            if parked is None:
                await self._parking.wait()
            elif (
                self._short or self._owed or (left := parked + PARKED_S - trio.current_time()) <= 0
            ):
                # A note's entry would come after the reply that has arrived, which may move the
                # mark past the waiting events by itself. Once it is delivered, the merge nudges
                # again if they still wait: the note is written at once then.
                if self.tail.reply_arrived() and await self._delivered_next():
                    self._owed = True
                    return False
                return True
            else:
                with trio.move_on_after(left):
                    await self._parking.wait()
        return False

    async def _delivered_next(self) -> bool:
        """The tail's next reply has arrived: wait until the tail has taken it and parks again;
        whether it delivered a batch (an empty reply moves no mark). Why: a note written now
        would come after that reply, and the reply moves the mark as soon."""
        batches, parks = self.stats.batches, self._parks
        while self._parks == parks:  # (it may take the reply and park again before this wakes)
            await self._parking.wait()
        return self.stats.batches != batches

    async def _advance_idle_shard(self, interval: float) -> None:
        """An awaitData getMore came back empty: write a note if the merge or a consumer waits on
        this shard's mark, at most one per `interval` (events that wait are noted at once by
        _answer_nudges; this is its fallback, and the lazy pace of a waiting consumer)."""
        if trio.current_time() - self._last_noop >= interval:
            await self._write_note()

    async def _write_note(self) -> bool:
        """Write a noop so this idle shard's mark moves past events other shards are holding.

        Real servers only write their periodic noop every 10 s, which is the cold-shard latency
        this avoids. Without the appendOplogNote privilege we fall back to waiting for periodic
        noops and say so in status.
        """
        async with self._notes:  # empty replies and nudges both write notes
            if self.stats.noop_unavailable:
                return False
            self._last_noop = self._note_sent = trio.current_time()
            self._owed = False
            try:
                if (
                    self._primary is None
                ):  # notes are writes: they go to the primary, not the member read
                    self._primary = await self.tail.connect_member(self.hosts, secondary=False)
                await self._primary.command("admin", {"appendOplogNote": 1, "data": NOOP_NOTE})
                self.stats.noops += 1
                return True
            except (ConnectionLost, MongoError) as exc:
                self._note_sent = None
                if isinstance(exc, MongoError) and not has_category(exc.code, "RetriableError"):
                    self.stats.noop_unavailable = f"{exc.code_name}: {exc.errmsg}"
                await self._close_primary()  # elections: find the primary again next time
                return False

    async def _close_primary(self) -> None:
        if self._primary is not None:
            await self._primary.aclose()
            self._primary = None
