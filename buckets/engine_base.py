"""What the engine's commands share: the namespace of its cursors, the client's access (who it
is and what it may do), and a new cursor placed in its bucket and registered."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from buckets.cursor import BucketCursor
from buckets.cursors import CursorRegistry
from buckets.ports import ClientContext
from buckets.stream import ParallelStream
from mongoformats.errors import MongoError
from mongoformats.privileges import allows
from mongoformats.resume_token import token_from_key
from mongoformats.sessions import session_id

CURSOR_NS = "admin.$cmd.parallelChangeStream"


@dataclass(frozen=True)
class Access:
    """Who the client is and what it may do (buckets/engine.py's docstring has the rules)."""

    # The upstream requires authentication (the proxy logs in with its own credentials), so a
    # client must have logged in on its connection before the engine serves it.
    requires_auth: bool = False

    def user(self, session: ClientContext, command: str) -> str:
        """The user `session` logged in as; Unauthorized (13) when the upstream needs one and
        there is none."""
        user = session.user or ""
        if self.requires_auth and not user:
            raise MongoError("Unauthorized", f"Command {command} requires authentication")
        return str(user)

    async def may_watch(self, session: ClientContext, resource: dict[str, Any]) -> bool:
        """Whether the client's own user holds find and changeStream on `resource`, as mongos
        would check for a change stream: the engine reads the shards with the proxy's login, so
        it asks the client's connection for its privileges (connectionStatus showPrivileges)."""
        if not self.requires_auth:
            return True
        return allows(await session.privileges(), ("find", "changeStream"), resource)

    async def holds(self, session: ClientContext, action: str) -> bool:
        """Whether the client's user holds `action` on the cluster (always, without auth)."""
        return not self.requires_auth or allows(
            await session.privileges(), (action,), {"cluster": True}
        )


def new_cursor(
    registry: CursorRegistry,
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
        token = token_from_key(bucket.floor)  # the start point: below every event the bucket holds
    # Resumed: placed after the token by resume_after, from the first event the bucket holds.
    position = bucket.base if token is not None else bucket.end
    cid = registry.new_id()
    lsid = cmd.get("lsid")
    # Like the server: a cursor belongs to the user who opened it (with an upstream login, see
    # Access.user) and, if opened in a session, to that session too.
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
    registry.cursors[cid] = cur
    return cur
