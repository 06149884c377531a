"""ShardReader: tails one shard's `local.oplog.rs` and hands events plus high-water marks to the merge.

Strategy: a tailable awaitData `find` from the start timestamp, then getMore forever, on a
secondary when one is up (the primary's load is the user's), with majority read concern: the
oplog is then read only up to the set's commit point, so no event is ever for a write that a
failover rolls back, and every member returns the same bytes up to there, so a reader that loses
its member resumes from its position on another one without a gap or a duplicate. Each batch
is transformed (raw BSON in, raw BSON events out) and sent as one `ShardBatch` carrying the
shard's new mark: "the oplog is read through ts T, so nothing at or before T can follow". The
batch's bytes are charged to the shard's ByteBudget before it is sent, so a slow merge stops the
reader (no getMore is issued while the budget is full).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio
from bson import Int64, Timestamp

from buckets.budget import ByteBudget
from mongoformats.change_events import ChangeEvent, OplogTransformer
from mongoformats.errors import MongoError, has_category
from mongoformats.oplog_splice import cursor_batch, splice_entries, splice_reply, timestamp_of
from mongoformats.resume_token import high_water_mark, token_sort_key
from wireproxy.upstream import UpstreamClosed, UpstreamConnection, open_member

log = logging.getLogger("buckets.reader")

_SECONDARY_OK = {"mode": "secondaryPreferred"}
URGENT_NOTE_S = 0.02  # at most one note this often while events wait on an idle shard
PARKED_S = 0.005     # a reader in a getMore this long has read its shard's oplog to the end
MAX_NUDGE_POLL_S = 0.05  # how often a held-back merge checks a busy reader for having gone idle
INLINE_CHUNK = 1024  # oplog entries spliced between two checkpoints without readerProcesses (~6 ms)
# With readerProcesses a reply is one job for a worker: 4096 entries (~25 ms of splicing) keep
# the readers, the workers and the merge overlapping, where a 16 MiB reply (~50k entries) held a
# worker ~0.4 s while the merge waited for it (bench_engine, 400k events: 89k -> 108k events/s).
OFFLOAD_BATCH = 4096
NOOP_NOTE = {"msg": "parallelChangeStream: advance the high-water mark of an idle shard"}


class ConnectMember(Protocol):
    """Opens a connection to a replica set member (open_member, with the proxy's TLS settings)."""

    def __call__(self, hosts: list[tuple[str, int]], *, secondary: bool) -> Awaitable[UpstreamConnection]: ...


async def _inline(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def mark_after(ts: Timestamp) -> bytes:
    """The merge key just above every event at `ts`: the high-water mark of the next tick."""
    return token_sort_key(high_water_mark(Timestamp(ts.time, ts.inc + 1)))


@dataclass(slots=True)
class ShardBatch:
    shard: str
    events: list[ChangeEvent]
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


class ShardReader:
    def __init__(self, shard_id: str, hosts: list[tuple[str, int]], *, start: Timestamp, skip_key: bytes,
                 transformer: OplogTransformer, budget: ByteBudget, await_ms: int = 200,
                 batch_size: int = 0, connect_member: ConnectMember = open_member) -> None:
        self.shard_id = shard_id
        self.hosts = hosts
        self.connect_member = connect_member
        self.position = start          # next read starts at ts >= position (inclusive at first)
        self.inclusive = True
        self.skip_key = skip_key       # events at or below this key were delivered before
        self.transformer = transformer
        self.budget = budget
        self.await_ms = await_ms
        self.batch_size = batch_size
        self.stats = ShardStats()
        # Asked after an empty getMore: does this shard hold the merge (or a waiting consumer) back?
        # Asked after an empty getMore: how often this shard's mark should be nudged, or None.
        self.wants_progress: Callable[[str], float | None] = lambda shard: None
        # Runs splice_reply: inline by default; a worker-process pool's run_sync with readerProcesses.
        self.offload: Callable[..., Awaitable[Any]] = _inline
        self._last_noop = -1e9
        self._primary: UpstreamConnection | None = None
        self._notes = trio.Lock()              # one note at a time on the primary connection
        self._nudged = trio.Event()
        self._parked_since: float | None = None  # while an awaitData getMore waits for entries

    async def _connect(self) -> UpstreamConnection:
        conn = await self.connect_member(self.hosts, secondary=True)
        self.stats.host = conn.address
        return conn

    async def check_history(self, conn: UpstreamConnection) -> None:
        """Fail like the server if the oplog no longer reaches back to the start point."""
        reply = await conn.command("local", {"find": "oplog.rs", "filter": {}, "sort": {"$natural": 1},
                                             "limit": 1, "singleBatch": True, "$readPreference": _SECONDARY_OK})
        first = reply["cursor"]["firstBatch"]
        if not first:
            return
        entry = first[0]
        ts = entry["ts"]
        starts_set = entry["op"] == "n" and entry["o"].get("msg") in ("initiating set", "new primary")
        if (ts.time, ts.inc) > (self.position.time, self.position.inc) and not starts_set:
            raise MongoError("ChangeStreamHistoryLost",
                             f"Resume of change stream was not possible, as the resume point may no longer be "
                             f"in the oplog of shard {self.shard_id} (its oldest entry is {ts})")

    async def run(self, send: trio.MemorySendChannel[ShardBatch], checked: trio.Event | None = None) -> None:
        """Read until cancelled; reconnect and resume from the last position on network errors.

        `checked` is set once the oplog is known to reach back to the start point, so that opening
        a stream fails at once (ChangeStreamHistoryLost) instead of at the first getMore.
        """
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._answer_nudges)
                await self._read_forever(send, checked)
        finally:
            await self._close_primary()

    def nudge(self) -> None:
        """The merge holds events back on this shard's mark (a no-I/O call, for the pump)."""
        self._nudged.set()

    async def _answer_nudges(self) -> None:
        """Write a note as soon as pending events wait on this shard while it is idle, instead
        of when the reader's awaitData getMore times out (up to await_ms later).

        Idle means the reader has sat in a getMore for PARKED_S: a reader that is reading moves
        its mark by itself, so a catch-up writes no notes. Polls only while the merge is held
        back: every PARKED_S, backing off to MAX_NUDGE_POLL_S while the reader is busy (a long
        catch-up, or a reader stopped by a full buffer)."""
        while True:
            await self._nudged.wait()
            self._nudged = trio.Event()
            poll = PARKED_S
            while (interval := self.wants_progress(self.shard_id)) is not None and interval <= URGENT_NOTE_S:
                parked = self._parked_since
                if parked is not None and trio.current_time() - parked >= PARKED_S:
                    await self._advance_idle_shard(interval)
                    poll = PARKED_S
                else:
                    poll = min(poll * 2, MAX_NUDGE_POLL_S)
                await trio.sleep(poll)

    async def _read_forever(self, send: trio.MemorySendChannel[ShardBatch], checked: trio.Event | None) -> None:
        first_connect = True
        while True:
            try:
                conn = await self._connect()
            except UpstreamClosed:
                self.stats.reconnects += 1
                await trio.sleep(0.2)
                continue
            try:
                if first_connect:
                    await self.check_history(conn)
                    first_connect = False
                    if checked is not None:
                        checked.set()
                await self._tail(conn, send)
            except UpstreamClosed as exc:
                log.warning("shard %s: %s; resuming from %s", self.shard_id, exc, self.position)
                self.stats.reconnects += 1
                await trio.sleep(0.05)
            except MongoError as exc:
                if exc.code == 136:  # CappedPositionLost
                    raise MongoError("ChangeStreamHistoryLost", f"shard {self.shard_id}: oplog truncated past "
                                     f"the read position {self.position}") from exc
                if exc.code != 43 and not has_category(exc.code, "RetriableError"):
                    raise
                # Cursor lost, member stepped down, shutting down or recovering: another member.
                log.warning("shard %s: %s; resuming from %s", self.shard_id, exc, self.position)
                self.stats.reconnects += 1
                await trio.sleep(0.05)
            finally:
                await conn.aclose()

    async def _tail(self, conn: UpstreamConnection, send: trio.MemorySendChannel[ShardBatch]) -> None:
        # Replies stay raw bytes: entries are sliced out of the reply and spliced into events,
        # here or in a worker process (readerProcesses), by the same pure function.
        op = "$gte" if self.inclusive else "$gt"
        reply = await conn.command("local", self._batched({
            "find": "oplog.rs", "filter": {"ts": {op: self.position}}, "tailable": True, "awaitData": True,
            "readConcern": {"level": "majority"}, "$readPreference": _SECONDARY_OK}))
        splice = self.transformer.token_version == 2
        expanded = self.transformer.show_expanded_events
        while True:
            if self.offload is _inline:
                # In this process: a catch-up reply holds up to 16 MiB (~50k entries), a third of
                # a second of splicing. Spliced and sent on in chunks, every chunk a checkpoint, so
                # other connections are served meanwhile and the merge starts on the first chunk.
                cursor_id, entries = cursor_batch(bytes(reply.raw))
                for i in range(0, len(entries), INLINE_CHUNK):
                    chunk = entries[i:i + INLINE_CHUNK]
                    await self._deliver(splice_entries(chunk, splice, expanded), timestamp_of(chunk[-1]), send)
                progressed = bool(entries)
            else:
                cursor_id, last, items = await self.offload(splice_reply, bytes(reply.raw), splice, expanded)
                if last is not None:
                    await self._deliver(items, Timestamp(*last), send)
                progressed = last is not None
            if not progressed and (interval := self.wants_progress(self.shard_id)) is not None:
                await self._advance_idle_shard(interval)
            if not cursor_id:
                return
            self._parked_since = trio.current_time()
            try:
                reply = await conn.command("local", self._batched({
                    "getMore": Int64(cursor_id), "collection": "oplog.rs", "maxTimeMS": self.await_ms}))
            finally:
                self._parked_since = None

    def _batched(self, cmd: dict[str, Any]) -> dict[str, Any]:
        if self.batch_size:
            cmd["batchSize"] = self.batch_size
        return cmd

    async def _deliver(self, items: list[Any], last_ts: Timestamp, send: trio.MemorySendChannel[ShardBatch]) -> None:
        transform = self.transformer.transform_decoded
        events: list[ChangeEvent] = []
        skip = self.skip_key
        nbytes = 0
        for item in items:
            if type(item) is bytes:  # the general path: transactions, DDL, noops, rare shapes
                for ev in transform(item):
                    if ev.sort_key > skip:
                        events.append(ev)
                        nbytes += len(ev.raw)
            elif item and item[0] > skip:
                events.append(ChangeEvent._make(item))
                nbytes += len(item[5])
        self.stats.entries += len(items)
        self.stats.events += len(events)
        self.stats.batches += 1
        self.stats.last_ts = last_ts
        await self.budget.acquire(nbytes)
        await send.send(ShardBatch(self.shard_id, events, mark_after(last_ts), nbytes))
        self.position, self.inclusive = last_ts, False

    async def _advance_idle_shard(self, interval: float) -> None:
        """Write a noop so this idle shard's mark moves past events other shards are holding.

        At most one note per `interval`; real servers only write their periodic noop every 10 s,
        which is the cold-shard latency this avoids. Without the appendOplogNote privilege we fall
        back to waiting for periodic noops and say so in status.
        """
        async with self._notes:  # the reader's own loop and nudges both write notes
            now = trio.current_time()
            if self.stats.noop_unavailable or now - self._last_noop < interval:
                return
            self._last_noop = now
            try:
                if self._primary is None:  # notes are writes: they go to the primary, not the member read
                    self._primary = await self.connect_member(self.hosts, secondary=False)
                await self._primary.command("admin", {"appendOplogNote": 1, "data": NOOP_NOTE})
                self.stats.noops += 1
            except (UpstreamClosed, MongoError) as exc:
                if isinstance(exc, MongoError) and not has_category(exc.code, "RetriableError"):
                    self.stats.noop_unavailable = f"{exc.code_name}: {exc.errmsg}"
                await self._close_primary()  # elections: find the primary again next time

    async def _close_primary(self) -> None:
        if self._primary is not None:
            await self._primary.aclose()
            self._primary = None
