"""`fullDocument: "updateLookup"`: update events get the document as it is now, read through the
upstream (mongos), as the server's change streams do: the post-image is the current majority-
committed version at the time the event is returned, or null once the document is gone.

One `find` per namespace per returned batch (the batch's document keys in one `$or`), not one per
event, so a batch of updates costs a round trip per collection it touches.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import bson
import trio
from bson.raw_bson import RawBSONDocument

from mongoformats.change_events import RAW, ChangeEvent
from mongoformats.errors import MongoError
from mongoformats.oplog_splice import splice_full_document
from wireproxy.upstream import UpstreamClosed, UpstreamConnection

_LOOKUP_CHUNK = 500  # document keys per find: bounds the $or a shard evaluates


class DocumentLookup:
    """Looks documents up over one upstream connection, one request at a time (shared by a stream's
    cursors; a lost connection is reopened once per request)."""

    def __init__(self, connect: Callable[[], Awaitable[UpstreamConnection]]) -> None:
        self._connect = connect
        self._conn: UpstreamConnection | None = None
        self._lock = trio.Lock()

    async def aclose(self) -> None:
        if self._conn is not None:
            await self._conn.aclose()
            self._conn = None

    async def with_post_images(self, events: list[ChangeEvent]) -> list[ChangeEvent]:
        updates: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, ev in enumerate(events):
            if ev.op_type == "update" and ev.coll is not None:
                updates[(ev.db, ev.coll)].append(i)
        if not updates:
            return events
        out = list(events)
        for (db, coll), indexes in updates.items():
            keys = [RawBSONDocument(events[i].raw, RAW)["documentKey"] for i in indexes]
            found = await self._find(db, coll, keys)
            for i, key in zip(indexes, keys, strict=True):
                doc = found.get(bson.encode({"_id": key["_id"]}))
                out[i] = events[i]._replace(raw=splice_full_document(events[i].raw, doc))
        return out

    async def _find(self, db: str, coll: str, keys: list[Any]) -> dict[bytes, bytes]:
        """Current documents by their encoded `{_id}`."""
        out: dict[bytes, bytes] = {}
        for lo in range(0, len(keys), _LOOKUP_CHUNK):
            chunk = [bson.decode(k.raw) for k in keys[lo:lo + _LOOKUP_CHUNK]]
            cmd = {"find": coll, "filter": {"$or": chunk} if len(chunk) > 1 else chunk[0],
                   "batchSize": len(chunk), "singleBatch": True, "readConcern": {"level": "majority"}}
            reply = await self._command(db, cmd)
            for doc in reply["cursor"]["firstBatch"]:
                out[bson.encode({"_id": doc["_id"]})] = doc.raw
        return out

    async def _command(self, db: str, cmd: dict[str, Any]) -> RawBSONDocument:
        async with self._lock:
            for attempt in (1, 2):
                try:
                    if self._conn is None:
                        self._conn = await self._connect()
                    return await self._conn.command(db, cmd)
                except UpstreamClosed as exc:
                    await self.aclose()
                    if attempt == 2:
                        raise MongoError("HostUnreachable", f"looking up the full document failed: {exc}") from exc
        raise AssertionError("unreachable")
