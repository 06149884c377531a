"""The engine's streams: named ones by name (created once, reused by later commands, reopened with
another bucket count, torn down when idle) and private ones (an accelerated watch()'s, a replay,
each serving one cursor), with memory admission for each new one."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

import bson
import trio
from bson import Timestamp

from buckets.commands import int_option, open_match, setting
from buckets.config import EngineConfig
from buckets.cursor import start_point
from buckets.cursors import CursorRegistry
from buckets.ddl_notes import EXPANDED_EVENTS_WIRE_VERSION
from buckets.memory_limit import (
    DEAL_HEADROOM_BYTES,
    MemoryPool,
    default_memory_limit,
    shaping_processes,
    stream_floor,
)
from buckets.ports import Connection, Connector, ConnectUpstream
from buckets.reader_process import ReaderPool
from buckets.spare_upstream import SpareUpstream
from buckets.stream import ParallelStream, StreamOptions
from buckets.topology import Topology, discover, read_topology
from mongoformats.change_stages import compile_stages
from mongoformats.errors import MongoError
from mongoformats.large_events import SPLIT_STAGE
from mongoformats.resume_token import decode_token, high_water_mark, token_from_key, token_sort_key

log = logging.getLogger("buckets.engine")

# A bucket cursor no getMore has used for this long is no longer read (consumers getMore again
# within their await time, a second or so), so it no longer holds its stream's bucket count.
CURSOR_IN_USE_S = 10.0


class StreamSet:
    def __init__(
        self,
        connect_upstream: ConnectUpstream,
        connect_member: Connector,
        config: EngineConfig,
        registry: CursorRegistry,
    ) -> None:
        self.connect_upstream, self.connect_member = connect_upstream, connect_member
        self.config, self.registry = config, registry
        self.streams: dict[str, ParallelStream] = {}
        self.creating: dict[str, trio.Event] = {}  # named streams being created, set once done
        self.owners: dict[str, str] = {}  # named stream -> its creator's identity
        self.nursery: trio.Nursery | None = None
        self.reader_pool: ReaderPool | None = None  # reader processes, shared by every stream
        self._upstream_wire_version: int | None = (
            None  # learned on first use (lacks_expanded_events)
        )
        # Whether the upstream is a mongos (None: not asked yet). A mongos stays one: a stream's
        # open then reads only its shard list, not hello first.
        self._sharded: bool | None = None
        # The engine's short reads of mongos at an open share one kept connection (a stream's
        # first events wait on them).
        self.spare = SpareUpstream(connect_upstream)
        self.rebucketed = 0  # named streams reopened with another nBuckets
        self.memory_limit = config.memory_limit_bytes or default_memory_limit()
        # Every stream's budgets take their bytes from it too (buckets/memory_limit.py).
        self.memory = MemoryPool(self.memory_limit)
        # One for the engine, not one per stream: the threads share the cores beside the loop,
        # whatever the number of streams and shards (oplog_tail.SPLICE_THREAD_BYTES).
        self.splice_limiter = (
            trio.CapacityLimiter(config.splice_threads) if config.splice_threads else None
        )
        self.refused_for_memory = (
            0  # opens refused, and watch()es passed through, for the memory limit
        )

    def all_streams(self) -> dict[str, ParallelStream]:
        """Named streams and the private ones each serving one cursor (an accelerated watch(), a
        bucket re-read from the oplogs), by name: status and /metrics show both."""
        return {**self.streams, **{s.name: s for s in self.registry.private.values()}}

    def _make_room(self, need: int) -> None:
        """Close streams without cursors, least recently used first, until `need` more bytes fit
        under the memory limit (MemoryPool.check_admits). Such a stream is kept only so that a
        consumer can re-attach to its retained events until the idle teardown; one re-attaching
        later reopens it from its token. Streams with cursors are never closed to admit another,
        and if closing every idle stream would still not make room, none is closed: the new
        stream is refused either way."""
        idle = sorted(
            (s for s in self.streams.values() if not s.has_cursors()), key=lambda s: s.last_active
        )
        over = self.memory.counted + need + DEAL_HEADROOM_BYTES - self.memory_limit
        if over <= 0 or over > sum(s.memory()["countedBytes"] for s in idle):
            return
        for stream in idle:
            if self.memory.counted + need + DEAL_HEADROOM_BYTES <= self.memory_limit:
                break
            self.close_named(
                stream, "tearing down idle stream %s early: its memory is needed for a new stream"
            )

    def _admit(self, options: StreamOptions, shards: int, kept: int) -> int:
        """Admit a stream of `shards` shards and `kept` buckets kept, or refuse it
        (ExceededMemoryLimit); the reader processes it would start. Admitted by its floor (what
        it always takes) and those processes, beside what the others hold; its budgets then take
        what they hold from the same pool. Synchronous: nothing else is admitted meanwhile."""
        assert self.reader_pool is not None, "Engine.run() must be started first"
        floor = stream_floor(shards, kept)
        starting = self.reader_pool.missing(options.reader_processes) + shaping_processes(
            bool(options.stages), options.reader_processes
        )
        self._make_room(floor + starting * self.memory.process_bytes)
        try:
            self.memory.check_admits(
                floor,
                starting,
                streams=len(self.all_streams()),
                shards=shards,
                buckets=kept,
                reader_processes=options.reader_processes,
            )
        except MongoError:
            self.refused_for_memory += 1
            raise
        return starting

    def tear_down_idle(self) -> None:
        now = trio.current_time()
        for stream in list(self.streams.values()):
            if stream.has_cursors():
                stream.last_active = now
            elif now - stream.last_active > self.config.idle_teardown_s:
                self.close_named(stream, "tearing down idle stream %s")

    def close_named(self, stream: ParallelStream, why: str) -> None:
        """Close a named stream and forget it; `why` is logged, with %s for its name."""
        log.info(why, stream.name)
        stream.close()
        del self.streams[stream.name]
        self.owners.pop(stream.name, None)

    # -- upstream helpers --------------------------------------------------------------------------

    async def upstream_wire_version(self) -> int:
        if self._upstream_wire_version is None:
            hello = await self.spare.run(lambda up: up.command("admin", {"hello": 1}))
            self._upstream_wire_version = int(hello.get("maxWireVersion", 0))
        return self._upstream_wire_version

    async def lacks_expanded_events(self) -> bool:
        """True for an upstream before 6.0: DDL events then come from the proxy's notes."""
        return await self.upstream_wire_version() < EXPANDED_EVENTS_WIRE_VERSION

    async def on_each_shard(
        self, shards: Mapping[str, list[tuple[str, int]]], db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        """Run `cmd` on every shard's primary directly (shard id -> reply)."""
        out: dict[str, Any] = {}
        for sid, hosts in shards.items():
            conn = await self.connect_member(hosts, secondary=False)
            try:
                out[sid] = await conn.command(db, cmd)
            finally:
                await conn.aclose()
        return out

    async def holders(self, shards: Mapping[str, list[tuple[str, int]]], ns: str) -> dict[str, Any]:
        db, _, coll = ns.partition(".")
        replies = await self.on_each_shard(
            shards, db, {"listCollections": 1, "filter": {"name": coll}}
        )
        return {
            sid: bson.decode(r.raw)["cursor"]["firstBatch"][0]
            for sid, r in replies.items()
            if r["cursor"]["firstBatch"]
        }

    async def topology(self) -> Topology:
        return await self.spare.run(self._discover)

    async def _discover(self, up: Connection) -> Topology:
        """The shard list (a mongos's, known to be one), or what hello says is behind `up`; its
        wire version is learned from the same hello."""
        if self._sharded:
            return await read_topology(up)
        hello = await up.command("admin", {"hello": 1})
        self._upstream_wire_version = int(hello.get("maxWireVersion", 0))
        topology = await discover(up, hello)
        self._sharded = topology.sharded
        return topology

    def check_owner(self, name: str, user: str) -> None:
        """Unauthorized (13) unless `user` created the named stream (see the module docstring)."""
        owner = self.owners.get(name)
        if owner is not None and owner != user:
            raise MongoError(
                "Unauthorized", f"parallel change stream {name!r} was created by another user"
            )

    async def named(
        self, name: str, n: int | None, cmd: dict[str, Any], user: str
    ) -> tuple[ParallelStream, bool]:
        """The open stream `name`, or one created from `cmd` (then True). Commands that find it
        missing at once (the N Spark tasks of a micro-batch after a proxy restart each attach
        their bucket with nBuckets) wait for one creation: each made its own, and all but the
        last were left outside `streams`, never torn down, reading every shard for good."""
        while (pending := self.creating.get(name)) is not None:
            await pending.wait()
        stream = self.streams.get(name)
        if stream is not None:
            # Before anything of hers is touched (a reopen kills her cursors).
            self.check_owner(name, user)
            if self._rebucketed(stream, n, cmd.get("bucketBy")):
                # An attach with only another bucketBy reopens it with the same count.
                n, stream = n or stream.options.n_buckets, None
        if stream is not None:
            return stream, False
        if n is None:
            raise MongoError(
                "BadValue",
                f"no parallel change stream named {name!r} is open on this proxy; "
                "pass nBuckets (and resumeAfter) to open it",
            )
        done = self.creating[name] = trio.Event()
        try:
            stream = await self.create(name, n, cmd)
            self.owners[name] = user
            return stream, True
        finally:
            del self.creating[name]
            done.set()

    def _rebucketed(self, stream: ParallelStream, n: int | None, by: str | None) -> bool:
        """Whether `stream` was closed to be reopened with another nBuckets or bucketBy."""
        options = stream.options
        if (n is None or n == options.n_buckets) and (by is None or by == options.bucket_by):
            return False
        self._close_to_rebucket(stream, n or options.n_buckets, by or options.bucket_by)
        return True

    def _close_to_rebucket(self, stream: ParallelStream, n: int, by: str) -> None:
        """Close `stream` so that its name can be opened again with `n` buckets dealt `by`.

        A bucketBy is part of a named stream's identity as nBuckets is: another one reopens it
        the same way (bucket tokens of one mode mean nothing in the other).

        Why: a Spark query restarted with another nBuckets (more tasks) reopens its stream under
        the same name from its checkpoint. Bucket tokens are per bucket count, so the old stream's
        retention cannot serve the new buckets; with no cursor reading it, nothing is lost by
        closing it, and the new stream re-reads from the given start. A stream whose cursors are
        in use is still someone's: refused (ConflictingOperationInProgress, which the caller may
        retry), so one job never pulls the buckets from under another. Cursors no getMore has
        used for CURSOR_IN_USE_S are a stopped consumer's (a Spark task cancelled mid-read never
        kills its cursor, and the cursor timeout is 10 minutes or more): they are killed with the
        stream.
        """
        now = trio.current_time()
        cursors = [cur for b in stream.buckets.values() for cur in b.cursors]
        in_use = sum(cur.busy or now - cur.last_used < CURSOR_IN_USE_S for cur in cursors)
        if in_use:
            raise MongoError(
                "ConflictingOperationInProgress",
                f"stream {stream.name!r} is open with nBuckets {stream.options.n_buckets} "
                f"(bucketBy {stream.options.bucket_by}) and {in_use} cursor(s) read it; close "
                f"them (or use another name) to reopen it with nBuckets {n} (bucketBy {by})",
            )
        for cur in cursors:
            self.registry.drop(cur.cursor_id)
        self.close_named(
            stream,
            f"reopening stream %s with {n} buckets by {by} instead of "
            f"{stream.options.n_buckets} by {stream.options.bucket_by} "
            f"({len(cursors)} abandoned cursors killed)",
        )
        self.rebucketed += 1

    async def create(
        self,
        name: str,
        n: int,
        cmd: dict[str, Any],
        *,
        keep: set[int] | None = None,
        scope: tuple[str, str | None] | None = None,
        stages: tuple[dict[str, Any], ...] = (),
        keep_version: tuple[Timestamp, int] | None = None,
    ) -> ParallelStream:
        topology = await self.topology()
        tokens = cmd.get("resumeAfter", cmd.get("startAfter"))
        if keep_version is None and isinstance(tokens, Mapping):
            data = decode_token(tokens)
            keep_version = (data.cluster_time, data.version)
        start, floors = _start_and_floors(cmd, n, topology.as_of)
        match, split = open_match(cmd)
        options = StreamOptions(
            n_buckets=n,
            show_expanded_events=bool(cmd.get("showExpandedEvents", False)),
            show_system_events=bool(cmd.get("showSystemEvents", False)),
            keep_version=keep_version,
            shard_buffer_bytes=setting(cmd, "shardBufferBytes", self.config.shard_buffer_bytes),
            bucket_buffer_bytes=setting(cmd, "bucketBufferBytes", self.config.bucket_buffer_bytes),
            max_await_ms=setting(cmd, "maxAwaitTimeMS", self.config.max_await_ms),
            reader_await_ms=self.config.reader_await_ms,
            match=match,
            scope=scope,
            full_document=str(cmd.get("fullDocument", "default")),
            full_document_before_change=str(cmd.get("fullDocumentBeforeChange", "off")),
            stages=compile_stages(stages),
            split_large_events=split,
            reader_processes=setting(cmd, "readerProcesses", self.config.reader_processes),
            bucket_by=str(cmd.get("bucketBy", "namespace")),
            ddl_notes=await self.lacks_expanded_events(),
        )
        assert self.reader_pool is not None, "Engine.run() must be started first"
        starting = self._admit(options, len(topology.shards), len(keep) if keep is not None else n)
        # The stream's accounts set its floor aside as it is made (no await between); its reader
        # processes are counted as starting until they count themselves (ReaderPool._keep), so
        # that streams created at once cannot each fit beside the others' absence.
        self.memory.add_processes(starting)  # (shaping ones then count in the stream's own account)
        try:
            stream = ParallelStream(
                name,
                options,
                topology,
                start,
                floors,
                keep=keep,
                connect_upstream=self.connect_upstream,
                connect_member=self.connect_member,
                readers_pool=self.reader_pool,
                memory=self.memory,
                splice_limiter=self.splice_limiter,
            )
            return await self._start(stream, keep is None)
        finally:
            self.memory.add_processes(-starting)

    async def _start(self, stream: ParallelStream, named: bool) -> ParallelStream:
        """Run `stream` until it has opened (listed in `streams` if `named`), or fail as it
        failed."""
        try:
            stream.last_active = trio.current_time()
            assert self.nursery is not None, "Engine.run() must be started first"
            if named:
                stream.isolate()  # before its first events are dealt: see buckets/catch_up.py
            self.nursery.start_soon(stream.run)
            await stream.started.wait()
            if stream.error is not None:
                raise stream.error
            if named:
                self.streams[stream.name] = stream
            return stream
        except BaseException:
            # Failed to open, or the command was cancelled meanwhile (its client left): nothing
            # lists the stream, so nothing else would ever stop it and give back its floor.
            stream.close()
            raise

    async def replay(self, named: ParallelStream, i: int, cmd: dict[str, Any]) -> ParallelStream:
        """A private stream re-reading the oplogs for bucket `i` of `named` from `cmd`'s
        resumeAfter, with `named`'s options."""
        options = named.options
        named.replays += 1
        return await self.create(
            f"{named.name}#replay-{uuid.uuid4().hex[:8]}",
            options.n_buckets,
            {
                **cmd,
                "nBuckets": options.n_buckets,
                "showExpandedEvents": options.show_expanded_events,
                "showSystemEvents": options.show_system_events,
                "bucketBy": options.bucket_by,
                "shardBufferBytes": options.shard_buffer_bytes,
                "bucketBufferBytes": options.bucket_buffer_bytes,
                "pipeline": ([{"$match": options.match}] if options.match else [])
                + ([{SPLIT_STAGE: {}}] if options.split_large_events else []),
            },
            keep={i},
        )


def _start_and_floors(cmd: dict[str, Any], n: int, now: Timestamp) -> tuple[Timestamp, list[bytes]]:
    """Where a new stream starts reading, and each bucket's floor (the key below its first
    event), from the open command's resume tokens or startAtOperationTime; `now` is the cluster
    time of the newest write."""
    tokens = cmd.get("resumeAfter", cmd.get("startAfter"))
    if isinstance(tokens, list):
        floors = [token_sort_key(t) for t in tokens]
        start = min((start_point(t)[0] for t in tokens), key=lambda ts: (ts.time, ts.inc))
        return start, floors
    if tokens is not None:
        start, key = start_point(tokens)
        return start, [key] * n
    # Like the server, a stream with no start point sees what happens after now: the newest
    # write (at `now` itself) was before it opened.
    start = cmd.get("startAtOperationTime", Timestamp(now.time, now.inc + 1))
    if not isinstance(start, Timestamp):
        raise MongoError("TypeMismatch", "startAtOperationTime must be a Timestamp")
    return start, [token_sort_key(high_water_mark(start))] * n


def frontier_status(stream: ParallelStream, cmd: dict[str, Any]) -> dict[str, Any]:
    """A named stream's merge frontier, and the end of the micro-batch planned from `after`."""
    stream.last_active = trio.current_time()
    out = {"frontier": token_from_key(stream.frontier_key)}
    after = cmd.get("after")
    if after is not None:
        if len(after) != stream.options.n_buckets:
            raise MongoError(
                "BadValue",
                f"after has {len(after)} tokens, the stream has {stream.options.n_buckets} buckets",
            )
        end = stream.plan_end(
            [token_sort_key(t) for t in after], int_option(cmd, "maxEvents", 1, 1 << 62)
        )
        out["planEnd"] = token_from_key(end)
    return out
