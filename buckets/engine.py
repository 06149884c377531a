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

import decimal
import logging
import random
import uuid
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any

import bson
import trio
from bson import Decimal128, Int64, Timestamp

from buckets._columnar.event_block import is_block
from buckets.bucketing import BUCKET_BY, MAX_BUCKETS
from buckets.commands import (
    BEFORE_CHANGE,
    FULL_DOCUMENT,
    check_pipeline,
    plan_watch,
    read_watch,
)
from buckets.ddl_notes import DDL_COMMANDS, EXPANDED_EVENTS_WIRE_VERSION, plan_notes, target_namespace
from buckets.memory_limit import (
    DEAL_HEADROOM_BYTES,
    MemoryPool,
    default_memory_limit,
    shaping_processes,
    stream_floor,
)
from buckets.ports import ClientContext, Connector, ConnectUpstream, Decline, Handler
from buckets.reader_process import ReaderPool, reader_pool
from buckets.stream import BucketCursor, ParallelStream, StreamOptions, start_point
from buckets.topology import Topology, discover
from mongoformats.change_events import EV_RAW, EventFields, ddl_note
from mongoformats.change_stages import compile_stages
from mongoformats.errors import MongoError, with_change_stream_label
from mongoformats.expressions import VARIABLES
from mongoformats.idl import (
    SAFE_INT64,
    check_depth,
    check_lsid,
    get_more_request,
    kill_cursors_ids,
    type_name,
    wrong_type,
)
from mongoformats.large_events import SPLIT_STAGE, without_split_stage
from mongoformats.mql import unsupported_in_query
from mongoformats.oplog_splice import SplicedDocument
from mongoformats.oplog_splice import cursor_document as splice_cursor
from mongoformats.privileges import allows, change_stream_resource
from mongoformats.resume_token import (
    decode_token,
    high_water_mark,
    token_from_key,
    token_sort_key,
)
from mongoformats.sessions import session_id, sessions_named

log = logging.getLogger("buckets.engine")

CURSOR_NS = "admin.$cmd.parallelChangeStream"
_OPEN_FIELDS = frozenset({
    "parallelChangeStream", "nBuckets", "name", "bucket", "pipeline", "fullDocument", "showExpandedEvents",
    "showSystemEvents",
    "startAtOperationTime", "resumeAfter", "startAfter", "batchSize", "maxAwaitTimeMS", "shardBufferBytes",
    "bucketBufferBytes", "readerProcesses", "fullDocumentBeforeChange", "bucketBy",
    # generic fields drivers add to every command
    "lsid", "$clusterTime", "$readPreference", "txnNumber", "autocommit", "apiVersion", "comment",
    "$db", "readConcern", "writeConcern"})


# A bucket cursor no getMore has used for this long is no longer read (consumers getMore again
# within their await time, a second or so), so it no longer holds its stream's bucket count.
CURSOR_IN_USE_S = 10.0

# Servers from 6.1 on (wire version 18) write v2 resume tokens, as the engine does; older ones v1.
_V2_TOKENS_WIRE_VERSION = 18


@dataclass(frozen=True)
class EngineConfig:
    shard_buffer_bytes: int = 1 << 30
    bucket_buffer_bytes: int = 64 << 20
    idle_teardown_s: float = 300.0     # a stream with no cursors for this long is torn down
    max_await_ms: int = 1000
    reader_await_ms: int = 200
    reader_processes: int = 0          # default for streams that do not pass readerProcesses
    # A reader process that has read nothing this long is stopped. Its own setting, not the
    # stream teardown's: a process costs a second of CPU to start (imports), a stream nothing.
    reader_idle_s: float = 300.0
    # A reader process that answers nothing for this long (stopped, its loop stuck) is killed,
    # failing its streams as a death does (None: never); the proxy's upstream_timeout_s.
    hang_timeout_s: float | None = 30.0
    # A cursor no getMore has used for this long is killed, as the server's cursorTimeoutMillis
    # (10 min) kills idle cursors; one opened in a session lives as long as its session would on
    # the server (logicalSessionTimeoutMinutes, 30 min), counted from the cursor's last use.
    # Otherwise the cursor of a consumer that vanished (a crashed app's watch(), a killed Spark
    # task) kept its stream reading every shard, and its buffers full, for the proxy's lifetime.
    cursor_timeout_s: float = 600.0
    session_cursor_timeout_s: float = 1800.0
    # Cursors of sessions a client ended (endSessions) are killed at the next session refresh,
    # as the server's logical session cache does every logicalSessionRefreshMillis (5 min).
    session_refresh_s: float = 300.0
    # What every stream's budgets hold, and every reader process, is counted under this
    # (buckets/memory_limit.py); 0: half of the machine's (or the cgroup's) memory.
    memory_limit_bytes: int = 0
    # An accelerated watch() has one consumer, which cannot drain faster than a few batches of
    # read-ahead give it; its shards' budgets are this.
    watch_shard_buffer_bytes: int = 64 << 20


def cursor_document(cursor_id: int, ns: str, batch_field: str, events: list[Any],
                    pbrt: Mapping[str, Any]) -> SplicedDocument:
    """A reply's `cursor` sub-document, its batch spliced from the events' bytes (no re-encoding);
    `events` are EventFields and EventBlocks."""
    return splice_cursor(cursor_id, ns, batch_field, [ev if is_block(ev) else ev[EV_RAW] for ev in events],
                         {"postBatchResumeToken": pbrt})


def _mentions_full_document(stages: Any) -> bool:
    """True if a field path anywhere in `stages` starts with fullDocument (or fullDocumentBeforeChange),
    or an expression reads the whole event ($$ROOT, $$CURRENT), which holds those fields."""
    if isinstance(stages, Mapping):
        return any(str(k).startswith("fullDocument") or _mentions_full_document(v) for k, v in stages.items())
    if isinstance(stages, list):
        return any(_mentions_full_document(v) for v in stages)
    if not isinstance(stages, str):
        return False
    variable, _, path = stages.partition(".") if stages.startswith("$$") else ("", "", stages[1:])
    return (variable in VARIABLES and not path) or (stages.startswith("$") and path.startswith("fullDocument"))


def _int_option(cmd: Mapping[str, Any], name: str, low: int, high: int, *,
                command: str = "parallelChangeStream") -> int | None:
    """An optional integer field: TypeMismatch (IDL's message) for a value that is no number,
    BadValue for a number out of [low, high] or without an integer value."""
    value = cmd.get(name)
    if value is None:  # absent or null: the server's parsers take a null optional field as absent
        return None
    if type_name(value) not in SAFE_INT64:
        raise wrong_type(f"{command}.{name}", value, *SAFE_INT64)
    number = value.to_decimal() if isinstance(value, Decimal128) else value
    # Range first, then integrality: int() of an infinite or NaN number raises (a float NaN fails
    # the range; a Decimal NaN raises on any comparison, so it is tested first).
    if isinstance(number, decimal.Decimal) and number.is_nan() or not low <= number <= high \
            or int(number) != number:
        raise MongoError("BadValue", f"{name} must be an integer between {low} and {high}, "
                         f"not {_shown(value)}")
    return int(number)


def _shown(value: Any, limit: int = 100) -> str:
    """`value` for an error message, cut to `limit` characters: a client's junk is not echoed
    whole."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


_MAX_BYTES = 1 << 50         # a byte budget above this is a typo, not memory
MAX_READER_PROCESSES = 64    # the most a stream (readerProcesses) or the engine's default may ask
# The stream settings an open command may pass, with their ranges (defaults: EngineConfig).
_SETTINGS = {"shardBufferBytes": (1, _MAX_BYTES), "bucketBufferBytes": (1, _MAX_BYTES),
             "maxAwaitTimeMS": (0, (1 << 31) - 1), "readerProcesses": (0, MAX_READER_PROCESSES)}

# Stream names: at most the server's namespace length (NamespaceString's MaxNsLen, 255 bytes,
# InvalidNamespace beyond); they are also labels of /metrics and keys of status.
MAX_NAME_BYTES = 255


def check_stream_name(name: Any, command: str) -> str | None:
    """A stream name (None: none given): a string of at most MAX_NAME_BYTES UTF-8 bytes."""
    if name is None:
        return None
    if not isinstance(name, str):
        raise wrong_type(f"{command}.name", name, "string")
    if len(name.encode(errors="surrogatepass")) > MAX_NAME_BYTES:
        raise MongoError("InvalidNamespace", f"stream name is longer than {MAX_NAME_BYTES} bytes")
    return name


def _check_token(token: Any, path: str) -> None:
    if not isinstance(token, Mapping):
        raise wrong_type(path, token, "object")
    decode_token(token)  # 40647, 40648, FailedToParse, InvalidResumeToken as the server's


def check_status_command(cmd: dict[str, Any]) -> None:
    """The fields of a parallelChangeStreamStatus command, typed as check_open_command types
    them."""
    check_depth(cmd)
    check_lsid(cmd)
    check_stream_name(cmd.get("name"), "parallelChangeStreamStatus")
    after = cmd.get("after")
    if after is not None:
        if not isinstance(after, list):
            raise wrong_type("parallelChangeStreamStatus.after", after, "array")
        if len(after) > MAX_BUCKETS:
            raise MongoError("BadValue", f"after has {len(after)} tokens: at most {MAX_BUCKETS}, "
                             "one per bucket")
        for i, token in enumerate(after):
            _check_token(token, f"parallelChangeStreamStatus.after.{i}")
    _int_option(cmd, "maxEvents", 1, 1 << 62, command="parallelChangeStreamStatus")


def _setting(cmd: Mapping[str, Any], name: str, default: int) -> int:
    """One of _SETTINGS (checked when the command came in, check_open_command), or its default."""
    value = _int_option(cmd, name, *_SETTINGS[name])
    return default if value is None else value


def check_open_command(cmd: dict[str, Any]) -> dict[str, Any]:
    """Every field of a parallelChangeStream command checked before anything is created, with the
    codes and messages of the server's parsers for the same fields of $changeStream (TypeMismatch
    for a wrong type, BadValue for a bad value, IDLUnknownField, 7749501 for a long pipeline):
    a malformed command fails, never the stream later. The command, null options left out (the
    server's parsers take a null optional field as absent)."""
    check_depth(cmd)
    for key in cmd:
        if key not in _OPEN_FIELDS:
            raise MongoError("IDLUnknownField", "BSON field "
                             f"'parallelChangeStream.{_shown(key)}' is an unknown field.")
    first = next(iter(cmd))
    cmd = {k: v for k, v in cmd.items() if v is not None or k == first}
    check_lsid(cmd)
    if sum(k in cmd for k in ("startAtOperationTime", "resumeAfter", "startAfter")) > 1:
        raise MongoError(40674,
                         "Only one type of resume option is allowed, but multiple were found.")
    for name, (low, high) in _SETTINGS.items():
        _int_option(cmd, name, low, high)
    _int_option(cmd, "nBuckets", 1, MAX_BUCKETS)
    _int_option(cmd, "bucket", 0, MAX_BUCKETS - 1)
    _int_option(cmd, "batchSize", 0, 1 << 30)
    for field in ("fullDocument", "fullDocumentBeforeChange"):
        if field in cmd and not isinstance(cmd[field], str):
            raise wrong_type(f"parallelChangeStream.{field}", cmd[field], "string")
    for flag in ("showExpandedEvents", "showSystemEvents"):
        if flag in cmd and not isinstance(cmd[flag], bool):
            raise wrong_type(f"parallelChangeStream.{flag}", cmd[flag], "bool")
    if "bucketBy" in cmd:
        if not isinstance(cmd["bucketBy"], str):
            raise wrong_type("parallelChangeStream.bucketBy", cmd["bucketBy"], "string")
        if cmd["bucketBy"] not in BUCKET_BY:
            raise MongoError("BadValue", f"'{_shown(cmd['bucketBy'])}' is not a valid bucketBy option; "
                             f"use one of {', '.join(BUCKET_BY)}")
    if "startAtOperationTime" in cmd and not isinstance(cmd["startAtOperationTime"], Timestamp):
        raise wrong_type("parallelChangeStream.startAtOperationTime", cmd["startAtOperationTime"],
                         "timestamp")
    check_stream_name(cmd.get("name"), "parallelChangeStream")
    check_pipeline(cmd.get("pipeline"), "parallelChangeStream")
    for field in ("resumeAfter", "startAfter"):
        if field not in cmd:
            continue
        tokens = cmd[field]
        if isinstance(tokens, list):
            if not tokens or len(tokens) > MAX_BUCKETS:
                raise MongoError("BadValue", f"{field} takes one token, or a list of 1 to "
                                 f"{MAX_BUCKETS} bucket tokens, not {len(tokens)}")
            for i, token in enumerate(tokens):
                _check_token(token, f"parallelChangeStream.{field}.{i}")
        else:
            _check_token(tokens, f"parallelChangeStream.{field}")
    return cmd


def _one_token_if_common(cmd: dict[str, Any], n: int | None) -> dict[str, Any]:
    """`cmd` with a `resumeAfter`/`startAfter` list of bucket tokens checked against `n`: a list of
    another length is accepted only when its tokens are all the same (a common token), and is
    then that one token.

    Why: bucket i of an N-bucket stream holds the namespaces with crc32(ns) % N == i, so its
    token says nothing of where a namespace dealt to another bucket of an M-bucket stream stands.
    At a common token every namespace stands at the same point, which any bucket count can
    resume from. (Spark's micro-batches all end at one planned token, so its checkpoints hold one.)
    """
    for field in ("resumeAfter", "startAfter"):
        tokens = cmd.get(field)
        if not isinstance(tokens, list) or n is None or len(tokens) == n:
            continue
        if len({token_sort_key(t) for t in tokens}) != 1:
            raise MongoError("BadValue", f"{field} has {len(tokens)} bucket tokens but nBuckets is {n}: tokens of a "
                             "stream with another bucket count resume it only if they are all the same token "
                             "(read every bucket up to one token first)")
        return {**cmd, field: tokens[0]}
    return cmd


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
    reply = await session.forward_command(db, {"listCollections": 1, "filter": {"name": coll},
                                               "cursor": {}})
    cursor = reply.get("cursor") if reply.get("ok") else None
    batch = cursor.get("firstBatch") if isinstance(cursor, dict) else None
    return isinstance(batch, list) and all(
        isinstance(c, dict) and c.get("type", "collection") == "collection" for c in batch)


class Engine:
    def __init__(self, connect_upstream: ConnectUpstream, config: EngineConfig | None = None, *,
                 connect_member: Connector, requires_auth: bool = False) -> None:
        self.connect_upstream = connect_upstream
        # The upstream requires authentication (the proxy logs in with its own credentials), so a
        # client must have logged in on its connection before the engine serves it.
        self.requires_auth = requires_auth
        # Shard members, with the same TLS settings as mongos; it keeps the members it saw failing.
        self.connect_member = connect_member
        self.config = config or EngineConfig()
        self.streams: dict[str, ParallelStream] = {}
        self.cursors: dict[int, BucketCursor] = {}
        self._private: dict[int, ParallelStream] = {}   # watch() and replay streams, by their one cursor
        self._creating: dict[str, trio.Event] = {}     # named streams being created, set once done
        self._owners: dict[str, str] = {}               # named stream -> its creator's identity
        self._ended_sessions: set[bytes] = set()      # ended since the last session refresh (cursor owners)
        self._rng = random.Random()
        self._nursery: trio.Nursery | None = None
        self._reader_pool: ReaderPool | None = None  # reader processes, shared by every stream
        self._upstream_wire_version: int | None = None  # learned on first use (see lacks_expanded_events)
        # watch() aggregates served by the engine / forwarded to the upstream (status and /metrics)
        self.watches = {"accelerated": 0, "passedThrough": 0}
        self.cursors_timed_out = 0  # idle cursors killed (serverStatus' metrics.cursor.timedOut)
        self.rebucketed = 0         # named streams reopened with another nBuckets
        self.memory_limit = self.config.memory_limit_bytes or default_memory_limit()
        # Every stream's budgets take their bytes from it too (buckets/memory_limit.py).
        self.memory = MemoryPool(self.memory_limit)
        self.refused_for_memory = 0  # opens refused, and watch()es passed through, for the memory limit

    def commands(self) -> EngineCommands:
        """The commands the engine serves, for the proxy to route to it."""
        named: dict[str, Handler] = {
            "parallelChangeStream": self.cmd_open,
            "parallelChangeStreamStatus": self.cmd_status,
            "dropParallelChangeStream": self.cmd_drop,
            "endSessions": self.cmd_end_sessions,
            **dict.fromkeys(DDL_COMMANDS, self.cmd_ddl),
            **dict.fromkeys(("killSessions", "killAllSessions", "killAllSessionsByPattern"),
                            self.cmd_kill_sessions)}
        return EngineCommands(named=named, change_stream=self.cmd_change_stream,
                              get_more=self.cmd_get_more, kill_cursors=self.cmd_kill_cursors,
                              cursors=self.cursors.keys())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # A reader process that reads nothing is stopped after reader_idle_s.
        pool_of_readers = reader_pool(self.config.reader_idle_s, self.config.hang_timeout_s,
                                      memory=self.memory)
        async with pool_of_readers as pool, trio.open_nursery() as nursery:
            self._nursery, self._reader_pool = nursery, pool
            task_status.started()
            next_refresh = trio.current_time() + self.config.session_refresh_s
            while True:
                await trio.sleep(1)
                if trio.current_time() >= next_refresh:
                    next_refresh += self.config.session_refresh_s
                    self._reap_ended_sessions()
                self._kill_idle_cursors()
                self._tear_down_idle()

    def all_streams(self) -> dict[str, ParallelStream]:
        """Named streams and the private ones each serving one cursor (an accelerated watch(), a
        bucket re-read from the oplogs), by name: status and /metrics show both."""
        return {**self.streams, **{s.name: s for s in self._private.values()}}

    def memory_reserved(self) -> int:
        """What counts against the memory limit: each budget's floor or what it holds, if more,
        and the reader processes (buckets/memory_limit.py)."""
        return self.memory.counted

    def memory_status(self) -> dict[str, int]:
        """limitBytes; reservedBytes, what counts against it; heldBytes, what the budgets hold;
        floorBytes, what the open streams are admitted by; readerProcessBytes; memoryWaits, takes
        that waited for room in the pool; streamsRefused."""
        return {**self.memory.status(), "memoryWaits": self.memory.refusals,
                "streamsRefused": self.refused_for_memory}

    def reader_processes(self) -> list[dict[str, Any]]:
        """The shared reader processes: index, alive, tails (shards of streams) each reads."""
        return self._reader_pool.status() if self._reader_pool is not None else []

    def _kill_idle_cursors(self) -> None:
        now = trio.current_time()

        def idle(cur: BucketCursor) -> bool:
            limit = self.config.session_cursor_timeout_s if cur.owner else self.config.cursor_timeout_s
            return not cur.busy and now - cur.last_used > limit
        self.cursors_timed_out += self._kill_cursors_where(idle, "unused for the cursor timeout")

    def _reap_ended_sessions(self) -> None:
        ended, self._ended_sessions = self._ended_sessions, set()
        self._kill_cursors_where(lambda cur: cur.owner in ended, "its session was ended")

    def _kill_cursors_where(self, match: Callable[[BucketCursor], bool], why: str) -> int:
        """Kill every cursor `match` selects (timeouts, ended or killed sessions); how many."""
        doomed = [cid for cid, cur in self.cursors.items() if match(cur)]
        for cid in doomed:
            log.info("killing cursor %d of stream %s: %s", cid, self.cursors[cid].stream.name, why)
            self._drop_cursor(cid)
        return len(doomed)

    def _make_room(self, need: int) -> None:
        """Close streams without cursors, least recently used first, until `need` more bytes fit
        under the memory limit (MemoryPool.check_admits). Such a stream is kept only so that a
        consumer can re-attach to its retained events until the idle teardown; one re-attaching
        later reopens it from its token. Streams with cursors are never closed to admit another,
        and if closing every idle stream would still not make room, none is closed: the new
        stream is refused either way."""
        idle = sorted((s for s in self.streams.values() if not s.has_cursors()), key=lambda s: s.last_active)
        over = self.memory.counted + need + DEAL_HEADROOM_BYTES - self.memory_limit
        if over <= 0 or over > sum(s.memory()["countedBytes"] for s in idle):
            return
        for stream in idle:
            if self.memory.counted + need + DEAL_HEADROOM_BYTES <= self.memory_limit:
                break
            self._close_named(stream, "tearing down idle stream %s early: its memory is needed for "
                                      "a new stream")

    def _tear_down_idle(self) -> None:
        now = trio.current_time()
        for stream in list(self.streams.values()):
            if stream.has_cursors():
                stream.last_active = now
            elif now - stream.last_active > self.config.idle_teardown_s:
                self._close_named(stream, "tearing down idle stream %s")

    def _close_named(self, stream: ParallelStream, why: str) -> None:
        """Close a named stream and forget it; `why` is logged, with %s for its name."""
        log.info(why, stream.name)
        stream.close()
        del self.streams[stream.name]
        self._owners.pop(stream.name, None)

    # -- upstream helpers --------------------------------------------------------------------------

    async def upstream_wire_version(self) -> int:
        if self._upstream_wire_version is None:
            up = await self.connect_upstream()
            try:
                hello = await up.command("admin", {"hello": 1})
            finally:
                await up.aclose()
            self._upstream_wire_version = int(hello.get("maxWireVersion", 0))
        return self._upstream_wire_version

    async def lacks_expanded_events(self) -> bool:
        """True for an upstream before 6.0: DDL events then come from the proxy's notes."""
        return await self.upstream_wire_version() < EXPANDED_EVENTS_WIRE_VERSION

    async def _on_each_shard(self, shards: Mapping[str, list[tuple[str, int]]], db: str,
                             cmd: dict[str, Any]) -> dict[str, Any]:
        """Run `cmd` on every shard's primary directly (shard id -> reply)."""
        out: dict[str, Any] = {}
        for sid, hosts in shards.items():
            conn = await self.connect_member(hosts, secondary=False)
            try:
                out[sid] = await conn.command(db, cmd)
            finally:
                await conn.aclose()
        return out

    async def _holders(self, shards: Mapping[str, list[tuple[str, int]]], ns: str) -> dict[str, Any]:
        db, _, coll = ns.partition(".")
        replies = await self._on_each_shard(shards, db, {"listCollections": 1, "filter": {"name": coll}})
        return {sid: bson.decode(r.raw)["cursor"]["firstBatch"][0] for sid, r in replies.items()
                if r["cursor"]["firstBatch"]}

    async def _discover(self) -> Topology:
        up = await self.connect_upstream()
        try:
            return await discover(up)
        finally:
            await up.aclose()

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

    async def cmd_open(self, session: ClientContext, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        user = self._user(session, "parallelChangeStream")
        if db != "admin":
            raise MongoError("Unauthorized", "parallelChangeStream may only be run against the admin database.")
        # A parallel stream reads every namespace: a cluster-wide change stream's privileges.
        if not await self._may_watch(session, change_stream_resource(None, None)):
            raise MongoError("Unauthorized", "not authorized on admin to execute command { parallelChangeStream: 1 }: "
                             "it needs find and changeStream on every database ({db: '', collection: ''})")
        cmd = check_open_command(cmd)
        if cmd.get("fullDocument", "default") not in FULL_DOCUMENT:
            raise MongoError("BadValue", f"'{_shown(cmd['fullDocument'])}' is not a valid "
                             f"fullDocument option; use one of {', '.join(FULL_DOCUMENT)}")
        if cmd.get("fullDocumentBeforeChange", "off") not in BEFORE_CHANGE:
            raise MongoError("BadValue", f"'{_shown(cmd['fullDocumentBeforeChange'])}' is not a "
                             "valid fullDocumentBeforeChange option; use one of "
                             f"{', '.join(BEFORE_CHANGE)}")
        n = _int_option(cmd, "nBuckets", 1, MAX_BUCKETS)
        bucket = _int_option(cmd, "bucket", 0, MAX_BUCKETS - 1)
        cmd = _one_token_if_common(cmd, n)
        name = cmd.get("name")
        batch_size = _int_option(cmd, "batchSize", 0, 1 << 30)
        if bucket is not None:
            if name is None:
                raise MongoError("BadValue", "attaching to a bucket needs the stream's name")
            return await self._attach_bucket(user, name, bucket, n, cmd, batch_size)
        if n is None:
            raise MongoError("BadValue", "nBuckets is required: an integer between 1 and 1024")
        name = name or f"pcs-{uuid.uuid4().hex[:12]}"
        stream, created = await self._named(name, n, cmd, user)
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
                    raise MongoError("ChangeStreamHistoryLost",
                                     f"bucket {i} of stream {name!r} no longer holds events after "
                                     "that token; attach to the bucket alone to re-read them")
            cur = self._new_cursor(user, stream, i, cmd, batch_size, token, from_start=created)
            cur.lost = in_gap
            cursors.append({"id": Int64(cur.cursor_id), "ns": CURSOR_NS, "firstBatch": [],
                            "postBatchResumeToken": cur.last_token, "bucket": i})
        return {"cursors": cursors, "name": name, "nBuckets": n, "bucketBy": stream.options.bucket_by}

    async def cmd_drop(self, session: ClientContext, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """Close the stream `cmd["dropParallelChangeStream"]` and kill its cursors (see the module
        docstring): its creator's to drop, like every other use of a named stream."""
        user = self._user(session, "dropParallelChangeStream")
        if db != "admin":
            raise MongoError("Unauthorized",
                             "dropParallelChangeStream may only be run against the admin database.")
        check_depth(cmd)
        check_lsid(cmd)
        name = cmd["dropParallelChangeStream"]
        if not isinstance(name, str):
            raise wrong_type("dropParallelChangeStream", name, "string")
        check_stream_name(name, "dropParallelChangeStream")
        while (pending := self._creating.get(name)) is not None:
            await pending.wait()  # being created: dropped once it is (or found missing)
        stream = self.streams.get(name)
        if stream is None:
            raise MongoError("NamespaceNotFound", f"no parallel change stream named {name!r}")
        self._check_owner(name, user)
        # Its cursors, and those of replays that would move to it once caught up.
        doomed = [cid for cid, cur in self.cursors.items() if stream in (cur.stream, cur.join)]
        for cid in doomed:
            self._drop_cursor(cid)
        self._close_named(stream, "dropping stream %s (dropParallelChangeStream)")
        return {"name": name, "cursorsKilled": [Int64(cid) for cid in doomed]}

    def _check_owner(self, name: str, user: str) -> None:
        """Unauthorized (13) unless `user` created the named stream (see the module docstring)."""
        owner = self._owners.get(name)
        if owner is not None and owner != user:
            raise MongoError("Unauthorized", f"parallel change stream {name!r} was created by another user")

    async def _named(self, name: str, n: int | None, cmd: dict[str, Any],
                     user: str) -> tuple[ParallelStream, bool]:
        """The open stream `name`, or one created from `cmd` (then True). Commands that find it
        missing at once (the N Spark tasks of a micro-batch after a proxy restart each attach
        their bucket with nBuckets) wait for one creation: each made its own, and all but the
        last were left outside `streams`, never torn down, reading every shard for good."""
        while (pending := self._creating.get(name)) is not None:
            await pending.wait()
        stream = self.streams.get(name)
        if stream is not None:
            self._check_owner(name, user)  # before anything of hers is touched (a reopen kills her cursors)
        by = cmd.get("bucketBy")
        if stream is not None and ((n is not None and n != stream.options.n_buckets)
                                   or (by is not None and by != stream.options.bucket_by)):
            n = n or stream.options.n_buckets  # an attach with only another bucketBy keeps the count
            self._close_to_rebucket(stream, n, by or stream.options.bucket_by)
            stream = None
        if stream is not None:
            return stream, False
        if n is None:
            raise MongoError("BadValue", f"no parallel change stream named {name!r} is open on this proxy; "
                             "pass nBuckets (and resumeAfter) to open it")
        done = self._creating[name] = trio.Event()
        try:
            stream = await self._create(name, n, cmd)
            self._owners[name] = user
            return stream, True
        finally:
            del self._creating[name]
            done.set()

    def _close_to_rebucket(self, stream: ParallelStream, n: int, by: str) -> None:
        """Close `stream` so that its name can be opened again with `n` buckets dealt `by`.

        A bucketBy is part of a named stream's identity as nBuckets is: another one reopens it
        the same way (bucket tokens of one mode mean nothing in the other).

        Why: a Spark query restarted with another nBuckets (more tasks) reopens its stream under
        the same name from its checkpoint. Bucket tokens are per bucket count, so the old stream's
        retention cannot serve the new buckets; with no cursor reading it, nothing is lost by closing
        it, and the new stream re-reads from the given start. A stream whose cursors are in use is
        still someone's: refused (ConflictingOperationInProgress, which the caller may retry), so
        one job never pulls the buckets from under another. Cursors no getMore has used for
        CURSOR_IN_USE_S are a stopped consumer's (a Spark task cancelled mid-read never kills its
        cursor, and the cursor timeout is 10 minutes or more): they are killed with the stream.
        """
        now = trio.current_time()
        cursors = [cur for b in stream.buckets.values() for cur in b.cursors]
        in_use = sum(cur.busy or now - cur.last_used < CURSOR_IN_USE_S for cur in cursors)
        if in_use:
            raise MongoError("ConflictingOperationInProgress",
                             f"stream {stream.name!r} is open with nBuckets {stream.options.n_buckets} "
                             f"(bucketBy {stream.options.bucket_by}) and {in_use} cursor(s) read it; close "
                             f"them (or use another name) to reopen it with nBuckets {n} (bucketBy {by})")
        for cur in cursors:
            self._drop_cursor(cur.cursor_id)
        self._close_named(stream, f"reopening stream %s with {n} buckets by {by} instead of "
                                  f"{stream.options.n_buckets} by {stream.options.bucket_by} "
                                  f"({len(cursors)} abandoned cursors killed)")
        self.rebucketed += 1

    async def _create(self, name: str, n: int, cmd: dict[str, Any], *, keep: set[int] | None = None,
                      scope: tuple[str, str | None] | None = None,
                      stages: tuple[dict[str, Any], ...] = (),
                      keep_version: tuple[Timestamp, int] | None = None) -> ParallelStream:
        topology = await self._discover()
        now = topology.as_of
        tokens = cmd.get("resumeAfter", cmd.get("startAfter"))
        if keep_version is None and isinstance(tokens, Mapping):
            data = decode_token(tokens)
            keep_version = (data.cluster_time, data.version)
        if isinstance(tokens, list):
            floors = [token_sort_key(t) for t in tokens]
            start = min((start_point(t)[0] for t in tokens), key=lambda ts: (ts.time, ts.inc))
        elif tokens is not None:
            start, key = start_point(tokens)
            floors = [key] * n
        else:
            # Like the server, a stream with no start point sees what happens after now: the
            # newest write (at `now` itself) was before it opened.
            start = cmd.get("startAtOperationTime", Timestamp(now.time, now.inc + 1))
            if not isinstance(start, Timestamp):
                raise MongoError("TypeMismatch", "startAtOperationTime must be a Timestamp")
            floors = [token_sort_key(high_water_mark(start))] * n
        checked = check_pipeline(cmd.get("pipeline"), "parallelChangeStream")
        pipeline, split = without_split_stage(checked)
        queries = []
        for stage in pipeline:
            if set(stage) != {"$match"}:
                raise MongoError("BadValue", "parallelChangeStream pipelines may only contain $match stages "
                             f"(and a final {SPLIT_STAGE})")
            if (unsupported := unsupported_in_query(stage["$match"])) is not None:
                raise MongoError("BadValue", "parallelChangeStream's $match does not support "
                                 f"{_shown(unsupported)}")
            queries.append(stage["$match"])
        # One flat $and: its depth does not grow with the number of stages.
        match = None if not queries else queries[0] if len(queries) == 1 else {"$and": queries}
        if (cmd.get("fullDocument", "default") != "default" or cmd.get("fullDocumentBeforeChange", "off") != "off") \
                and _mentions_full_document(pipeline):
            # The $match runs as events are dealt, before any lookup: it would not see post-images.
            raise MongoError("BadValue", "with fullDocument: 'updateLookup' or fullDocumentBeforeChange, the "
                             "pipeline's $match may not test those fields (it runs before the lookups)")
        options = StreamOptions(
            n_buckets=n, show_expanded_events=bool(cmd.get("showExpandedEvents", False)),
            show_system_events=bool(cmd.get("showSystemEvents", False)), keep_version=keep_version,
            shard_buffer_bytes=_setting(cmd, "shardBufferBytes", self.config.shard_buffer_bytes),
            bucket_buffer_bytes=_setting(cmd, "bucketBufferBytes", self.config.bucket_buffer_bytes),
            max_await_ms=_setting(cmd, "maxAwaitTimeMS", self.config.max_await_ms),
            reader_await_ms=self.config.reader_await_ms, match=match, scope=scope,
            full_document=str(cmd.get("fullDocument", "default")),
            full_document_before_change=str(cmd.get("fullDocumentBeforeChange", "off")),
            stages=compile_stages(stages), split_large_events=split,
            reader_processes=_setting(cmd, "readerProcesses", self.config.reader_processes),
            bucket_by=str(cmd.get("bucketBy", "namespace")),
            ddl_notes=await self.lacks_expanded_events())
        kept = len(keep) if keep is not None else n
        # Admitted by its floor (what it always takes) and the reader processes it would start,
        # beside what the others hold; its budgets then take what they hold from the same pool.
        floor = stream_floor(len(topology.shards), kept)
        assert self._reader_pool is not None, "Engine.run() must be started first"
        starting = self._reader_pool.missing(options.reader_processes) \
            + shaping_processes(bool(options.stages), options.reader_processes)
        self._make_room(floor + starting * self.memory.process_bytes)
        try:
            self.memory.check_admits(floor, starting, streams=len(self.all_streams()),
                                     shards=len(topology.shards), buckets=kept,
                                     reader_processes=options.reader_processes)
        except MongoError:
            self.refused_for_memory += 1
            raise
        # The stream's accounts set its floor aside as it is made (no await between); its reader
        # processes are counted as starting until they count themselves (ReaderPool._keep), so
        # that streams created at once cannot each fit beside the others' absence.
        self.memory.add_processes(starting)  # (shaping ones then count in the stream's own account)
        try:
            stream = ParallelStream(name, options, topology, start, floors, keep=keep,
                                    connect_upstream=self.connect_upstream, connect_member=self.connect_member,
                                    readers_pool=self._reader_pool, memory=self.memory)
            return await self._start(stream, keep is None)
        finally:
            self.memory.add_processes(-starting)

    async def _start(self, stream: ParallelStream, named: bool) -> ParallelStream:
        """Run `stream` until it has opened (listed in `streams` if `named`), or fail as it
        failed."""
        try:
            stream.last_active = trio.current_time()
            assert self._nursery is not None, "Engine.run() must be started first"
            if named:
                stream.isolate()  # before its first events are dealt: see buckets/catch_up.py
            self._nursery.start_soon(stream.run)
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

    def _new_cursor(self, user: str, stream: ParallelStream, i: int, cmd: dict[str, Any],
                    batch_size: int | None, token: Mapping[str, Any] | None, *,
                    from_start: bool = False) -> BucketCursor:
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
            token = token_from_key(bucket.floor)  # the start point: below every event the bucket holds
        # Resumed: placed after the token by resume_after, from the first event the bucket holds.
        position = bucket.base if token is not None else bucket.end
        cid = (self._rng.getrandbits(62) << 1) | 1
        lsid = cmd.get("lsid")
        # Like the server: a cursor belongs to the user who opened it (with an upstream login, see
        # _user) and, if opened in a session, to that session too.
        cur = BucketCursor(cid, stream, bucket, position, owner=session_id(lsid["id"]) if lsid else b"",
                           ns=CURSOR_NS, batch_size=batch_size or None, user=user,
                           last_used=trio.current_time())
        if token is not None:
            cur.resume_after(token)
        else:
            cur.last_key, cur.last_token = bucket.frontier, bucket.frontier_token
        bucket.cursors.add(cur)
        bucket.last_read = trio.current_time()  # a consumer arrives: not stalled (Bucket.put)
        self.cursors[cid] = cur
        return cur

    async def _attach_bucket(self, user: str, name: str, i: int, n: int | None,
                             cmd: dict[str, Any], batch_size: int | None) -> dict[str, Any]:
        stream, created = await self._named(name, n, cmd, user)
        if i >= stream.options.n_buckets:
            raise MongoError("BadValue", f"bucket must be below nBuckets ({stream.options.n_buckets})")
        token = cmd.get("resumeAfter") or cmd.get("startAfter")
        if isinstance(token, list):
            raise MongoError("BadValue", "attaching to one bucket takes one resumeAfter token, not a list")
        if token is None:
            # Without a token, from the stream's start point: nothing it holds for the bucket is
            # skipped, and what retention has dropped since is re-read by a replay below.
            token = token_from_key(stream.buckets[i].start_floor)
        if token is not None and stream.buckets[i].position_after(start_point(token)[1]) is None:
            # Older than this bucket's retained history: re-read the oplogs for this bucket alone,
            # until the cursor reaches what the named stream's bucket holds.
            named = stream
            stream = await self._replay(named, i, {**cmd, "resumeAfter": token})
            cur = self._new_cursor(user, stream, i, cmd, batch_size, token)
            self._private[cur.cursor_id] = stream
            cur.follow(named, lambda: self._close_private(cur.cursor_id))
        else:
            cur = self._new_cursor(user, stream, i, cmd, batch_size, token, from_start=created)
        events: list[EventFields] = []
        if batch_size:
            events, _ = await cur.next_batch(batch_size, 0, first=True)
        return {"cursor": cursor_document(cur.cursor_id, CURSOR_NS, "firstBatch", events, cur.last_token)}

    async def _replay(self, named: ParallelStream, i: int, cmd: dict[str, Any]) -> ParallelStream:
        """A private stream re-reading the oplogs for bucket `i` of `named` from `cmd`'s
        resumeAfter, with `named`'s options."""
        options = named.options
        named.replays += 1
        return await self._create(f"{named.name}#replay-{uuid.uuid4().hex[:8]}", options.n_buckets,
                                  {**cmd, "nBuckets": options.n_buckets,
                                   "showExpandedEvents": options.show_expanded_events,
                                   "showSystemEvents": options.show_system_events,
                                   "bucketBy": options.bucket_by,
                                   "shardBufferBytes": options.shard_buffer_bytes,
                                   "bucketBufferBytes": options.bucket_buffer_bytes,
                                   "pipeline": ([{"$match": options.match}] if options.match else [])
                                   + ([{SPLIT_STAGE: {}}] if options.split_large_events else [])},
                                  keep={i})

    async def _replay_dropped(self, cur: BucketCursor) -> None:
        """Move `cur`, whose events its bucket dropped before it was first read (an unread cursor
        pins no retention, Bucket._safe) or no longer holds (it fell behind, buckets/catch_up.py),
        to a replay from its resume point, which hands it back to its stream's bucket once caught
        up, as an attach with an older token."""
        named, cid, i = cur.stream, cur.cursor_id, cur.bucket.index
        opts = named.options
        replay = await self._replay(named, i, {"resumeAfter": cur.last_token,
                                               "fullDocument": opts.full_document,
                                               "fullDocumentBeforeChange": opts.full_document_before_change})
        cur.bucket.detach(cur)
        bucket = replay.buckets[i]
        cur.stream, cur.bucket, cur.position = replay, bucket, bucket.base
        bucket.cursors.add(cur)
        cur.resume_after(cur.last_token)
        cur.acked = cur.position
        self._private[cid] = replay
        cur.follow(named, lambda: self._close_private(cid))

    async def cmd_change_stream(self, session: ClientContext, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = await self._accelerate_watch(session, db, cmd)
        except Decline:
            self.watches["passedThrough"] += 1
            raise
        self.watches["accelerated"] += 1
        return reply

    async def _accelerate_watch(self, session: ClientContext, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """An ordinary `watch()` (aggregate with $changeStream), served from the shards in parallel.

        Only streams whose every event the engine reproduces exactly are accelerated: every
        fullDocument and fullDocumentBeforeChange mode, and the stages, operators and expressions
        mongoformats.change_stages evaluates (buckets/commands.py reads and plans it). Anything
        else raises Decline, so the proxy forwards the aggregate to mongos unchanged:
        acceleration never changes what a consumer sees.
        """
        if self.requires_auth and not session.user:
            raise Decline()  # mongos answers an unauthenticated aggregate with its own error
        if await self.upstream_wire_version() < _V2_TOKENS_WIRE_VERSION:
            raise Decline()  # its streams carry v1 tokens (and older events): mongos's own, unchanged
        request = read_watch(db, cmd)
        if request.coll is not None and not await _is_collection_or_absent(session, db, request.coll):
            raise Decline()  # mongos refuses a view (CommandNotSupportedOnView)
        if not await self._may_watch(session, request.resource):
            raise Decline()  # mongos answers Unauthorized, in its own words
        plan = plan_watch(request, cmd, shard_buffer_bytes=self.config.watch_shard_buffer_bytes)
        if (failed := await session.fail_point_reply("aggregate", db, cmd)) is not None:
            return failed
        try:
            stream = await self._create(f"watch-{uuid.uuid4().hex[:8]}", 1, plan.open, keep={0},
                                        scope=plan.scope, stages=plan.stages,
                                        keep_version=plan.keep_version)
        except MongoError as exc:  # e.g. ChangeStreamHistoryLost, labelled as mongos labels it
            if exc.code_name == "ExceededMemoryLimit":
                # The stream mongos serves is the same stream, only slower: better than none.
                log.warning("watch() on %s passed through to the upstream: %s", cmd["aggregate"], exc)
                raise Decline() from None
            raise with_change_stream_label(exc) from None
        cur = self._new_cursor(session.user or "", stream, 0, cmd, plan.batch_size,
                               plan.open.get("resumeAfter"), from_start=True)
        if plan.event_token is not None:
            cur.last_key, cur.last_token = token_sort_key(plan.event_token), dict(plan.event_token)
            cur.must_meet = plan.fragment[0] if plan.fragment is not None else cur.last_key
            cur.fragments_sent = plan.fragment[1] + 1 if plan.fragment is not None else 0
        cur.ns = plan.ns
        self._private[cur.cursor_id] = stream
        return {"cursor": {"firstBatch": [], "postBatchResumeToken": cur.last_token, "id": Int64(cur.cursor_id),
                           "ns": cur.ns}}

    async def _holds(self, session: ClientContext, action: str) -> bool:
        """Whether the client's user holds `action` on the cluster (always, without auth)."""
        return not self.requires_auth or allows(await session.privileges(), (action,), {"cluster": True})

    def _owned(self, session: ClientContext, cid: int, cmd: dict[str, Any]) -> BucketCursor:
        check_lsid(cmd)
        cur = self.cursors.get(cid)
        if cur is None:
            raise MongoError("CursorNotFound", f"cursor id {cid} not found")
        if cur.user != self._user(session, next(iter(cmd))):
            raise MongoError("Unauthorized", f"cursor id {cid} was not created by the authenticated user")
        lsid = cmd.get("lsid")
        if cur.owner and (lsid is None or session_id(lsid["id"]) != cur.owner):
            raise MongoError("Unauthorized", f"cursor id {cid} belongs to another session")
        return cur

    async def cmd_ddl(self, session: ClientContext, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """A DDL command on its way to mongos: recorded as notes when the upstream cannot show it."""
        name = next(iter(cmd))
        if not await self.lacks_expanded_events() or not isinstance(cmd[name], str):
            raise Decline()
        ns = target_namespace(db, cmd)
        shards = (await self._discover()).shards
        before = await self._holders(shards, ns)
        specs = None
        if name == "dropIndexes" and before:
            target_db, _, coll = ns.partition(".")
            listed = await session.forward_command(target_db, {"listIndexes": coll})
            specs = {ix["name"]: ix for ix in listed.get("cursor", {}).get("firstBatch", [])}
        reply = await session.forward_command(db, cmd)
        if reply.get("ok"):
            after = await self._holders(shards, ns)
            for note in plan_notes(cmd, ns, before, after, specs):
                data = ddl_note(note.op_type, note.ns, ui=note.ui, operation_description=note.operation_description,
                                state_before_change=note.state_before_change)
                await self._on_each_shard({s: shards[s] for s in note.shards}, "admin",
                                          {"appendOplogNote": 1, "data": data})
        return reply

    async def cmd_get_more(self, session: ClientContext, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        # The upstream's test fail points apply to getMores the engine answers too (ClientContext).
        if (failed := await session.fail_point_reply("getMore", db, cmd)) is not None:
            return failed
        more = get_more_request(cmd)
        cid = more.cursor_id
        cur = self._owned(session, cid, cmd)
        if f"{db}.{more.collection}" != cur.ns:
            raise MongoError("Unauthorized", f"Requested getMore on namespace '{db}.{more.collection}', "
                             f"but cursor belongs to a different namespace {cur.ns}")
        if (fail := await session.fail_after_checkout()) is not None:
            raise with_change_stream_label(fail)  # like the server's: the cursor survives it
        if cur.busy:  # mongos pins a cursor for one operation at a time
            raise MongoError("CursorInUse", f"Cursor already in use (namespace: '{cur.ns}', id: {cid}).")
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

    async def cmd_kill_cursors(self, session: ClientContext, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        if (failed := await session.fail_point_reply("killCursors", db, cmd)) is not None:
            return failed
        killed, others = [], []
        ids = kill_cursors_ids(cmd)
        mine = [self.cursors[cid] for cid in ids if cid in self.cursors]
        # Every id is checked before any is killed: one the caller may not kill fails the
        # command, as the server checks authorization for all of them first.
        user = self._user(session, "killCursors") if mine else ""
        if any(cur.user != user for cur in mine) and not await self._holds(session, "killAnyCursor"):
            raise MongoError("Unauthorized", f"not authorized to kill cursor on {CURSOR_NS}")
        for cid in ids:
            if cid in self.cursors:
                self._drop_cursor(cid)
                killed.append(Int64(cid))
            else:
                others.append(Int64(cid))
        reply: dict[str, Any] = {"cursorsKilled": killed, "cursorsNotFound": [], "cursorsAlive": [],
                                 "cursorsUnknown": []}
        if others:  # ids of mongos's cursors in the same command: mongos kills those
            theirs = await session.forward_command(db, {**cmd, "cursors": others})
            if not theirs.get("ok"):
                return theirs
            for field_name in ("cursorsKilled", "cursorsNotFound", "cursorsAlive", "cursorsUnknown"):
                reply[field_name] += theirs.get(field_name, [])
        return reply

    async def cmd_end_sessions(self, session: ClientContext, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """endSessions, forwarded; the engine's cursors of those sessions are killed at the next
        session refresh (EngineConfig.session_refresh_s), when the server kills those it holds."""
        reply = await session.forward_command(db, cmd)
        if reply.get("ok") and isinstance(cmd["endSessions"], list):
            owners = {cur.owner for cur in self.cursors.values()}  # only those: drivers end thousands
            self._ended_sessions.update(owner for spec in cmd["endSessions"] if isinstance(spec, Mapping)
                                        and "id" in spec and (owner := session_id(spec["id"])) in owners)
        return reply

    async def cmd_kill_sessions(self, session: ClientContext, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
        """killSessions / killAllSessions, forwarded; once mongos has accepted, the engine's
        cursors of those sessions are killed too, as the server closes a killed session's cursors
        (the unified test runner kills all sessions between tests)."""
        name = next(iter(cmd))
        reply = await session.forward_command(db, cmd)
        if not reply.get("ok"):
            return reply
        named = sessions_named(cmd, session.user or "", access_control=self.requires_auth,
                               kill_any=await self._holds(session, "killAnySession"))
        # Cursors opened outside any session belong to no session a command can name.
        self._kill_cursors_where(lambda cur: bool(cur.owner) and named(cur.owner, cur.user),
                                 f"its session was killed ({name})")
        return reply

    def _close_private(self, cid: int) -> None:
        """Close the private stream (a watch()'s, a replay) cursor `cid` reads, if any."""
        private = self._private.pop(cid, None)
        if private is not None:
            private.close()

    def _drop_cursor(self, cid: int) -> None:
        cur = self.cursors.pop(cid, None)
        if cur is not None:
            cur.killed = True  # before detach wakes a getMore parked on it
            cur.bucket.detach(cur)
        self._close_private(cid)

    def _stream_owners(self) -> dict[str, str]:
        """Each stream's user: a named one's creator, a private one's cursor's user."""
        owners = {name: self._owners.get(name, "") for name in self.streams}
        owners.update({stream.name: self.cursors[cid].user for cid, stream in self._private.items()
                       if cid in self.cursors})
        return owners

    async def cmd_status(self, session: ClientContext, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
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
                raise MongoError("Unauthorized", f"parallel change stream {name!r} was created by another user")
            streams = [s for s in streams if owners.get(s.name) == user]
            cursors = [cur for cur in cursors if cur.user == user]
        out: dict[str, Any] = {"streams": [s.status() for s in streams], "cursors": len(cursors),
                               "watches": dict(self.watches), "readerProcesses": self.reader_processes(),
                               "cursorsTimedOut": self.cursors_timed_out, "streamsRebucketed": self.rebucketed,
                               "memory": self.memory_status()}
        if name is not None:
            stream = streams[0]
            stream.last_active = trio.current_time()
            out["frontier"] = token_from_key(stream.frontier_key)
            after = cmd.get("after")
            if after is not None:
                if len(after) != stream.options.n_buckets:
                    raise MongoError("BadValue", f"after has {len(after)} tokens, the stream has "
                                     f"{stream.options.n_buckets} buckets")
                end = stream.plan_end([token_sort_key(t) for t in after], _int_option(cmd, "maxEvents", 1, 1 << 62))
                out["planEnd"] = token_from_key(end)
        return out
