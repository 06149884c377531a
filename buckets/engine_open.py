"""parallelChangeStream and dropParallelChangeStream: named streams opened, attached to and
dropped (buckets/engine.py describes the commands)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from bson import Int64, Timestamp

from buckets.commands import OpenRequest, read_drop, read_open
from buckets.cursor import BucketCursor, start_point
from buckets.cursors import CursorRegistry
from buckets.engine_base import CURSOR_NS, Access, new_cursor
from buckets.event_run import EventRun
from buckets.ports import ClientContext
from buckets.reply import cursor_document
from buckets.stream import ParallelStream
from buckets.streams import StreamSet
from mongoformats.errors import MongoError
from mongoformats.privileges import change_stream_resource
from mongoformats.resume_token import high_water_mark, token_from_key


def _admin_only(db: str, command: str) -> None:
    if db != "admin":
        raise MongoError("Unauthorized", f"{command} may only be run against the admin database.")


def _start_tokens(cmd: dict[str, Any], n: int) -> list[Mapping[str, Any] | None]:
    """Each bucket's resume token (None: none given), from one token, a list of one per bucket,
    or startAtOperationTime."""
    tokens = cmd.get("resumeAfter", cmd.get("startAfter"))
    if tokens is None and isinstance(cmd.get("startAtOperationTime"), Timestamp):
        # Joining an existing stream at a time: the same point as a token for that time.
        tokens = high_water_mark(cmd["startAtOperationTime"])
    return tokens if isinstance(tokens, list) else [tokens] * n


def _resumes_in_gap(stream: ParallelStream, i: int, token: Mapping[str, Any] | None) -> bool:
    """Whether bucket `i` resumes from `token` in the gap after it fell behind (its first
    getMore then moves it to a replay); ChangeStreamHistoryLost if it no longer holds it."""
    dealt = stream.buckets[i]
    if token is None or dealt.position_after(key := start_point(token)[1]) is not None:
        return False
    # After the point a fallen-behind bucket is complete to: its first getMore moves it to a
    # replay (buckets/catch_up.py). Below what it holds: lost.
    if dealt.lag.behind and key >= dealt.floor:
        return True
    raise MongoError(
        "ChangeStreamHistoryLost",
        f"bucket {i} of stream {stream.name!r} no longer holds events after "
        "that token; attach to the bucket alone to re-read them",
    )


class StreamCommands:
    """parallelChangeStream and dropParallelChangeStream, over the engine's cursor registry and
    streams."""

    def __init__(self, access: Access, registry: CursorRegistry, stream_set: StreamSet) -> None:
        self.access = access
        self.registry = registry
        self.stream_set = stream_set

    async def cmd_open(
        self, session: ClientContext, db: str, cmd: dict[str, Any]
    ) -> dict[str, Any]:
        user = self.access.user(session, "parallelChangeStream")
        _admin_only(db, "parallelChangeStream")
        # A parallel stream reads every namespace: a cluster-wide change stream's privileges.
        if not await self.access.may_watch(session, change_stream_resource(None, None)):
            raise MongoError(
                "Unauthorized",
                "not authorized on admin to execute command { parallelChangeStream: 1 }: "
                "it needs find and changeStream on every database ({db: '', collection: ''})",
            )
        request = read_open(cmd)
        if request.bucket is not None:
            if request.name is None:
                raise MongoError("BadValue", "attaching to a bucket needs the stream's name")
            return await self._attach_bucket(
                user, request.name, request.bucket, request.n, request.cmd, request.batch_size
            )
        if request.n is None:
            raise MongoError("BadValue", "nBuckets is required: an integer between 1 and 1024")
        return await self._open_named(user, request, request.n)

    async def _open_named(self, user: str, request: OpenRequest, n: int) -> dict[str, Any]:
        """A cursor on each of the `n` buckets of the stream `request` names (created if new)."""
        cmd, batch_size = request.cmd, request.batch_size
        name = request.name or f"pcs-{uuid.uuid4().hex[:12]}"
        stream, created = await self.stream_set.named(name, n, cmd, user)
        cursors = []
        tokens = _start_tokens(cmd, n)
        for i in range(n):
            token = tokens[i]
            in_gap = _resumes_in_gap(stream, i, token)
            cur = new_cursor(
                self.registry, user, stream, i, cmd, batch_size, token, from_start=created
            )
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
        """Close the stream `cmd["dropParallelChangeStream"]` and kill its cursors (see
        buckets/engine.py): its creator's to drop, like every other use of a named stream."""
        user = self.access.user(session, "dropParallelChangeStream")
        _admin_only(db, "dropParallelChangeStream")
        name = read_drop(cmd)
        while (pending := self.stream_set.creating.get(name)) is not None:
            await pending.wait()  # being created: dropped once it is (or found missing)
        stream = self.stream_set.streams.get(name)
        if stream is None:
            raise MongoError("NamespaceNotFound", f"no parallel change stream named {name!r}")
        self.stream_set.check_owner(name, user)
        # Its cursors, and those of replays that would move to it once caught up.
        doomed = [
            cid for cid, cur in self.registry.cursors.items() if stream in (cur.stream, cur.join)
        ]
        for cid in doomed:
            self.registry.drop(cid)
        self.stream_set.close_named(stream, "dropping stream %s (dropParallelChangeStream)")
        return {"name": name, "cursorsKilled": [Int64(cid) for cid in doomed]}

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
            cur = new_cursor(self.registry, user, stream, i, cmd, batch_size, token)
            self.registry.private[cur.cursor_id] = stream
            cur.follow(named, lambda: self.registry.close_private(cur.cursor_id))
        else:
            cur = new_cursor(
                self.registry, user, stream, i, cmd, batch_size, token, from_start=created
            )
        events: list[EventRun] = []
        if batch_size:
            events, _ = await cur.next_batch(batch_size, 0, first=True)
        return {
            "cursor": cursor_document(
                cur.cursor_id, CURSOR_NS, "firstBatch", events, cur.last_token
            )
        }

    async def replay_dropped(self, cur: BucketCursor) -> None:
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
        self.registry.private[cid] = replay
        cur.follow(named, lambda: self.registry.close_private(cid))
