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

import contextlib
import functools
import heapq
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import trio
from bson import Timestamp

from buckets._columnar.items import as_runs
from buckets.bucket import Bucket, lag_status
from buckets.budget import ByteBudget
from buckets.deal import Dealer
from buckets.event_run import count_events, fields_of, plain_runs, with_shard
from buckets.lookup import DocumentLookup
from buckets.memory_limit import (
    BUCKET_FLOOR_BYTES,
    SHARD_FLOOR_BYTES,
    SHARD_IN_HAND_BYTES,
    MemoryPool,
    PoolAccount,
    shaping_processes,
)
from buckets.merge import MergedQueue
from buckets.oplog_tail import OplogTail
from buckets.ports import Connection, Connector, ConnectUpstream
from buckets.reader import URGENT_NOTE_S, ShardBatch, ShardReader, mark_after
from buckets.reader_process import ReaderHost, ReaderPool, reader_pool
from buckets.reply import EventSizer, Size
from buckets.shaping import Shaper
from buckets.topology import TOPOLOGY, Topology, TopologyWatcher
from mongoformats.change_events import OplogTransformer
from mongoformats.change_stages import Stages
from mongoformats.errors import MongoError
from mongoformats.resume_token import high_water_mark, token_from_key, token_sort_key

log = logging.getLogger("buckets.stream")

IDLE_PROGRESS_S = 1.0  # only a waiting consumer's resume point is behind: this often
_MERGED_AT_ONCE = 64  # shard batches the pump takes from its channel before a release


@dataclass(frozen=True)
class StreamOptions:
    n_buckets: int
    show_expanded_events: bool = False
    shard_buffer_bytes: int = 1 << 30  # per shard, as in the design (1 GiB)
    bucket_buffer_bytes: int = 64 << 20  # per bucket: pending plus retained events
    max_await_ms: int = 1000  # a getMore waits this long for events by default
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
    # With showExpandedEvents: migrateLastChunkFromShard, and create/createIndexes a migration
    # wrote.
    show_system_events: bool = False
    match: dict[str, Any] | None = None  # a $match on events, applied before bucketing
    # Accelerated $changeStream: ("db", "coll") for a collection stream, ("db", None) for a database
    # stream; events outside it are dropped and the invalidating event ends the stream.
    scope: tuple[str, str | None] | None = None
    full_document: str = "default"  # or "updateLookup": updates carry the current document
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
        """Recorded pre-images are read (for fullDocumentBeforeChange, or to compute
        post-images)."""
        return self.full_document_before_change != "off" or self.full_document in (
            "whenAvailable",
            "required",
        )


class ParallelStream:
    def __init__(
        self,
        name: str,
        options: StreamOptions,
        topology: Topology,
        start: Timestamp,
        floors: list[bytes],
        *,
        keep: set[int] | None = None,
        connect_upstream: ConnectUpstream | None = None,
        connect_member: Connector,
        readers_pool: ReaderPool | None = None,
        memory: MemoryPool | None = None,
        splice_limiter: trio.CapacityLimiter | None = None,
    ) -> None:
        self.name = name
        self._splice_limiter = splice_limiter  # large batches' splices in threads (None: none)
        self._memory = memory  # the proxy-wide pool the budgets also take their bytes from
        self._closing = False
        self._shaping = _shaping_account(options, memory)
        self._pool = readers_pool  # the engine's reader processes (None: the stream starts its own)
        self.options = options
        # mongos sizes events as its shards send them, with their sort key
        self.sharded = topology.sharded
        self.sizer = EventSizer(split=options.split_large_events, merged=self.sharded)
        self.start = start
        n = options.n_buckets
        self.keep = keep if keep is not None else set(range(n))
        self._hosts: list[ReaderHost] = []  # reader processes, with readerProcesses
        # The stages, over as many processes.
        self.shaper = Shaper(options.stages, options.reader_processes)
        self._connect_member = connect_member
        self.lookup = self._lookup(connect_upstream)
        self.buckets = {
            i: Bucket(
                i,
                options.bucket_buffer_bytes,
                floors[i],
                token_from_key(floors[i]),
                self._account(BUCKET_FLOOR_BYTES, reader=False),
            )
            for i in self.keep
        }
        self._skip = min(floors[i] for i in self.keep)
        self.shard_budgets: dict[str, ByteBudget] = {}
        self.dealer = Dealer(
            self.buckets,
            n,
            scope=options.scope,
            match=options.match,
            bucket_by=options.bucket_by,
        )
        self.readers: dict[str, ShardReader] = {}
        self.merge = MergedQueue(())
        for sid, hosts in topology.shards.items():
            self._new_reader(sid, hosts, start)
        self.watcher = self._topology_watcher(connect_upstream, topology)
        self.error: Exception | None = None
        self.events_merged = 0
        self.replays = 0  # attaches older than retention, served by re-reading the oplogs
        self.last_active = 0.0
        self.started = trio.Event()
        self._frontier = b""
        self._cancel = trio.CancelScope()

    def _lookup(self, connect_upstream: ConnectUpstream | None) -> DocumentLookup | None:
        """The stream's document and pre-image lookups, if its options ask for them."""
        options = self.options
        if connect_upstream is None or not (
            options.full_document == "updateLookup" or options.needs_pre_images
        ):
            return None
        return DocumentLookup(connect_upstream, self._connect_shard)

    def _topology_watcher(
        self, connect_upstream: ConnectUpstream | None, topology: Topology
    ) -> TopologyWatcher | None:
        """What adds shards as they join, a shard of the merge of its own. Without an upstream
        to ask (a fixed shard list, or a replica set), nothing is added and nothing waits on
        it."""
        if connect_upstream is None or not topology.sharded:
            return None
        watcher = TopologyWatcher(
            connect_upstream, topology, holds_back=lambda: self._shard_holds_back(TOPOLOGY)
        )
        self.merge.add_shard(TOPOLOGY, max(mark_after(topology.as_of), self.merge.frontier()))
        return watcher

    async def _connect_shard(self, sid: str) -> Connection:
        """A connection to a member of shard `sid` (pre-images live on the shard that wrote
        them)."""
        return await self._connect_member(self.readers[sid].hosts, secondary=True)

    def _new_reader(self, sid: str, hosts: list[tuple[str, int]], start: Timestamp) -> ShardReader:
        options = self.options
        scope = options.scope
        # The reader holds a batch, and the next reply read ahead, in hand while it waits for
        # room: counted beside the budget.
        account = self._account(SHARD_FLOOR_BYTES, reader=True, in_hand=SHARD_IN_HAND_BYTES)
        self.shard_budgets[sid] = ByteBudget(options.shard_buffer_bytes, account)
        tail = OplogTail(
            sid,
            hosts,
            start=start,
            skip_key=self._skip,
            await_ms=options.reader_await_ms,
            transformer=OplogTransformer(
                show_expanded_events=options.show_expanded_events,
                show_system_events=options.show_system_events,
                token_version=options.token_version,
                keep_version=options.keep_version,
                view_events=scope is None or scope[1] is None,
                ddl_notes=options.ddl_notes,
            ),
            connect_member=self._connect_member,
            keep_applied=options.needs_pre_images,
            # (a tail sent to a reader process pickles: it splices there, on its loop)
            splice_limiter=None if self._hosts else self._splice_limiter,
        )
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
        return {
            "heldBytes": sum(b.used for b in self._budgets()),
            "floorBytes": sum(a.floor for a in accounts),
            "countedBytes": sum(a.counted for a in accounts),
            "memoryWaits": sum(b.pool_waits for b in self._budgets()),
        }

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
    def ended(self) -> bool:
        """Whether an accelerated single-collection or database stream was invalidated."""
        return self.dealer.ended

    @property
    def end_token(self) -> dict[str, Any] | None:
        """The invalidate's token: where a cursor that read to the end resumes (startAfter)."""
        return self.dealer.end_token

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
                self._fail(
                    MongoError(
                        "InternalError",
                        f"parallel change stream {self.name!r} failed: {type(bug).__name__}: {bug}",
                    )
                )
            finally:
                self.started.set()
                if self.lookup is not None:
                    with trio.CancelScope(shield=True):
                        await self.lookup.aclose()
                if self._cancel.cancel_called:
                    self._release()

    def _fail(self, exc: Exception) -> None:
        log.warning("stream %s failed: %s", self.name, str(exc))
        self.error = exc.copied() if isinstance(exc, MongoError) else exc.with_traceback(None)
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
            pool = (
                self._pool
                if self._pool is not None
                else await stack.enter_async_context(reader_pool())
            )
            hosts = self._hosts = await pool.hosts(self.options.reader_processes)
            for i, reader in enumerate(self.readers.values()):
                reader.elsewhere = hosts[i % len(hosts)]
            yield

    async def _watch_topology(
        self, nursery: trio.Nursery, send: trio.MemorySendChannel[ShardBatch]
    ) -> None:
        assert self.watcher is not None

        async def advance(as_of: Timestamp) -> None:
            await send.send(ShardBatch(TOPOLOGY, [], mark_after(as_of), 0))

        def add_shard(sid: str, hosts: list[tuple[str, int]], joined: Timestamp) -> None:
            reader = self._new_reader(
                sid, hosts, max(joined, self.start, key=lambda ts: (ts.time, ts.inc))
            )
            nursery.start_soon(reader.run, send.clone())

        async with send:
            await self.watcher.run(advance, add_shard)

    async def _announce_start(self, checks: list[trio.Event]) -> None:
        for event in checks:
            await event.wait()
        self.started.set()

    async def _pump(self, recv: trio.MemoryReceiveChannel[ShardBatch]) -> None:
        async for first in recv:
            # Every batch already waiting is merged with this one: fewer, larger releases (each
            # release cuts the shards' blocks at the frontier, and each piece is dealt apart).
            arrived = [first]
            try:
                while len(arrived) < _MERGED_AT_ONCE:
                    arrived.append(recv.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                pass
            self._queue(arrived)
            ready, freed = self.merge.pop_ready()
            self._nudge_blocking_shards()
            await self.dealer.deal(ready)
            # Budgets are released once per merged batch, not once per event.
            for shard, nbytes in freed.items():
                self.shard_budgets[shard].release(nbytes)
            # What was just dealt may hold a waiting reader's budget full (the reader asked
            # before it was dealt, or reads in a reader process and cannot ask).
            if any(reader.starved for reader in self.readers.values()):
                self._unpin()
            self.events_merged += count_events(ready)
            self._advance_frontier()
            # Nor may this frame hold the blocks while it waits for the next batch: a waiting
            # reader's batch comes only once they are let go.
            del first, arrived, ready

    def _queue(self, arrived: list[ShardBatch]) -> None:
        """Queue the shards' batches in the merge and move their marks."""
        tagged = self.options.needs_pre_images  # read from the shard that wrote the event
        for batch in arrived:
            events = as_runs(batch.events)
            if tagged:
                events = plain_runs(with_shard(fields_of(events), batch.shard))
            self.merge.extend(batch.shard, events)
            self.merge.advance(batch.shard, batch.mark)

    def _nudge_blocking_shards(self) -> None:
        """Events that wait on some marks: idle shards write a note now, not at their next
        getMore timeout, and the shard list is re-read (live-tail latency). (Not guarded by
        len(merge), which counts a block's events: this runs for every release.)"""
        for shard in self.merge.blocking_shards():
            reader = self.readers.get(shard)
            if reader is not None:
                reader.nudge()
            elif shard == TOPOLOGY and self.watcher is not None:
                self.watcher.nudge()

    def _advance_frontier(self) -> None:
        """Every mark is a high-water-mark token key, so the merge's frontier is itself a token;
        idle buckets report it as their postBatchResumeToken."""
        frontier = self.merge.frontier()
        if frontier > self._frontier:
            self._frontier = frontier
            token = token_from_key(frontier)
            for bucket in self.buckets.values():
                bucket.advance_frontier(frontier, token)

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
        runs = []
        for i, bucket in self.buckets.items():
            lo = bucket.position_after(max(after[i], bucket.floor))
            hi = bucket.position_after(max(frontier, bucket.floor))
            if lo is None or hi is None:
                return frontier  # fallen behind: what it holds there is unknown
            runs.append(bucket.keys_between(lo, min(hi, lo + max_events + 1)))
        merged = list(heapq.merge(*runs))
        if len(merged) <= max_events:
            return frontier
        end = merged[max_events - 1]
        return end

    def oversize(self, raw: bytes) -> Size:
        """What a server does with an event of this size: split it (with the split stage and over
        the split size), fail with BSONObjectTooLarge, or return it whole."""
        return self.sizer.size(raw)

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "nBuckets": self.options.n_buckets,
            "bucketBy": self.options.bucket_by,
            "eventsMerged": self.events_merged,
            "mergeQueue": len(self.merge),
            "replays": self.replays,
            "stageRunsInProcesses": self.shaper.runs_sent,
            "memory": self.memory(),
            "error": str(self.error) if self.error else None,
            "shards": [self._shard_status(s, r) for s, r in self.readers.items()],
            "topology": self.watcher.status() if self.watcher is not None else None,
            "buckets": [_bucket_status(i, b) for i, b in sorted(self.buckets.items())],
        }

    def _shard_status(self, shard: str, reader: ShardReader) -> dict[str, Any]:
        stats = reader.stats
        return {
            "shard": shard,
            "host": stats.host,
            "lastTs": stats.last_ts,
            "lagSeconds": (
                max(0.0, time.time() - stats.last_ts.time) if stats.last_ts.time else None
            ),
            "entriesRead": stats.entries,
            "events": stats.events,
            "bufferBytes": reader.buffered,
            "bufferLimitBytes": self.shard_budgets[shard].limit,
            "noops": stats.noops,
            "reconnects": stats.reconnects,
            "connected": stats.connected,
            "lastError": stats.last_error or None,
            "lastErrorAt": (
                datetime.fromtimestamp(stats.last_error_at, UTC) if stats.last_error else None
            ),
            "readerProcess": reader.elsewhere.index if reader.elsewhere is not None else None,
            "noopFallback": stats.noop_unavailable or None,
        }


def _bucket_status(index: int, bucket: Bucket) -> dict[str, Any]:
    return {
        "bucket": index,
        "depth": bucket.depth(),
        "retained": bucket.retained,
        "bytes": bucket.budget.used,
        "limitBytes": bucket.budget.limit,
        "dealt": bucket.dealt_total,
        "delivered": bucket.delivered_total,
        "cursors": len(bucket.cursors),
        "error": str(bucket.error) if bucket.error else None,
        "consumerPosition": max(
            (c.last_token for c in bucket.cursors),
            default=None,
            key=lambda t: t.get("_data", "") if t else "",
        ),
        **lag_status(bucket),
    }


def _shaping_account(options: StreamOptions, memory: MemoryPool | None) -> PoolAccount | None:
    """The account of a stream's shaping processes, at a reader process's size (they start the
    same interpreter)."""
    shaping = shaping_processes(bool(options.stages), options.reader_processes)
    if memory is None or not shaping:
        return None
    return memory.account(shaping * memory.process_bytes, reader=False)


def _first_leaf(group: BaseExceptionGroup[Any]) -> Exception:
    first = group.exceptions[0]
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    assert isinstance(first, Exception)
    return first
