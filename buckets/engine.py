"""The engine behind the proxy's `parallelChangeStream` commands.

Commands (admin database):
  {parallelChangeStream: 1, nBuckets: N, name?, startAtOperationTime? | resumeAfter? | startAfter?,
   showExpandedEvents?, pipeline?: [{$match: ...}], batchSize?, maxAwaitTimeMS?, shardBufferBytes?,
   bucketBufferBytes?, readerProcesses?, bucketBy?: "namespace" | "documentKey"}
      -> {cursors: [{id, ns, firstBatch, postBatchResumeToken, bucket}], name, nBuckets, bucketBy}
      Creates the stream `name` (a random name if omitted) or re-attaches to it. `resumeAfter` may be
      one token, or a list of N tokens (one per bucket) to resume a whole stream. The bucket count
      changes from a common token: a list of tokens all alike, whatever its length, is that one
      token, and a name open with another nBuckets and no cursors is reopened with the new count.
      bucketBy (buckets/bucketing.py has the contract) deals events by namespace (the default) or
      by document: one collection spreads over every bucket, each document's events stay in one
      bucket in order, events without a documentKey (DDL) go to every bucket with the same token,
      and a transaction's events are split by document (each carries lsid and txnNumber). It is
      part of a named stream's identity like nBuckets: another bucketBy given for an open name
      reopens it the same way (ConflictingOperationInProgress while its cursors are in use).
  {parallelChangeStream: 1, name, bucket: i, resumeAfter?: token, nBuckets?}
      -> {cursor: {id, ns, firstBatch, postBatchResumeToken}}: one bucket, iterable by any driver.
      Without a token, the cursor returns every event of the bucket from the stream's start point
      (its startAtOperationTime, resume token, or the time it was opened), not just those dealt
      after the attach: what the bucket still retains is read from memory, and a start that
      retention has dropped is served by a replay (a private stream re-reading the oplogs for
      this bucket alone, which moves the cursor to the named stream once caught up).
  {parallelChangeStreamStatus: 1, name?} -> per-shard read positions and buffers, per-bucket depth.
  {dropParallelChangeStream: name} -> {name, cursorsKilled: [ids]}: closes the stream now. Its
      cursors are killed (a getMore on one, even one waiting, fails with CursorKilled (237), as
      after killCursors; so do replays joining it) and its memory returns to the proxy's pool at
      once. NamespaceNotFound (26) if no stream has that name, as dropping a missing collection.
  getMore / killCursors on the returned cursor ids.

Who may do what, when the upstream requires authentication (the client's identity is the one
mongos confirms on its connection, buckets.ports.ClientContext):
  - A named stream belongs to the user who created it. Opening, attaching to, reopening (another
    nBuckets) or asking the status of a stream another user created is Unauthorized (13): a
    stream's name is not a secret, and its events are the creator's to read. Names are
    proxy-wide, so two users pick different names.
  - A cursor belongs to the user who opened it, and to its session if opened in one: a getMore
    must come from both. killCursors checks the user only, as the server does
    (auth::checkAuthForKillCursors via CursorManager::checkAuthForKillCursors in
    src/mongo/db/cursor_manager.cpp, ClusterCursorManager on mongos): the cursor's own user, from
    any session, or a user holding killAnyCursor on the cluster (hostManager), kills it.
  - parallelChangeStreamStatus lists the caller's own streams and cursors; a user holding
    `inprog` on the cluster (clusterMonitor), the privilege `$currentOp` with allUsers needs
    (document_source_current_op.cpp), sees every user's.
Clients that did not log in are all one nobody (user ""): without authentication, all of the
above is everyone's.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any

import trio
from bson import Int64, Timestamp

from buckets.commands import (
    check_status_command,
    check_stream_name,
    plan_watch,
    read_open,
    read_watch,
)
from buckets.config import EngineConfig
from buckets.cursor import BucketCursor, start_point
from buckets.cursors import CursorRegistry
from buckets.ddl_notes import DDL_COMMANDS, plan_notes, target_namespace
from buckets.event_run import EventRun
from buckets.ports import ClientContext, Connector, ConnectUpstream, Decline, Handler
from buckets.reader_process import reader_pool
from buckets.reply import cursor_document
from buckets.stream import ParallelStream
from buckets.streams import StreamSet, frontier_status
from mongoformats.change_events import ddl_note
from mongoformats.errors import MongoError, with_change_stream_label
from mongoformats.idl import check_depth, check_lsid, get_more_request, kill_cursors_ids, wrong_type
from mongoformats.privileges import allows, change_stream_resource
from mongoformats.resume_token import high_water_mark, token_from_key, token_sort_key
from mongoformats.sessions import session_id, sessions_named

log = logging.getLogger("buckets.engine")

CURSOR_NS = "admin.$cmd.parallelChangeStream"
# Servers from 6.1 on (wire version 18) write v2 resume tokens, as the engine does; older ones v1.
_V2_TOKENS_WIRE_VERSION = 18


@dataclass(frozen=True)
class EngineCommands:
    """What the engine serves: commands by name, an accelerated watch() (an aggregate opening a
    change stream), and getMore / killCursors on the cursors it owns. A handler raises Decline to
    leave a request to mongos."""

    named: Mapping[str, Handler]
    change_stream: Handler
    get_more: Handler
    kill_cursors: Handler
    cursors: Container[int]  # the ids of the engine's cursors, live: a cursor is listed while open


async def _is_collection_or_absent(session: ClientContext, db: str, coll: str) -> bool:
    """Whether `db.coll` is no view, asked of mongos with the client's own login
    (DocumentSourceChangeStream refuses a view: jstests/change_streams/ddl_view_events.js); False
    when mongos does not answer, so that mongos decides."""
    reply = await session.forward_command(
        db, {"listCollections": 1, "filter": {"name": coll}, "cursor": {}}
    )
    cursor = reply.get("cursor") if reply.get("ok") else None
    batch = cursor.get("firstBatch") if isinstance(cursor, dict) else None
    return isinstance(batch, list) and all(
        isinstance(c, dict) and c.get("type", "collection") == "collection" for c in batch
    )


class Engine:
    def __init__(
        self,
        connect_upstream: ConnectUpstream,
        config: EngineConfig | None = None,
        *,
        connect_member: Connector,
        requires_auth: bool = False,
    ) -> None:
        self.connect_upstream = connect_upstream
        # The upstream requires authentication (the proxy logs in with its own credentials), so a
        # client must have logged in on its connection before the engine serves it.
        self.requires_auth = requires_auth
        # Shard members, with the same TLS settings as mongos; it keeps the members it saw failing.
        self.connect_member = connect_member
        self.config = config or EngineConfig()
        self.registry = CursorRegistry(
            self.config.cursor_timeout_s, self.config.session_cursor_timeout_s
        )
        self.cursors = self.registry.cursors
        self._private = self.registry.private
        self.stream_set = StreamSet(connect_upstream, connect_member, self.config, self.registry)
        self.streams = self.stream_set.streams
        self.memory, self.memory_limit = self.stream_set.memory, self.stream_set.memory_limit
        # watch() aggregates served by the engine / forwarded to the upstream (status and /metrics)
        self.watches = {"accelerated": 0, "passedThrough": 0}

    def commands(self) -> EngineCommands:
        """The commands the engine serves, for the proxy to route to it."""
        named: dict[str, Handler] = {
            "parallelChangeStream": self.cmd_open,
            "parallelChangeStreamStatus": self.cmd_status,
            "dropParallelChangeStream": self.cmd_drop,
            "endSessions": self.cmd_end_sessions,
            **dict.fromkeys(DDL_COMMANDS, self.cmd_ddl),
            **dict.fromkeys(
                ("killSessions", "killAllSessions", "killAllSessionsByPattern"),
                self.cmd_kill_sessions,
            ),
        }
        return EngineCommands(
            named=named,
            change_stream=self.cmd_change_stream,
            get_more=self.cmd_get_more,
            kill_cursors=self.cmd_kill_cursors,
            cursors=self.cursors.keys(),
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # A reader process that reads nothing is stopped after reader_idle_s.
        pool_of_readers = reader_pool(
            self.config.reader_idle_s, self.config.hang_timeout_s, memory=self.memory
        )
        async with pool_of_readers as pool, trio.open_nursery() as nursery:
            self.stream_set.nursery, self.stream_set.reader_pool = nursery, pool
            task_status.started()
            next_refresh = trio.current_time() + self.config.session_refresh_s
            while True:
                await trio.sleep(1)
                if trio.current_time() >= next_refresh:
                    next_refresh += self.config.session_refresh_s
                    self.registry.reap_ended_sessions()
                self.registry.kill_idle(trio.current_time())
                self.stream_set.tear_down_idle()

    def all_streams(self) -> dict[str, ParallelStream]:
        """Named streams and the private ones each serving one cursor, by name."""
        return self.stream_set.all_streams()

    @property
    def rebucketed(self) -> int:
        """Named streams reopened with another nBuckets."""
        return self.stream_set.rebucketed

    @property
    def refused_for_memory(self) -> int:
        """Opens refused, and watch()es passed through, for the memory limit."""
        return self.stream_set.refused_for_memory

    def memory_reserved(self) -> int:
        """What counts against the memory limit (buckets/memory_limit.py)."""
        return self.memory.counted

    def memory_status(self) -> dict[str, int]:
        """limitBytes; reservedBytes, what counts against it; heldBytes, what the budgets hold;
        floorBytes, what the open streams are admitted by; readerProcessBytes; memoryWaits, takes
        that waited for room in the pool; streamsRefused."""
        return {
            **self.memory.status(),
            "memoryWaits": self.memory.refusals,
            "streamsRefused": self.refused_for_memory,
        }

    def reader_processes(self) -> list[dict[str, Any]]:
        """The shared reader processes: index, alive, tails (shards of streams) each reads."""
        pool = self.stream_set.reader_pool
        return pool.status() if pool is not None else []

    @property
    def cursors_timed_out(self) -> int:
        """Idle cursors killed (serverStatus' metrics.cursor.timedOut)."""
        return self.registry.timed_out

    # -- commands ----------------------------------------------------------------------------------

    def _user(self, session: ClientContext, command: str) -> str:
        """The user `session` logged in as; Unauthorized (13) when the upstream needs one and there is none."""
        user = session.user or ""
        if self.requires_auth and not user:
            raise MongoError("Unauthorized", f"Command {command} requires authentication")
        return str(user)

    async def _may_watch(self, session: ClientContext, resource: dict[str, Any]) -> bool:
        """Whether the client's own user holds find and changeStream on `resource`, as mongos
        would check for a change stream: the engine reads the shards with the proxy's login, so
        it asks the client's connection for its privileges (connectionStatus showPrivileges)."""
        if not self.requires_auth:
            return True
        return allows(await session.privileges(), ("find", "changeStream"), resource)

    async def cmd_open(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        user = self._user(session, "parallelChangeStream")
        if db != "admin":
            raise MongoError(
                "Unauthorized", "parallelChangeStream may only be run against the admin database."
            )
        # A parallel stream reads every namespace: a cluster-wide change stream's privileges.
        if not await self._may_watch(session, change_stream_resource(None, None)):
            raise MongoError(
                "Unauthorized",
                "not authorized on admin to execute command { parallelChangeStream: 1 }: "
                "it needs find and changeStream on every database ({db: '', collection: ''})",
            )
        request = read_open(cmd)
        cmd, n, bucket, name, batch_size = (
            request.cmd,
            request.n,
            request.bucket,
            request.name,
            request.batch_size,
        )
        if bucket is not None:
            if name is None:
                raise MongoError("BadValue", "attaching to a bucket needs the stream's name")
            return await self._attach_bucket(user, name, bucket, n, cmd, batch_size)
        if n is None:
            raise MongoError("BadValue", "nBuckets is required: an integer between 1 and 1024")
        name = name or f"pcs-{uuid.uuid4().hex[:12]}"
        stream, created = await self.stream_set.named(name, n, cmd, user)
        tokens = cmd.get("resumeAfter", cmd.get("startAfter"))
        if tokens is None and isinstance(cmd.get("startAtOperationTime"), Timestamp):
            # Joining an existing stream at a time: the same point as a token for that time.
            tokens = high_water_mark(cmd["startAtOperationTime"])
        per_bucket = tokens if isinstance(tokens, list) else [tokens] * n
        cursors = []
        for i in range(n):
            token = per_bucket[i]
            dealt = stream.buckets[i]
            in_gap = False
            if token is not None and dealt.position_after(key := start_point(token)[1]) is None:
                # After the point a fallen-behind bucket is complete to: its first getMore
                # moves it to a replay (buckets/catch_up.py). Below what it holds: lost.
                in_gap = dealt.lag.behind and key >= dealt.floor
                if not in_gap:
                    raise MongoError(
                        "ChangeStreamHistoryLost",
                        f"bucket {i} of stream {name!r} no longer holds events after "
                        "that token; attach to the bucket alone to re-read them",
                    )
            cur = self._new_cursor(user, stream, i, cmd, batch_size, token, from_start=created)
            cur.lost = in_gap
            cursors.append(
                {
                    "id": Int64(cur.cursor_id),
                    "ns": CURSOR_NS,
                    "firstBatch": [],
                    "postBatchResumeToken": cur.last_token,
                    "bucket": i,
                }
            )
        return {
            "cursors": cursors,
            "name": name,
            "nBuckets": n,
            "bucketBy": stream.options.bucket_by,
        }

    async def cmd_drop(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        """Close the stream `cmd["dropParallelChangeStream"]` and kill its cursors (see the module
        docstring): its creator's to drop, like every other use of a named stream."""
        user = self._user(session, "dropParallelChangeStream")
        if db != "admin":
            raise MongoError(
                "Unauthorized",
                "dropParallelChangeStream may only be run against the admin database.",
            )
        check_depth(cmd)
        check_lsid(cmd)
        name = cmd["dropParallelChangeStream"]
        if not isinstance(name, str):
            raise wrong_type("dropParallelChangeStream", name, "string")
        check_stream_name(name, "dropParallelChangeStream")
        while (pending := self.stream_set.creating.get(name)) is not None:
            await pending.wait()  # being created: dropped once it is (or found missing)
        stream = self.streams.get(name)
        if stream is None:
            raise MongoError("NamespaceNotFound", f"no parallel change stream named {name!r}")
        self.stream_set.check_owner(name, user)
        # Its cursors, and those of replays that would move to it once caught up.
        doomed = [cid for cid, cur in self.cursors.items() if stream in (cur.stream, cur.join)]
        for cid in doomed:
            self._drop_cursor(cid)
        self.stream_set.close_named(stream, "dropping stream %s (dropParallelChangeStream)")
        return {"name": name, "cursorsKilled": [Int64(cid) for cid in doomed]}

    def _new_cursor(
        self,
        user: str,
        stream: ParallelStream,
        i: int,
        cmd: dict[str, Any],
        batch_size: int | None,
        token: Mapping[str, Any] | None,
        *,
        from_start: bool = False,
    ) -> BucketCursor:
        """A cursor on bucket `i`: after `token` if given; else, on a stream this command created
        (`from_start`), at the stream's start point; else at the bucket's live end.

        Why `from_start`: a new stream's readers start as soon as every oplog is known to reach
        back far enough, and may deal events before the command that created it gets to run again.
        Those events are after the start point the command asked for, so its cursor must see them:
        placed at the live end, it skipped them (a 1M-event catch-up lost the first few hundred).
        Nothing leaves a bucket before a cursor has read it, so the bucket still holds them all.
        """
        bucket = stream.buckets[i]
        if token is None and from_start:
            token = token_from_key(
                bucket.floor
            )  # the start point: below every event the bucket holds
        # Resumed: placed after the token by resume_after, from the first event the bucket holds.
        position = bucket.base if token is not None else bucket.end
        cid = self.registry.new_id()
        lsid = cmd.get("lsid")
        # Like the server: a cursor belongs to the user who opened it (with an upstream login, see
        # _user) and, if opened in a session, to that session too.
        cur = BucketCursor(
            cid,
            stream,
            bucket,
            position,
            owner=session_id(lsid["id"]) if lsid else b"",
            ns=CURSOR_NS,
            batch_size=batch_size or None,
            user=user,
            last_used=trio.current_time(),
        )
        if token is not None:
            cur.resume_after(token)
        else:
            cur.last_key, cur.last_token = bucket.frontier, bucket.frontier_token
        bucket.cursors.add(cur)
        bucket.last_read = trio.current_time()  # a consumer arrives: not stalled (Bucket.put)
        self.cursors[cid] = cur
        return cur

    async def _attach_bucket(
        self,
        user: str,
        name: str,
        i: int,
        n: int | None,
        cmd: dict[str, Any],
        batch_size: int | None,
    ) -> dict[str, Any]:
        stream, created = await self.stream_set.named(name, n, cmd, user)
        if i >= stream.options.n_buckets:
            raise MongoError(
                "BadValue", f"bucket must be below nBuckets ({stream.options.n_buckets})"
            )
        token = cmd.get("resumeAfter") or cmd.get("startAfter")
        if isinstance(token, list):
            raise MongoError(
                "BadValue", "attaching to one bucket takes one resumeAfter token, not a list"
            )
        if token is None:
            # Without a token, from the stream's start point: nothing it holds for the bucket is
            # skipped, and what retention has dropped since is re-read by a replay below.
            token = token_from_key(stream.buckets[i].start_floor)
        if token is not None and stream.buckets[i].position_after(start_point(token)[1]) is None:
            # Older than this bucket's retained history: re-read the oplogs for this bucket alone,
            # until the cursor reaches what the named stream's bucket holds.
            named = stream
            stream = await self.stream_set.replay(named, i, {**cmd, "resumeAfter": token})
            cur = self._new_cursor(user, stream, i, cmd, batch_size, token)
            self._private[cur.cursor_id] = stream
            cur.follow(named, lambda: self._close_private(cur.cursor_id))
        else:
            cur = self._new_cursor(user, stream, i, cmd, batch_size, token, from_start=created)
        events: list[EventRun] = []
        if batch_size:
            events, _ = await cur.next_batch(batch_size, 0, first=True)
        return {
            "cursor": cursor_document(
                cur.cursor_id, CURSOR_NS, "firstBatch", events, cur.last_token
            )
        }

    async def _replay_dropped(self, cur: BucketCursor) -> None:
        """Move `cur`, whose events its bucket dropped before it was first read (an unread cursor
        pins no retention, Bucket._safe) or no longer holds (it fell behind, buckets/catch_up.py),
        to a replay from its resume point, which hands it back to its stream's bucket once caught
        up, as an attach with an older token."""
        named, cid, i = cur.stream, cur.cursor_id, cur.bucket.index
        opts = named.options
        replay = await self.stream_set.replay(
            named,
            i,
            {
                "resumeAfter": cur.last_token,
                "fullDocument": opts.full_document,
                "fullDocumentBeforeChange": opts.full_document_before_change,
            },
        )
        cur.bucket.detach(cur)
        bucket = replay.buckets[i]
        cur.stream, cur.bucket, cur.position = replay, bucket, bucket.base
        bucket.cursors.add(cur)
        cur.resume_after(cur.last_token)
        cur.acked = cur.position
        self._private[cid] = replay
        cur.follow(named, lambda: self._close_private(cid))

    async def cmd_change_stream(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        try:
            reply = await self._accelerate_watch(session, db, cmd)
        except Decline:
            self.watches["passedThrough"] += 1
            raise
        self.watches["accelerated"] += 1
        return reply

    async def _accelerate_watch(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        """An ordinary `watch()` (aggregate with $changeStream), served from the shards in parallel.

        Only streams whose every event the engine reproduces exactly are accelerated: every
        fullDocument and fullDocumentBeforeChange mode, and the stages, operators and expressions
        mongoformats.change_stages evaluates (buckets/commands.py reads and plans it). Anything
        else raises Decline, so the proxy forwards the aggregate to mongos unchanged:
        acceleration never changes what a consumer sees.
        """
        if self.requires_auth and not session.user:
            raise Decline()  # mongos answers an unauthenticated aggregate with its own error
        if await self.stream_set.upstream_wire_version() < _V2_TOKENS_WIRE_VERSION:
            raise Decline()  # its streams carry v1 tokens (and older events): mongos's own, unchanged
        request = read_watch(db, cmd)
        if request.coll is not None and not await _is_collection_or_absent(
            session, db, request.coll
        ):
            raise Decline()  # mongos refuses a view (CommandNotSupportedOnView)
        if not await self._may_watch(session, request.resource):
            raise Decline()  # mongos answers Unauthorized, in its own words
        plan = plan_watch(request, cmd, shard_buffer_bytes=self.config.watch_shard_buffer_bytes)
        if (failed := await session.fail_point_reply("aggregate", db, cmd)) is not None:
            return failed
        try:
            stream = await self.stream_set.create(
                f"watch-{uuid.uuid4().hex[:8]}",
                1,
                plan.open,
                keep={0},
                scope=plan.scope,
                stages=plan.stages,
                keep_version=plan.keep_version,
            )
        except MongoError as exc:  # e.g. ChangeStreamHistoryLost, labelled as mongos labels it
            if exc.code_name == "ExceededMemoryLimit":
                # The stream mongos serves is the same stream, only slower: better than none.
                log.warning(
                    "watch() on %s passed through to the upstream: %s", cmd["aggregate"], exc
                )
                raise Decline() from None
            raise with_change_stream_label(exc) from None
        cur = self._new_cursor(
            session.user or "",
            stream,
            0,
            cmd,
            plan.batch_size,
            plan.open.get("resumeAfter"),
            from_start=True,
        )
        if plan.event_token is not None:
            cur.last_key, cur.last_token = token_sort_key(plan.event_token), dict(plan.event_token)
            cur.must_meet = plan.fragment[0] if plan.fragment is not None else cur.last_key
            cur.fragments_sent = plan.fragment[1] + 1 if plan.fragment is not None else 0
        cur.ns = plan.ns
        self._private[cur.cursor_id] = stream
        return {
            "cursor": {
                "firstBatch": [],
                "postBatchResumeToken": cur.last_token,
                "id": Int64(cur.cursor_id),
                "ns": cur.ns,
            }
        }

    async def _holds(self, session: ClientContext, action: str) -> bool:
        """Whether the client's user holds `action` on the cluster (always, without auth)."""
        return not self.requires_auth or allows(
            await session.privileges(), (action,), {"cluster": True}
        )

    def _owned(self, session: ClientContext, cid: int, cmd: dict[str, Any]) -> BucketCursor:
        check_lsid(cmd)
        return self.registry.owned(
            cid, lambda: self._user(session, next(iter(cmd))), cmd.get("lsid")
        )

    async def cmd_ddl(self, session: ClientContext, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """A DDL command on its way to mongos: recorded as notes when the upstream cannot show it."""
        name = next(iter(cmd))
        if not await self.stream_set.lacks_expanded_events() or not isinstance(cmd[name], str):
            raise Decline()
        ns = target_namespace(db, cmd)
        shards = (await self.stream_set.topology()).shards
        before = await self.stream_set.holders(shards, ns)
        specs = None
        if name == "dropIndexes" and before:
            target_db, _, coll = ns.partition(".")
            listed = await session.forward_command(target_db, {"listIndexes": coll})
            specs = {ix["name"]: ix for ix in listed.get("cursor", {}).get("firstBatch", [])}
        reply = await session.forward_command(db, cmd)
        if reply.get("ok"):
            after = await self.stream_set.holders(shards, ns)
            for note in plan_notes(cmd, ns, before, after, specs):
                data = ddl_note(
                    note.op_type,
                    note.ns,
                    ui=note.ui,
                    operation_description=note.operation_description,
                    state_before_change=note.state_before_change,
                )
                await self.stream_set.on_each_shard(
                    {s: shards[s] for s in note.shards},
                    "admin",
                    {"appendOplogNote": 1, "data": data},
                )
        return reply

    async def cmd_get_more(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        # The upstream's test fail points apply to getMores the engine answers too (ClientContext).
        if (failed := await session.fail_point_reply("getMore", db, cmd)) is not None:
            return failed
        more = get_more_request(cmd)
        cid = more.cursor_id
        cur = self._owned(session, cid, cmd)
        if f"{db}.{more.collection}" != cur.ns:
            raise MongoError(
                "Unauthorized",
                f"Requested getMore on namespace '{db}.{more.collection}', "
                f"but cursor belongs to a different namespace {cur.ns}",
            )
        if (fail := await session.fail_after_checkout()) is not None:
            raise with_change_stream_label(fail)  # like the server's: the cursor survives it
        if cur.busy:  # mongos pins a cursor for one operation at a time
            raise MongoError(
                "CursorInUse", f"Cursor already in use (namespace: '{cur.ns}', id: {cid})."
            )
        cur.busy = True  # a getMore waiting for events is a use: never timed out under it
        try:
            if self._behind_its_bucket(cur):
                await self._replay_dropped(cur)
            cur.read = True
            deadline = trio.current_time() + (more.max_time_ms or 0) / 1000
            events, pbrt = await cur.next_batch(more.batch_size, more.max_time_ms)
            if not events and self._behind_its_bucket(cur):  # its bucket fell behind meanwhile
                await self._replay_dropped(cur)
                left = max(0, int((deadline - trio.current_time()) * 1000))
                wait_ms = left if more.max_time_ms is not None else None
                events, pbrt = await cur.next_batch(more.batch_size, wait_ms)
        except MongoError as exc:
            self._drop_cursor(cid)
            raise with_change_stream_label(exc) from None
        finally:
            cur.busy, cur.last_used = False, trio.current_time()
        alive = not cur.exhausted
        if not alive:
            self._drop_cursor(cid)  # after an invalidate, as on the server: the cursor is closed
        return {"cursor": cursor_document(cid if alive else 0, cur.ns, "nextBatch", events, pbrt)}

    def _behind_its_bucket(self, cur: BucketCursor) -> bool:
        """A named stream's cursor whose next events its bucket does not hold: dropped before it
        was first read, or not held since the bucket fell behind (BucketCursor.stale)."""
        if cur.cursor_id in self._private:
            return False
        return (not cur.read and cur.position < cur.bucket.base) or cur.stale()

    async def cmd_kill_cursors(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        if (failed := await session.fail_point_reply("killCursors", db, cmd)) is not None:
            return failed
        killed, others = [], []
        ids = kill_cursors_ids(cmd)
        mine = [self.cursors[cid] for cid in ids if cid in self.cursors]
        # Every id is checked before any is killed: one the caller may not kill fails the
        # command, as the server checks authorization for all of them first.
        user = self._user(session, "killCursors") if mine else ""
        if any(cur.user != user for cur in mine) and not await self._holds(
            session, "killAnyCursor"
        ):
            raise MongoError("Unauthorized", f"not authorized to kill cursor on {CURSOR_NS}")
        for cid in ids:
            if cid in self.cursors:
                self._drop_cursor(cid)
                killed.append(Int64(cid))
            else:
                others.append(Int64(cid))
        reply: dict[str, Any] = {
            "cursorsKilled": killed,
            "cursorsNotFound": [],
            "cursorsAlive": [],
            "cursorsUnknown": [],
        }
        if others:  # ids of mongos's cursors in the same command: mongos kills those
            theirs = await session.forward_command(db, {**cmd, "cursors": others})
            if not theirs.get("ok"):
                return theirs
            for field_name in (
                "cursorsKilled",
                "cursorsNotFound",
                "cursorsAlive",
                "cursorsUnknown",
            ):
                reply[field_name] += theirs.get(field_name, [])
        return reply

    async def cmd_end_sessions(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        """endSessions, forwarded; the engine's cursors of those sessions are killed at the next
        session refresh (EngineConfig.session_refresh_s), when the server kills those it holds."""
        reply = await session.forward_command(db, cmd)
        if reply.get("ok") and isinstance(cmd["endSessions"], list):
            self.registry.note_ended(cmd["endSessions"])
        return reply

    async def cmd_kill_sessions(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        """killSessions / killAllSessions, forwarded; once mongos has accepted, the engine's
        cursors of those sessions are killed too, as the server closes a killed session's cursors
        (the unified test runner kills all sessions between tests)."""
        name = next(iter(cmd))
        reply = await session.forward_command(db, cmd)
        if not reply.get("ok"):
            return reply
        named = sessions_named(
            cmd,
            session.user or "",
            access_control=self.requires_auth,
            kill_any=await self._holds(session, "killAnySession"),
        )
        # Cursors opened outside any session belong to no session a command can name.
        self.registry.kill_where(
            lambda cur: bool(cur.owner) and named(cur.owner, cur.user),
            f"its session was killed ({name})",
        )
        return reply

    def _close_private(self, cid: int) -> None:
        self.registry.close_private(cid)

    def _drop_cursor(self, cid: int) -> None:
        self.registry.drop(cid)

    def _stream_owners(self) -> dict[str, str]:
        """Each stream's user: a named one's creator, a private one's cursor's user."""
        owners = {name: self.stream_set.owners.get(name, "") for name in self.streams}
        owners.update(self.registry.private_owners())
        return owners

    async def cmd_status(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        """Status of every stream, or of `name` with its merge frontier.

        With `after: [N tokens]` and `maxEvents: k` it also plans a micro-batch: `planEnd` is the
        highest token such that buckets hold at most k events in (after_i, planEnd] (admission
        control for Spark); without maxEvents, planEnd is the frontier.
        """
        user = self._user(session, "parallelChangeStreamStatus")
        check_status_command(cmd)
        name = cmd.get("name")
        streams = [s for n, s in sorted(self.all_streams().items()) if name in (None, n)]
        if name is not None and not streams:
            raise MongoError("NamespaceNotFound", f"no parallel change stream named {name!r}")
        cursors = list(self.cursors.values())
        if not await self._holds(session, "inprog"):
            owners = self._stream_owners()
            if name is not None and owners.get(name) != user:
                raise MongoError(
                    "Unauthorized", f"parallel change stream {name!r} was created by another user"
                )
            streams = [s for s in streams if owners.get(s.name) == user]
            cursors = [cur for cur in cursors if cur.user == user]
        out: dict[str, Any] = {
            "streams": [s.status() for s in streams],
            "cursors": len(cursors),
            "watches": dict(self.watches),
            "readerProcesses": self.reader_processes(),
            "cursorsTimedOut": self.cursors_timed_out,
            "streamsRebucketed": self.rebucketed,
            "memory": self.memory_status(),
        }
        if name is not None:
            out.update(frontier_status(streams[0], cmd))
        return out
