"""An ordinary watch() accelerated: served by a private one-bucket stream."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from bson import Int64

from buckets.config import EngineConfig
from buckets.cursor import BucketCursor
from buckets.cursors import CursorRegistry
from buckets.engine_base import Access, new_cursor
from buckets.ports import ClientContext, Decline
from buckets.stream import ParallelStream
from buckets.streams import StreamSet
from buckets.watch_command import WatchPlan, WatchRequest, plan_watch, read_watch
from mongoformats.errors import MongoError, with_change_stream_label
from mongoformats.resume_token import token_sort_key

log = logging.getLogger("buckets.engine")

# Servers from 6.1 on (wire version 18) write v2 resume tokens, as the engine does; older ones v1.
_V2_TOKENS_WIRE_VERSION = 18


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


class WatchCommands:
    """watch() aggregates the engine serves, each from a private stream of its own."""

    def __init__(
        self,
        access: Access,
        registry: CursorRegistry,
        stream_set: StreamSet,
        config: EngineConfig,
    ) -> None:
        self.access = access
        self.registry = registry
        self.stream_set = stream_set
        self.config = config
        # served by the engine / forwarded to the upstream (status and /metrics)
        self.watches = {"accelerated": 0, "passedThrough": 0}

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
        mongoformats.change_stages evaluates (buckets/watch_command.py reads and plans it). Anything
        else raises Decline, so the proxy forwards the aggregate to mongos unchanged:
        acceleration never changes what a consumer sees.
        """
        request = await self._served_watch(session, db, cmd)
        plan = plan_watch(request, cmd, shard_buffer_bytes=self.config.watch_shard_buffer_bytes)
        if (failed := await session.fail_point_reply("aggregate", db, cmd)) is not None:
            return failed
        stream = await self._watch_stream(plan, cmd)
        cur = new_cursor(
            self.registry,
            session.user or "",
            stream,
            0,
            cmd,
            plan.batch_size,
            plan.open.get("resumeAfter"),
            from_start=True,
        )
        _place_after_event(cur, plan)
        cur.ns = plan.ns
        self.registry.private[cur.cursor_id] = stream
        return {
            "cursor": {
                "firstBatch": [],
                "postBatchResumeToken": cur.last_token,
                "id": Int64(cur.cursor_id),
                "ns": cur.ns,
            }
        }

    async def _served_watch(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> WatchRequest:
        """The watch() `cmd` on `db` read, if the engine serves it to this client; else Decline."""
        if self.access.requires_auth and not session.user:
            raise Decline()  # mongos answers an unauthenticated aggregate with its own error
        if await self.stream_set.upstream_wire_version() < _V2_TOKENS_WIRE_VERSION:
            # Its streams carry v1 tokens (and older events): mongos's own, unchanged.
            raise Decline()
        request = read_watch(db, cmd)
        if request.coll is not None and not await _is_collection_or_absent(
            session, db, request.coll
        ):
            raise Decline()  # mongos refuses a view (CommandNotSupportedOnView)
        if not await self.access.may_watch(session, request.resource):
            raise Decline()  # mongos answers Unauthorized, in its own words
        return request

    async def _watch_stream(self, plan: WatchPlan, cmd: dict[str, Any]) -> ParallelStream:
        """The private one-bucket stream `plan` describes; Decline when memory is short."""
        try:
            return await self.stream_set.create(
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


def _place_after_event(cur: BucketCursor, plan: WatchPlan) -> None:
    """A watch() resumed after an event: its cursor returns nothing before meeting it again."""
    if plan.event_token is None:
        return
    cur.last_key, cur.last_token = token_sort_key(plan.event_token), dict(plan.event_token)
    cur.must_meet = plan.fragment[0] if plan.fragment is not None else cur.last_key
    cur.fragments_sent = plan.fragment[1] + 1 if plan.fragment is not None else 0
