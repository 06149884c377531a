"""Native change streams, as a mongod (one oplog) or mongos (every shard, merged) serves them.

The merge here is deliberately a separate implementation from the engine's MergedQueue, so the
differential tests compare two independent mergers: each poll reads every shard's new oplog
entries, and releases, in token order, the events at or below the oldest "read up to" timestamp
among the shards (an idle shard holds the stream back until it writes, e.g. its periodic noop, as
on a real cluster). postBatchResumeToken follows the server: the last returned event's token
(never one the stages dropped), or the high-water mark of the merge frontier once everything
ready was returned. A stream resumed from an event's token must meet that event again after its
scope and stages (EnsureResumeTokenPresent), else ChangeStreamFatalError; a transaction whose
commit is read without its earlier entries has them read back by prevOpTime.

The events themselves come from simcluster's own transform (reference_events), independent of
the engine's, so that comparing the two finds a transform bug instead of repeating it. The stages
after $changeStream are the engine's (mongoformats.change_stages): simcluster evaluates exactly
what the proxy's accelerated watch() evaluates and refuses the rest (NotImplemented), which the
pass-through contract needs (tests/test_accelerate.py).

Sources: shared/reference/000 section 3.5 (mongos merge), mongodb-formats.md C.11 (invalidate),
D.2 (reply shapes, cursor namespaces), D.4 (error labels); the drivers' change-streams spec.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, Protocol

from bson import Timestamp
from bson.raw_bson import RawBSONDocument

from mongoformats.change_stages import apply_stages, compile_stages
from mongoformats.codecs import RAW
from mongoformats.errors import MongoError
from mongoformats.large_events import (
    MEASURE_ABOVE_BYTES,
    SPLIT_STAGE,
    event_too_large,
    split_event,
)
from mongoformats.resume_token import (
    EVENT_TOKEN,
    decode_token,
    fragment_of,
    high_water_mark,
    token_sort_key,
    token_text,
)
from mongoformats.wire import BATCH_BYTES_LIMIT, BATCH_ELEMENT_OVERHEAD
from simcluster.cursors import Cursor
from simcluster.oplog import ts_key
from simcluster.reference_events import ReferenceTransformer, RefEvent, encode_event, invalidate_for
from simcluster.stream_request import (
    _check_namespace,
    _check_read_concern,
    _element_text,
    parse_change_stream,
)

_IMAGE_MODES = ("whenAvailable", "required")
# The events that end a stream (isInvalidatingCommand); a collection stream sees dropDatabase never
# (the reference's filter), its own collection's drop or rename only.
_INVALIDATING = {"collection": ("drop", "rename"), "database": ("dropDatabase",)}


class OplogSource(Protocol):
    """What a stream reads: one member (a replica set stream) or a whole shard's set (mongos)."""

    oplog: Any
    clock: Any

    def commit_key(self) -> int: ...

    async def wait_commit_beyond(self, key: int, deadline: float) -> bool: ...


class NativeStream:
    def __init__(
        self,
        nodes: list[OplogSource],
        db: str,
        coll: str | None,
        spec: dict[str, Any],
        stages: list[dict[str, Any]],
        *,
        version: int = 2,
        topology: Callable[[], list[tuple[OplogSource, Timestamp]]] | None = None,
        split: bool = False,
    ) -> None:
        self.nodes = nodes
        # mongos: every shard with the time it joined, in joining order. A shard added after the
        # stream opened is read from its topologyTime, like mongos's kNewShardDetected handling.
        self.topology = topology
        self.spec = spec
        self.version = version
        self.db, self.coll = db, coll
        self.scope = (
            "cluster"
            if spec.get("allChangesForCluster")
            else ("database" if coll is None else "collection")
        )
        self.full_document = spec.get("fullDocument", "default")
        self.before_change = spec.get("fullDocumentBeforeChange", "off")
        # Which member set each pending event came from: its pre- and post-images live there.
        self.origin: dict[bytes, Any] = {}
        self.stages = compile_stages(stages)
        # $changeStreamSplitLargeEvent ends the pipeline: events too large are returned in fragments.
        # On mongos the shards split (and size) events with their merge metadata.
        self.split, self.merged = split, topology is not None
        # Shaped events to return first, with their tokens: a split event's fragments, or an event
        # (and its invalidate) the last reply had no room for, as a server stashes the document
        # that would take a reply past 16 MiB for the next getMore.
        self.held: collections.deque[tuple[RawBSONDocument, dict[str, Any]]] = collections.deque()
        # Resumed from a fragment's token: the fragments of the event resumed from (`must_meet`)
        # the client already has, skipped when it is split again.
        self.skip_fragments = 0
        # Resuming from an event's token, that event must be met again (the server's
        # EnsureResumeTokenPresent stage, which runs after scope and $match filtering): its key
        # until then. Passing it unmet fails the stream; a high-water mark needs no event.
        self.must_meet: bytes | None = None
        self.met = False
        token = spec.get("resumeAfter") or spec.get("startAfter")
        self.resumed_from = decode_token(token) if token is not None else None
        self.transformers = [self._transformer(node) for node in nodes]
        if token is not None:
            data = decode_token(token)
            if data.from_invalidate and "resumeAfter" in spec:
                raise MongoError(
                    260,
                    "Attempting to resume a change stream using 'resumeAfter' is not allowed "
                    "from an invalidate notification.",
                )
            start = data.cluster_time
            self.skip_key = token_sort_key(token)
            if data.fragment_num is not None and not split:
                raise MongoError(
                    "ChangeStreamFatalError",
                    "To resume from a split event, the $changeStream pipeline "
                    f"must include a {SPLIT_STAGE} stage",
                )
            fragment = fragment_of(data)
            if data.token_type == EVENT_TOKEN and not data.from_invalidate:
                self.must_meet = fragment[0] if fragment is not None else self.skip_key
            if fragment is not None:  # that event again, past the fragment returned
                self.skip_fragments = fragment[1] + 1
            self.last_token: dict[str, Any] = dict(token)
        else:
            start = spec.get("startAtOperationTime") or nodes[0].clock.now()
            if "startAtOperationTime" not in spec:
                start = Timestamp(
                    start.time, start.inc + 1
                )  # a new stream sees what happens after now
            self.skip_key = token_sort_key(high_water_mark(start, version))
            self.last_token = high_water_mark(start, version)
        self.positions = [ts_key(start) - 1 for _ in nodes]
        for node in nodes:
            first = node.oplog.first_key()
            if ts_key(start) < first and node.oplog.truncated_before:
                raise MongoError(
                    "ChangeStreamHistoryLost",
                    "Resume of change stream was not possible, as the resume "
                    "point may no longer be in the oplog.",
                )
        self.pending: list[RefEvent] = []
        self.ready: collections.deque[RefEvent] = collections.deque()
        self.frontier = min(self.positions)
        self.done = False
        self.end_token: dict[str, Any] | None = (
            None  # the invalidate's token, once the stream ended
        )

    # -- reading -----------------------------------------------------------------------------------

    def _join_new_shards(self) -> None:
        """Checked before each read, in the same synchronous step: no entry read in this poll can
        be newer than a shard added before it, so the frontier never passed the new shard's start."""
        if self.topology is None:
            return
        for node, joined in self.topology()[len(self.nodes) :]:
            self.nodes.append(node)
            self.positions.append(max(ts_key(joined) - 1, self.frontier))
            self.transformers.append(self._transformer(node))

    def _transformer(self, node: OplogSource) -> ReferenceTransformer:
        return ReferenceTransformer(
            db=self.db,
            coll=self.coll,
            cluster=self.scope == "cluster",
            expanded=bool(self.spec.get("showExpandedEvents")),
            migration=bool(self.spec.get("showMigrationEvents")),
            system_events=bool(self.spec.get("showSystemEvents")),
            version=self.version,
            resumed_from=self.resumed_from,
            chain=node.oplog.chain_through,
        )

    def _poll(self) -> list[RefEvent]:
        self._join_new_shards()
        for i, node in enumerate(self.nodes):
            # Bounded reads, like one getMore batch per shard cursor.
            raws = node.oplog.read_after(self.positions[i], 4096, upto=node.commit_key())
            if raws:
                transformer = self.transformers[i]
                for raw in raws:
                    for ev in transformer.events(raw):
                        if ev.sort_key > self.skip_key or ev.sort_key == self.must_meet:
                            self.pending.append(ev)
                            if self.before_change != "off" or self.full_document in _IMAGE_MODES:
                                self.origin[ev.sort_key] = node
                self.positions[i] = node.oplog.entry_key(raws[-1])
        # Every shard has been read through its position: nothing at or below the oldest can still come.
        frontier = self.frontier = min(self.positions)
        ready = sorted(
            (e for e in self.pending if ts_key(e.cluster_time) <= frontier),
            key=lambda e: e.sort_key,
        )
        self.pending = [e for e in self.pending if ts_key(e.cluster_time) > frontier]
        return ready

    def _shape(self, ev: RefEvent, node_for_lookup: Any) -> Any:
        """Apply fullDocument lookups or post-images, pre-images and the user's stages to one event:
        the event's document, or None when a $match drops it."""
        origin = self.origin.pop(ev.sort_key, None)
        wants_post = ev.op_type == "update" and self.full_document != "default"
        wants_pre = self.before_change != "off" and ev.op_type in ("update", "replace", "delete")
        doc = ev.doc
        images = (
            origin.images.get((ev.image_key[0], ts_key(ev.image_key[1]), ev.image_key[2]))
            if origin is not None and ev.image_key is not None
            else None
        )
        if wants_post:
            if self.full_document == "updateLookup":
                after = node_for_lookup(f"{ev.db}.{ev.coll}", doc["documentKey"])
            else:  # whenAvailable / required: the post-image recorded with the write
                after = images[1] if images is not None else None
                if after is None and self.full_document == "required":
                    raise MongoError(
                        "NoMatchingDocument",
                        "Change stream was configured to require a post-image "
                        "for all update events, but the post-image was not found for event: "
                        f"{_image_error_text(doc)}",
                    )
            doc = _with_full_document(doc, after)
        if wants_pre:
            before = images[0] if images is not None else None
            if before is None and self.before_change == "required":
                raise MongoError(
                    "NoMatchingDocument",
                    "Change stream was configured to require a pre-image for all "
                    "update, delete and replace events, but the pre-image was not found for event: "
                    f"{_image_error_text(doc)}",
                )
            # DocumentSourceChangeStreamAddPreImage sets a field the event does not have (it
            # removes the transform's preImageId): Document appends it, after every other field.
            doc = {**doc, "fullDocumentBeforeChange": before}
        if self.stages:
            return apply_stages(doc, self.stages, ev.token)
        return doc

    def _large(self, raw: bytes, skip: int) -> Any:
        """A large event as the server returns it: whole, in fragments (with their tokens, past the
        first `skip`) when the pipeline ends with the split stage, or BSONObjectTooLarge."""
        if self.split:
            fragments = split_event(raw, merged=self.merged, skip=skip)
            if fragments is not None:
                return [(RawBSONDocument(fragment, RAW), token) for token, fragment in fragments]
        elif (too_large := event_too_large(raw, merged=self.merged)) is not None:
            raise too_large
        return RawBSONDocument(raw, RAW)

    async def fetch(self, limit: int, deadline: float, lookup: Any) -> list[Any]:
        import trio

        out: list[Any] = []
        ready = self.ready
        last: RefEvent | None = None  # the last event returned: its token is computed once
        size = 0
        while True:
            while self.held and len(out) < limit:
                doc, token = self.held[0]
                if out and size + len(doc.raw) + BATCH_ELEMENT_OVERHEAD > BATCH_BYTES_LIMIT:
                    return out
                self.held.popleft()
                out.append(doc)
                size += len(doc.raw) + BATCH_ELEMENT_OVERHEAD
                self.last_token = token
            if self.held or self.done:
                if self.done and not self.held and self.end_token is not None:
                    # Closed on ChangeStreamInvalidated: its token, the invalidate's, is the last
                    # postBatchResumeToken, also when a stage dropped the invalidate (the
                    # cursor code of mongos and mongod catches that exception and sets it).
                    self.last_token = self.end_token
                return out
            if not ready:
                ready.extend(self._poll())
            while ready and len(out) < limit:
                ev = ready.popleft()
                shaped = self._shape(ev, lookup)
                if shaped is not None:  # in the event's own field order, as the server sends it
                    shaped = RawBSONDocument(encode_event(shaped), RAW)
                skip = 0
                if shaped is not None and self.must_meet is not None:
                    if ev.sort_key == self.must_meet:
                        # The event the client has: swallowed, unless the client had fragments
                        # of it, then split again past them. Once met, a copy is swallowed too.
                        if self.met or not self.skip_fragments:
                            shaped = None
                        skip, self.met = self.skip_fragments, True
                    elif not self.met:
                        raise MongoError(
                            "ChangeStreamFatalError",
                            "cannot resume stream; the resume token was not "
                            f"found. {token_text(ev.token)}",
                        )
                    else:
                        self.must_meet = None  # passed it
                if (
                    shaped is not None
                ):  # (one the stages dropped is never a resume point, as on a server)
                    if len(shaped.raw) > MEASURE_ABOVE_BYTES or skip:
                        shaped = self._large(shaped.raw, skip)
                    if isinstance(shaped, list):  # fragments: returned from the top of the loop
                        self.held.extend(shaped)
                    elif self.held or (
                        out and size + len(shaped.raw) + BATCH_ELEMENT_OVERHEAD > BATCH_BYTES_LIMIT
                    ):
                        self.held.append((shaped, ev.token))
                    else:
                        out.append(shaped)
                        size += len(shaped.raw) + BATCH_ELEMENT_OVERHEAD
                        last = ev
                if self.scope in _INVALIDATING and ev.op_type in _INVALIDATING[self.scope]:
                    # The invalidate comes from a stage of $changeStream itself (CheckInvalidate),
                    # ahead of the user's stages: a $match may drop it, and the stream ends all the same.
                    inv = invalidate_for(ev)
                    self.end_token = inv.token
                    inv_doc = (
                        apply_stages(inv.doc, self.stages, inv.token) if self.stages else inv.doc
                    )
                    if inv_doc is None:
                        pass
                    elif self.held:
                        self.held.append((RawBSONDocument(encode_event(inv_doc), RAW), inv.token))
                    else:
                        out.append(RawBSONDocument(encode_event(inv_doc), RAW))
                        last = inv
                    self.done = True
                if self.held or self.done:
                    break
            if last is not None:
                self.last_token, last = last.token, None
            if self.held or self.done:
                continue  # the held ones go out first, as far as this reply has room
            if out:
                return out
            if any(n.commit_key() > p for n, p in zip(self.nodes, self.positions, strict=True)):
                if trio.current_time() >= deadline:
                    return out
                await (
                    trio.lowlevel.checkpoint()
                )  # a long catch-up must not starve other connections
                continue  # more entries to read right away
            if not self.pending:
                hwm = high_water_mark(
                    Timestamp(self.frontier >> 32, self.frontier & 0xFFFFFFFF), self.version
                )
                if token_sort_key(hwm) > token_sort_key(self.last_token):
                    self.last_token = hwm
            if trio.current_time() >= deadline:
                return out
            with trio.move_on_at(deadline):
                async with trio.open_nursery() as nursery:
                    # Wake on the first write to any shard, like a getMore waiting on its shard cursors.
                    for node in self.nodes:
                        nursery.start_soon(_wake, node, nursery)


def _with_full_document(event: dict[str, Any], document: Any) -> dict[str, Any]:
    """`event` with fullDocument in its slot before `ns`: the transform adds the field (missing)
    for every update when a post-image is wanted, and the post-image stage fills it in place."""
    out: dict[str, Any] = {}
    for key, value in event.items():
        if key == "ns":
            out["fullDocument"] = document
        out[key] = value
    return out


def _image_error_text(event: dict[str, Any]) -> str:
    """The event as a missing image's error names it (ChangeStreamAddPreImageStage::
    makePreImageNotFoundErrorMsg, also used for post-images): a Document of operationType, ns,
    clusterTime and txnNumber, printed by Document::toString (a missing field left out)."""

    def text(value: Any) -> str:
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}: {text(v)}" for k, v in value.items()) + "}"
        if isinstance(value, Timestamp):
            return f"Timestamp({value.time}, {value.inc})"
        return _element_text(value)

    return text(
        {k: event[k] for k in ("operationType", "ns", "clusterTime", "txnNumber") if k in event}
    )


async def _wake(node: Any, nursery: Any) -> None:
    import trio

    await node.wait_commit_beyond(node.commit_key(), trio.current_time() + 3600)
    nursery.cancel_scope.cancel()


async def open_native_stream(
    server: Any,
    db: str,
    cmd: dict[str, Any],
    nodes: list[Any] | None = None,
    lookup: Any = None,
    topology: Any = None,
    is_view: Any = None,
) -> dict[str, Any]:
    """Serve an aggregate whose first stage is $changeStream; `nodes` are the oplogs to read;
    `is_view(ns)` says whether a namespace is a view."""
    # 5.0 servers know no expanded events; 5.0 and 6.0 write v1 tokens (v2 is the default from 6.1,
    # shared/reference/mongodb-formats.md A.6).
    spec, stages, split = parse_change_stream(cmd, 1 if server.version == "5.0" else 2)
    _check_read_concern(cmd.get("readConcern"))
    # The split stage makes a 6.0 stream write v2 tokens (fragmentNum needs them).
    version = 1 if server.version in ("5.0", "6.0") and not split else 2
    coll = cmd["aggregate"] if isinstance(cmd["aggregate"], str) else None
    _check_namespace(db, coll, spec, is_view)
    if nodes is None:
        nodes = list(server.shards.values())
    stream = NativeStream(
        nodes, db, coll, spec, stages, version=version, topology=topology, split=split
    )
    ns = f"{db}.{coll}" if coll is not None else f"{db}.$cmd.aggregate"

    async def fetch(limit: int, deadline: float) -> list[Any]:
        try:
            return await stream.fetch(limit, deadline, lookup)
        except MongoError as exc:
            exc.change_stream = True  # type: ignore[attr-defined]
            raise

    cursor = Cursor(
        ns,
        fetch=fetch,
        tailable=True,
        await_data=True,
        change_stream=True,
        extra=lambda: {"postBatchResumeToken": stream.last_token},
        done=lambda: stream.done,
    )
    batch = cmd.get("cursor", {}).get("batchSize")
    # No batchSize: every event there is now (batchSize 0 gives none, as for find).
    return {"cursor": await server.cursors.first_batch(cursor, 1 << 30 if batch is None else batch)}
