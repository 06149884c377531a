"""Documents added to events as a batch is returned, as the server's change streams add them.

- `fullDocument: "updateLookup"`: update events get the document as it is now, read through the
  upstream (mongos) with majority read concern, or null once it is gone. One `find` per namespace
  per batch (the batch's document keys in one `$or`).
- `fullDocumentBeforeChange: "whenAvailable" | "required"`: update, replace and delete events get
  the document as it was before, from the pre-image the shard recorded with the write (collections
  with changeStreamPreAndPostImages), read from a member of the shard the event came from, in
  `config.system.preimages` by `{nsUUID, ts, applyOpsIndex}`. One `find` per shard per batch.
- `fullDocument: "whenAvailable" | "required"`: update events get that pre-image with the update
  applied (the server computes the post-image the same way).

fullDocument is spliced in before `ns`, fullDocumentBeforeChange after the last field, as the
server orders them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import bson
import trio
from bson import Binary, Int64, Timestamp
from bson.raw_bson import RawBSONDocument

from buckets.ports import Connection, ConnectUpstream
from mongoformats.change_events import RAW, ChangeEvent
from mongoformats.codecs import PLAIN
from mongoformats.errors import ConnectionLost, MongoError
from mongoformats.keystring import key_of
from mongoformats.mql import get_path
from mongoformats.oplog_splice import splice_at_end, splice_before_ns
from mongoformats.resume_token import decode_token
from mongoformats.update_diff import post_image

_LOOKUP_CHUNK = 500  # keys per find: bounds the $or (or $in) a server evaluates
_MONGOS = ""  # the connection key of the upstream mongos (shards use their id)


# A documentKey's field names, and its values as an index compares them (1 and 1.0 are one key).
_Identity = tuple[tuple[str, ...], bytes]


def _key_identity(key: dict[str, Any]) -> _Identity:
    return tuple(key), key_of(key.values())


def _field(doc: dict[str, Any], path: str) -> Any:
    """The value at a shard key's dotted path (null when missing, as a documentKey holds it)."""
    values = get_path(doc, path)
    return values[0] if values else None


class DocumentLookup:
    """Looks documents up over one connection to mongos and one per shard, one request at a time
    (shared by a stream's cursors; a lost connection is reopened once per request)."""

    def __init__(
        self,
        connect: ConnectUpstream,
        connect_shard: Callable[[str], Awaitable[Connection]] | None = None,
    ) -> None:
        self._connect = connect
        self._connect_shard = connect_shard
        self._conns: dict[str, Connection] = {}
        self._lock = trio.Lock()

    async def aclose(self) -> None:
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            await conn.aclose()

    async def with_post_images(self, events: list[ChangeEvent]) -> list[ChangeEvent]:
        updates: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, ev in enumerate(events):
            if ev.op_type == "update" and ev.coll is not None:
                updates[(ev.db, ev.coll)].append(i)
        if not updates:
            return events
        out = list(events)
        for (db, coll), indexes in updates.items():
            keys = [
                bson.decode(RawBSONDocument(events[i].raw, RAW)["documentKey"].raw, PLAIN)
                for i in indexes
            ]
            found = await self._find(db, coll, keys)
            for i, key in zip(indexes, keys, strict=True):
                doc = found.get(_key_identity(key))
                out[i] = out[i]._replace(raw=splice_before_ns(out[i].raw, "fullDocument", doc))
        return out

    async def pre_images(self, events: list[ChangeEvent]) -> dict[int, bytes | None]:
        """The recorded pre-image of each update, replace and delete in `events` (by index), or
        None."""
        by_shard: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
        for i, ev in enumerate(events):
            if ev.op_type in ("update", "replace", "delete"):
                data = decode_token(ev.token)
                if data.uuid is not None:
                    # Images are kept under the applyOps entry that holds the write
                    # (ChangeEvent.applied_at).
                    ts, index = ev.applied_at or (data.cluster_time, data.txn_op_index)
                    by_shard[ev.shard].append(
                        (
                            i,
                            {
                                "nsUUID": Binary(data.uuid.bytes, 4),
                                "ts": ts,
                                "applyOpsIndex": Int64(index),
                            },
                        )
                    )
        out: dict[int, bytes | None] = {}
        for shard, wanted in by_shard.items():
            found: dict[bytes, bytes] = {}
            for lo in range(0, len(wanted), _LOOKUP_CHUNK):
                ids = [image_id for _, image_id in wanted[lo : lo + _LOOKUP_CHUNK]]
                reply = await self._command(
                    shard,
                    "config",
                    {
                        "find": "system.preimages",
                        "filter": {"_id": {"$in": ids}},
                        "batchSize": len(ids),
                        "singleBatch": True,
                        "$readPreference": {"mode": "secondaryPreferred"},
                    },
                )
                for doc in reply["cursor"]["firstBatch"]:
                    found[bson.encode(doc["_id"])] = doc["preImage"].raw
            for i, image_id in wanted:
                out[i] = found.get(bson.encode(image_id))
        return out

    @staticmethod
    def with_pre_images(
        events: list[ChangeEvent], pre: dict[int, bytes | None], *, required: bool
    ) -> list[ChangeEvent]:
        out = list(events)
        for i, ev in enumerate(events):
            if ev.op_type not in ("update", "replace", "delete"):
                continue
            before = pre.get(i)
            if before is None and required:
                raise MongoError(
                    "NoMatchingDocument",
                    "Change stream was configured to require a pre-image for all "
                    "update, delete and replace events, but the pre-image was not found for event: "
                    f"{_event_text(ev.raw)}",
                )
            out[i] = ev._replace(raw=splice_at_end(ev.raw, "fullDocumentBeforeChange", before))
        return out

    @staticmethod
    def with_recorded_post_images(
        events: list[ChangeEvent], pre: dict[int, bytes | None], *, required: bool
    ) -> list[ChangeEvent]:
        """fullDocument whenAvailable / required: each update's pre-image with the update
        applied."""
        out = list(events)
        for i, ev in enumerate(events):
            if ev.op_type != "update":
                continue
            before = pre.get(i)
            after = None
            if before is not None:
                description = bson.decode(ev.raw, PLAIN)["updateDescription"]
                after = bson.encode(post_image(bson.decode(before, PLAIN), description))
            elif required:
                raise MongoError(
                    "NoMatchingDocument",
                    "Change stream was configured to require a post-image for all "
                    "update events, but the post-image was not found for event: "
                    f"{_event_text(ev.raw)}",
                )
            out[i] = ev._replace(raw=splice_before_ns(ev.raw, "fullDocument", after))
        return out

    async def _find(self, db: str, coll: str, keys: list[dict[str, Any]]) -> dict[_Identity, bytes]:
        """Current documents by the identity of their documentKey. Matched on the whole key, as the
        server's updateLookup matches: the shard key and `_id`, since `_id` alone is unique only on
        each shard."""
        wanted = {
            _key_identity(k): k for k in keys
        }  # a document updated twice in a batch: found once
        shapes = {names for names, _ in wanted}
        unique = list(wanted.values())
        out: dict[_Identity, bytes] = {}
        for lo in range(0, len(unique), _LOOKUP_CHUNK):
            chunk = unique[lo : lo + _LOOKUP_CHUNK]
            cmd = {
                "find": coll,
                "filter": {"$or": chunk} if len(chunk) > 1 else chunk[0],
                "batchSize": len(chunk),
                "singleBatch": True,
                "readConcern": {"level": "majority"},
            }
            reply = await self._command(_MONGOS, db, cmd)
            for raw in reply["cursor"]["firstBatch"]:
                doc = bson.decode(raw.raw, PLAIN)
                for names in shapes:
                    identity = _key_identity({name: _field(doc, name) for name in names})
                    if identity in wanted:
                        out[identity] = raw.raw
        return out

    async def _command(self, target: str, db: str, cmd: dict[str, Any]) -> RawBSONDocument:
        async with self._lock:
            for attempt in (1, 2):
                try:
                    conn = self._conns.get(target)
                    if conn is None:
                        if target == _MONGOS:
                            conn = await self._connect()
                        else:
                            assert self._connect_shard is not None
                            conn = await self._connect_shard(target)
                        self._conns[target] = conn
                    return await conn.command(db, cmd)
                except ConnectionLost as exc:
                    lost = self._conns.pop(target, None)
                    if lost is not None:
                        await lost.aclose()
                    if attempt == 2:
                        raise MongoError(
                            "HostUnreachable", f"looking up documents failed: {exc}"
                        ) from exc
        raise AssertionError("unreachable")


def _event_text(raw: bytes) -> str:
    """The event as a missing image's error names it (makePreImageNotFoundErrorMsg in
    change_stream_add_pre_image_stage.cpp, used for post-images too): a Document of
    operationType, ns, clusterTime and txnNumber, as Document::toString prints it (a missing
    field left out)."""
    event = bson.decode(raw, PLAIN)

    def text(value: Any) -> str:
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {text(v)}" for k, v in value.items()) + "}"
        if isinstance(value, Timestamp):
            return f"Timestamp({value.time}, {value.inc})"
        if isinstance(value, str):
            return f'"{value}"'
        return str(value)

    return text(
        {k: event[k] for k in ("operationType", "ns", "clusterTime", "txnNumber") if k in event}
    )
