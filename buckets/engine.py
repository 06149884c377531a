"""The engine behind the proxy's `parallelChangeStream` commands.

Commands (admin database):
  {parallelChangeStream: 1, nBuckets: N, name?, startAtOperationTime? | resumeAfter? | startAfter?,
   showExpandedEvents?, pipeline?: [{$match: ...}], batchSize?, maxAwaitTimeMS?, shardBufferBytes?,
   bucketBufferBytes?, readerProcesses?, bucketBy?: "namespace" | "documentKey"}
      -> {cursors: [{id, ns, firstBatch, postBatchResumeToken, bucket}], name, nBuckets,
          bucketBy}
      Creates the stream `name` (a random name if omitted) or re-attaches to it. `resumeAfter` may
      be one token, or a list of N tokens (one per bucket) to resume a whole stream. The bucket
      count changes from a common token: a list of tokens all alike, whatever its length, is that
      one token, and a name open with another nBuckets and no cursors is reopened with the new
      count.
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
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any

import trio
from bson import Int64

from buckets.commands import (
    check_status_command,
)
from buckets.config import EngineConfig as EngineConfig  # wireproxy imports it from here
from buckets.cursor import BucketCursor
from buckets.cursors import CursorRegistry
from buckets.ddl_notes import DDL_COMMANDS, Note, plan_notes, target_namespace
from buckets.engine_base import CURSOR_NS as CURSOR_NS
from buckets.engine_base import Access
from buckets.engine_open import StreamCommands
from buckets.engine_watch import WatchCommands
from buckets.event_run import EventRun
from buckets.ports import ClientContext, Connector, ConnectUpstream, Decline, Handler
from buckets.reader_process import reader_pool
from buckets.reply import cursor_document
from buckets.stream import ParallelStream
from buckets.streams import StreamSet, frontier_status
from mongoformats.change_events import ddl_note
from mongoformats.errors import MongoError, with_change_stream_label
from mongoformats.idl import GetMore, check_lsid, get_more_request, kill_cursors_ids
from mongoformats.sessions import sessions_named

log = logging.getLogger("buckets.engine")

_KILL_REPLY_FIELDS = ("cursorsKilled", "cursorsNotFound", "cursorsAlive", "cursorsUnknown")


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


async def _index_specs(session: ClientContext, ns: str) -> dict[str, Any]:
    """The indexes of `ns` by name, as the client's listIndexes returns them."""
    target_db, _, coll = ns.partition(".")
    listed = await session.forward_command(target_db, {"listIndexes": coll})
    return {ix["name"]: ix for ix in listed.get("cursor", {}).get("firstBatch", [])}


class Engine:
    """The engine as the proxy sees it: a facade over the cursor registry, the streams (and the
    memory pool and reader processes they share), and the commands served on them."""

    def __init__(
        self,
        connect_upstream: ConnectUpstream,
        config: EngineConfig | None = None,
        *,
        connect_member: Connector,
        requires_auth: bool = False,
    ) -> None:
        self.connect_upstream = connect_upstream
        # Shard members, with the same TLS settings as mongos; it keeps the members it saw failing.
        self.connect_member = connect_member
        self.config = config or EngineConfig()
        self.access = Access(requires_auth)
        self.registry = CursorRegistry(
            self.config.cursor_timeout_s, self.config.session_cursor_timeout_s
        )
        self.cursors = self.registry.cursors
        self.stream_set = StreamSet(connect_upstream, connect_member, self.config, self.registry)
        self.streams = self.stream_set.streams
        self.memory, self.memory_limit = self.stream_set.memory, self.stream_set.memory_limit
        self.opens = StreamCommands(self.access, self.registry, self.stream_set)
        self.watch = WatchCommands(self.access, self.registry, self.stream_set, self.config)
        # watch() aggregates served by the engine / forwarded to the upstream (status, /metrics)
        self.watches = self.watch.watches

    def commands(self) -> EngineCommands:
        """The commands the engine serves, for the proxy to route to it."""
        named: dict[str, Handler] = {
            "parallelChangeStream": self.opens.cmd_open,
            "parallelChangeStreamStatus": self.cmd_status,
            "dropParallelChangeStream": self.opens.cmd_drop,
            "endSessions": self.cmd_end_sessions,
            **dict.fromkeys(DDL_COMMANDS, self.cmd_ddl),
            **dict.fromkeys(
                ("killSessions", "killAllSessions", "killAllSessionsByPattern"),
                self.cmd_kill_sessions,
            ),
        }
        return EngineCommands(
            named=named,
            change_stream=self.watch.cmd_change_stream,
            get_more=self.cmd_get_more,
            kill_cursors=self.cmd_kill_cursors,
            cursors=self.cursors.keys(),
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # A reader process that reads nothing is stopped after reader_idle_s.
        pool_of_readers = reader_pool(
            self.config.reader_idle_s, self.config.hang_timeout_s, memory=self.memory
        )
        try:
            async with pool_of_readers as pool, trio.open_nursery() as nursery:
                self.stream_set.nursery, self.stream_set.reader_pool = nursery, pool
                task_status.started()
                await self._housekeep()
        finally:
            with trio.CancelScope(shield=True):
                await self.stream_set.spare.aclose()

    async def _housekeep(self) -> None:
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

    async def cmd_ddl(self, session: ClientContext, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """A DDL command on its way to mongos: recorded as notes when the upstream cannot show
        it."""
        name = next(iter(cmd))
        if not await self.stream_set.lacks_expanded_events() or not isinstance(cmd[name], str):
            raise Decline()
        ns = target_namespace(db, cmd)
        shards = (await self.stream_set.topology()).shards
        before = await self.stream_set.holders(shards, ns)
        specs = None
        if name == "dropIndexes" and before:
            specs = await _index_specs(session, ns)
        reply = await session.forward_command(db, cmd)
        if reply.get("ok"):
            after = await self.stream_set.holders(shards, ns)
            for note in plan_notes(cmd, ns, before, after, specs):
                await self._write_note(note, shards)
        return reply

    async def _write_note(self, note: Note, shards: Mapping[str, list[tuple[str, int]]]) -> None:
        """`note` appended to the oplog of each shard it names."""
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

    async def cmd_get_more(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        # The upstream's test fail points apply to getMores the engine answers too (ClientContext).
        if (failed := await session.fail_point_reply("getMore", db, cmd)) is not None:
            return failed
        more = get_more_request(cmd)
        cid = more.cursor_id
        cur = await self._check_out(session, db, cmd, more)
        cur.busy = True  # a getMore waiting for events is a use: never timed out under it
        try:
            events, pbrt = await self._next_batch(cur, more)
        except MongoError as exc:
            self.registry.drop(cid)
            raise with_change_stream_label(exc) from None
        finally:
            cur.busy, cur.last_used = False, trio.current_time()
        alive = not cur.exhausted
        if not alive:
            self.registry.drop(cid)  # after an invalidate, as on the server: the cursor is closed
        return {"cursor": cursor_document(cid if alive else 0, cur.ns, "nextBatch", events, pbrt)}

    def _owned(self, session: ClientContext, cid: int, cmd: dict[str, Any]) -> BucketCursor:
        check_lsid(cmd)
        return self.registry.owned(
            cid, lambda: self.access.user(session, next(iter(cmd))), cmd.get("lsid")
        )

    async def _check_out(
        self, session: ClientContext, db: str, cmd: dict[str, Any], more: GetMore
    ) -> BucketCursor:
        """The cursor a getMore names, if the client may use it now."""
        cur = self._owned(session, more.cursor_id, cmd)
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
                "CursorInUse",
                f"Cursor already in use (namespace: '{cur.ns}', id: {more.cursor_id}).",
            )
        return cur

    async def _next_batch(
        self, cur: BucketCursor, more: GetMore
    ) -> tuple[list[EventRun], Mapping[str, Any]]:
        """A getMore's batch, from a replay if the cursor's bucket no longer holds its events."""
        if self._behind_its_bucket(cur):
            await self.opens.replay_dropped(cur)
        cur.read = True
        deadline = trio.current_time() + (more.max_time_ms or 0) / 1000
        events, pbrt = await cur.next_batch(more.batch_size, more.max_time_ms)
        if not events and self._behind_its_bucket(cur):  # its bucket fell behind meanwhile
            await self.opens.replay_dropped(cur)
            left = max(0, int((deadline - trio.current_time()) * 1000))
            wait_ms = left if more.max_time_ms is not None else None
            events, pbrt = await cur.next_batch(more.batch_size, wait_ms)
        return events, pbrt

    def _behind_its_bucket(self, cur: BucketCursor) -> bool:
        """A named stream's cursor whose next events its bucket does not hold: dropped before it
        was first read, or not held since the bucket fell behind (BucketCursor.stale)."""
        if cur.cursor_id in self.registry.private:
            return False
        return (not cur.read and cur.position < cur.bucket.base) or cur.stale()

    async def cmd_kill_cursors(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        if (failed := await session.fail_point_reply("killCursors", db, cmd)) is not None:
            return failed
        killed, others = [], []
        ids = kill_cursors_ids(cmd)
        await self._check_may_kill(session, ids)
        for cid in ids:
            if cid in self.cursors:
                self.registry.drop(cid)
                killed.append(Int64(cid))
            else:
                others.append(Int64(cid))
        reply: dict[str, Any] = {field: [] for field in _KILL_REPLY_FIELDS}
        reply["cursorsKilled"] = killed
        if others:  # ids of mongos's cursors in the same command: mongos kills those
            theirs = await session.forward_command(db, {**cmd, "cursors": others})
            if not theirs.get("ok"):
                return theirs
            for field in _KILL_REPLY_FIELDS:
                reply[field] += theirs.get(field, [])
        return reply

    async def _check_may_kill(self, session: ClientContext, ids: list[int]) -> None:
        """Every id is checked before any is killed: one the caller may not kill fails the
        command, as the server checks authorization for all of them first."""
        mine = [self.cursors[cid] for cid in ids if cid in self.cursors]
        user = self.access.user(session, "killCursors") if mine else ""
        if any(cur.user != user for cur in mine) and not await self.access.holds(
            session, "killAnyCursor"
        ):
            raise MongoError("Unauthorized", f"not authorized to kill cursor on {CURSOR_NS}")

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
            access_control=self.access.requires_auth,
            kill_any=await self.access.holds(session, "killAnySession"),
        )
        # Cursors opened outside any session belong to no session a command can name.
        self.registry.kill_where(
            lambda cur: bool(cur.owner) and named(cur.owner, cur.user),
            f"its session was killed ({name})",
        )
        return reply

    def _stream_owners(self) -> dict[str, str]:
        """Each stream's user: a named one's creator, a private one's cursor's user."""
        owners = {name: self.stream_set.owners.get(name, "") for name in self.streams}
        owners.update(self.registry.private_owners())
        return owners

    def _users_own(
        self,
        user: str,
        name: str | None,
        streams: list[ParallelStream],
        cursors: list[BucketCursor],
    ) -> tuple[list[ParallelStream], list[BucketCursor]]:
        """The streams and cursors of `user`'s; Unauthorized if the stream `name` is not."""
        owners = self._stream_owners()
        if name is not None and owners.get(name) != user:
            raise MongoError(
                "Unauthorized", f"parallel change stream {name!r} was created by another user"
            )
        return (
            [s for s in streams if owners.get(s.name) == user],
            [cur for cur in cursors if cur.user == user],
        )

    async def cmd_status(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        """Status of every stream, or of `name` with its merge frontier.

        With `after: [N tokens]` and `maxEvents: k` it also plans a micro-batch: `planEnd` is the
        highest token such that buckets hold at most k events in (after_i, planEnd] (admission
        control for Spark); without maxEvents, planEnd is the frontier.
        """
        user = self.access.user(session, "parallelChangeStreamStatus")
        check_status_command(cmd)
        name = cmd.get("name")
        streams = [s for n, s in sorted(self.all_streams().items()) if name in (None, n)]
        if name is not None and not streams:
            raise MongoError("NamespaceNotFound", f"no parallel change stream named {name!r}")
        cursors = list(self.cursors.values())
        if not await self.access.holds(session, "inprog"):
            streams, cursors = self._users_own(user, name, streams, cursors)
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
