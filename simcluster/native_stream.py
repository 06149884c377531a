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
pass-through contract needs (tests/integration/test_accelerate.py).

Sources: shared/reference/000 section 3.5 (mongos merge), mongodb-formats.md C.11 (invalidate),
D.2 (reply shapes, cursor namespaces), D.4 (error labels); the drivers' change-streams spec.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, Protocol

import trio
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
    check_namespace,
    check_read_concern,
    element_text,
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


class _Reply:
    """The batch a getMore returns: at most `limit` documents and BATCH_BYTES_LIMIT bytes, but
    always the first document, whatever its size (the server's batch rule)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.docs: list[RawBSONDocument] = []
        self.size = 0

    def full(self) -> bool:
        return len(self.docs) >= self.limit

    def has_room(self, raw: bytes | memoryview) -> bool:
        return not self.docs or self.size + len(raw) + BATCH_ELEMENT_OVERHEAD <= BATCH_BYTES_LIMIT

    def add(self, doc: RawBSONDocument) -> None:
        self.docs.append(doc)
        self.size += len(doc.raw) + BATCH_ELEMENT_OVERHEAD


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
        self.scope = _scope(spec, coll)
        self.full_document = spec.get("fullDocument", "default")
        self.before_change = spec.get("fullDocumentBeforeChange", "off")
        # Which member set each pending event came from: its pre- and post-images live there.
        self.origin: dict[bytes, Any] = {}
        self.stages = compile_stages(stages)
        # $changeStreamSplitLargeEvent ends the pipeline: events too large are returned in
        # fragments. On mongos the shards split (and size) events with their merge metadata.
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
        self.last_token: dict[str, Any]
        start = self._resume(token) if token is not None else self._start()
        self.positions = [ts_key(start) - 1 for _ in nodes]
        _check_history(nodes, start)
        self.pending: list[RefEvent] = []
        self.ready: collections.deque[RefEvent] = collections.deque()
        self.frontier = min(self.positions)
        self.done = False
        # The invalidate's token, once the stream ended.
        self.end_token: dict[str, Any] | None = None

    def _resume(self, token: dict[str, Any]) -> Timestamp:
        """Set up a stream resumed from `token` (resumeAfter, startAfter); its start time."""
        data = decode_token(token)
        self._check_resumable(data)
        self.skip_key = token_sort_key(token)
        fragment = fragment_of(data)
        if data.token_type == EVENT_TOKEN and not data.from_invalidate:
            self.must_meet = fragment[0] if fragment is not None else self.skip_key
        if fragment is not None:  # that event again, past the fragment returned
            self.skip_fragments = fragment[1] + 1
        self.last_token = dict(token)
        return data.cluster_time

    def _check_resumable(self, data: Any) -> None:
        """Refuse resumeAfter an invalidate, and a split event's token without the split stage."""
        if data.from_invalidate and "resumeAfter" in self.spec:
            raise MongoError(
                260,
                "Attempting to resume a change stream using 'resumeAfter' is not allowed "
                "from an invalidate notification.",
            )
        if data.fragment_num is not None and not self.split:
            raise MongoError(
                "ChangeStreamFatalError",
                "To resume from a split event, the $changeStream pipeline "
                f"must include a {SPLIT_STAGE} stage",
            )

    def _start(self) -> Timestamp:
        """Set up a stream opened at startAtOperationTime, or now; its start time."""
        start = self.spec.get("startAtOperationTime")
        if start is None:  # a new stream sees what happens after now
            now = self.nodes[0].clock.now()
            start = Timestamp(now.time, now.inc + 1)
        self.skip_key = token_sort_key(high_water_mark(start, self.version))
        self.last_token = high_water_mark(start, self.version)
        return start

    # -- reading -----------------------------------------------------------------------------------

    def _join_new_shards(self) -> None:
        """Checked before each read, in the same synchronous step: no entry read in this poll can
        be newer than a shard added before it, so the frontier never passed the new shard's
        start."""
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
            self._read_shard(i, node)
        # Every shard has been read through its position: nothing at or below the oldest can
        # still come.
        frontier = self.frontier = min(self.positions)
        return self._take_through(frontier)

    def _take_through(self, frontier: int) -> list[RefEvent]:
        """The pending events at or below the frontier, in token order; the rest stay."""
        ready = sorted(
            (e for e in self.pending if ts_key(e.cluster_time) <= frontier),
            key=lambda e: e.sort_key,
        )
        self.pending = [e for e in self.pending if ts_key(e.cluster_time) > frontier]
        return ready

    def _read_shard(self, i: int, node: OplogSource) -> None:
        """The shard's new majority-committed entries, as events, into `pending`."""
        # Bounded reads, like one getMore batch per shard cursor.
        raws = node.oplog.read_after(self.positions[i], 4096, upto=node.commit_key())
        if not raws:
            return
        wants_images = self.before_change != "off" or self.full_document in _IMAGE_MODES
        for raw in raws:
            for ev in self.transformers[i].events(raw):
                self._keep(ev, node if wants_images else None)
        self.positions[i] = node.oplog.entry_key(raws[-1])

    def _keep(self, ev: RefEvent, origin: OplogSource | None) -> None:
        """Keep an event past the resume point (or the one to meet again) as pending, with the
        member set its images live in when the stream wants them."""
        if ev.sort_key > self.skip_key or ev.sort_key == self.must_meet:
            self.pending.append(ev)
            if origin is not None:
                self.origin[ev.sort_key] = origin

    # -- shaping -----------------------------------------------------------------------------------

    def _shape(self, ev: RefEvent, node_for_lookup: Any) -> Any:
        """Apply fullDocument lookups or post-images, pre-images and the user's stages to one
        event: the event's document, or None when a $match drops it."""
        images = self._images(ev)
        doc = ev.doc
        if ev.op_type == "update" and self.full_document != "default":
            doc = _with_full_document(doc, self._post_image(ev, images, node_for_lookup))
        if self.before_change != "off" and ev.op_type in ("update", "replace", "delete"):
            # DocumentSourceChangeStreamAddPreImage sets a field the event does not have (it
            # removes the transform's preImageId): Document appends it, after every other field.
            doc = {**doc, "fullDocumentBeforeChange": self._pre_image(doc, images)}
        if self.stages:
            return apply_stages(doc, self.stages, ev.token)
        return doc

    def _images(self, ev: RefEvent) -> object:
        """The (pre-image, post-image) recorded with the event's write, if any."""
        origin = self.origin.pop(ev.sort_key, None)
        if origin is None or ev.image_key is None:
            return None
        return origin.images.get((ev.image_key[0], ts_key(ev.image_key[1]), ev.image_key[2]))

    def _post_image(self, ev: RefEvent, images: Any, node_for_lookup: Any) -> Any:
        """An update's fullDocument: looked up now (updateLookup), or the post-image recorded
        with the write (whenAvailable, required)."""
        if self.full_document == "updateLookup":
            return node_for_lookup(f"{ev.db}.{ev.coll}", ev.doc["documentKey"])
        after = images[1] if images is not None else None
        if after is None and self.full_document == "required":
            raise MongoError(
                "NoMatchingDocument",
                "Change stream was configured to require a post-image "
                "for all update events, but the post-image was not found for event: "
                f"{_image_error_text(ev.doc)}",
            )
        return after

    def _pre_image(self, doc: dict[str, Any], images: Any) -> Any:
        before = images[0] if images is not None else None
        if before is None and self.before_change == "required":
            raise MongoError(
                "NoMatchingDocument",
                "Change stream was configured to require a pre-image for all "
                "update, delete and replace events, but the pre-image was not found for "
                f"event: {_image_error_text(doc)}",
            )
        return before

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

    # -- a getMore's batch -------------------------------------------------------------------------

    async def fetch(self, limit: int, deadline: float, lookup: Any) -> list[Any]:
        reply = _Reply(limit)
        while True:
            if not self._send_held(reply):
                return reply.docs
            if self._stopped():
                self._settle_end_token()
                return reply.docs
            self._fill(reply, lookup)
            if self._stopped():
                continue  # the held ones go out first, as far as this reply has room
            if reply.docs or not await self._wait_for_entries(deadline):
                return reply.docs

    def _stopped(self) -> bool:
        """Whether the reply stops taking new events: some are held, or the stream ended."""
        return bool(self.held) or self.done

    def _settle_end_token(self) -> None:
        """Closed on ChangeStreamInvalidated: its token, the invalidate's, is the last
        postBatchResumeToken, also when a stage dropped the invalidate (the cursor code of
        mongos and mongod catches that exception and sets it)."""
        if self.done and not self.held and self.end_token is not None:
            self.last_token = self.end_token

    def _fill(self, reply: _Reply, lookup: Any) -> None:
        """Read what is ready (polling the shards when nothing is) into the reply."""
        if not self.ready:
            self.ready.extend(self._poll())
        last = self._take_ready(reply, lookup)
        if last is not None:
            self.last_token = last.token

    def _send_held(self, reply: _Reply) -> bool:
        """Move held documents into the reply; False when the next one does not fit in it."""
        while self.held and not reply.full():
            doc, token = self.held[0]
            if not reply.has_room(doc.raw):
                return False
            self.held.popleft()
            reply.add(doc)
            self.last_token = token
        return True

    def _take_ready(self, reply: _Reply, lookup: Any) -> RefEvent | None:
        """Shape ready events into the reply until it is full, something is held or the stream
        ended; the last event returned (its token is the reply's resume point)."""
        last = None
        while self.ready and not reply.full():
            ev = self.ready.popleft()
            if self._return_event(ev, reply, lookup):
                last = ev
            invalidate = self._end_on_invalidate(ev, reply)
            if invalidate is not None:
                last = invalidate
            if self._stopped():
                break
        return last

    def _return_event(self, ev: RefEvent, reply: _Reply, lookup: Any) -> bool:
        """Shape the event and put it in the reply (True) or hold it; False when the stages or
        the resume point drop it (one the stages dropped is never a resume point, as on a
        server)."""
        shaped = self._shape(ev, lookup)
        if shaped is None:
            return False
        # In the event's own field order, as the server sends it.
        doc: Any = RawBSONDocument(encode_event(shaped), RAW)
        drop, skip = self._check_resume_point(ev)
        if drop:
            return False
        if len(doc.raw) > MEASURE_ABOVE_BYTES or skip:
            doc = self._large(doc.raw, skip)
        return self._place(doc, ev, reply)

    def _place(self, doc: Any, ev: RefEvent, reply: _Reply) -> bool:
        """Put the shaped event in the reply (True), or hold it (or its fragments) for the next
        one."""
        if isinstance(doc, list):  # fragments: returned from the top of fetch's loop
            self.held.extend(doc)
        elif self.held or not reply.has_room(doc.raw):
            self.held.append((doc, ev.token))
        else:
            reply.add(doc)
            return True
        return False

    def _check_resume_point(self, ev: RefEvent) -> tuple[bool, int]:
        """While resuming from an event's token: whether to drop this event (the one the client
        has, or a copy of it) and how many of its fragments the client has."""
        if self.must_meet is None:
            return False, 0
        if ev.sort_key == self.must_meet:
            # Swallowed, unless the client had fragments of it, then split again past them.
            drop = self.met or not self.skip_fragments
            self.met = True
            return drop, self.skip_fragments
        if not self.met:
            raise MongoError(
                "ChangeStreamFatalError",
                f"cannot resume stream; the resume token was not found. {token_text(ev.token)}",
            )
        self.must_meet = None  # passed it
        return False, 0

    def _end_on_invalidate(self, ev: RefEvent, reply: _Reply) -> RefEvent | None:
        """End the stream after an event that invalidates it; the invalidate when it went into
        the reply. The invalidate comes from a stage of $changeStream itself (CheckInvalidate),
        ahead of the user's stages: a $match may drop it, and the stream ends all the same."""
        if ev.op_type not in _INVALIDATING.get(self.scope, ()):
            return None
        invalidate = invalidate_for(ev)
        self.end_token = invalidate.token
        self.done = True
        doc = invalidate.doc
        if self.stages:
            doc = apply_stages(doc, self.stages, invalidate.token)
        if doc is None:
            return None
        raw = RawBSONDocument(encode_event(doc), RAW)
        if self.held:
            self.held.append((raw, invalidate.token))
            return None
        reply.add(raw)
        return invalidate

    def _advance_to_frontier(self) -> None:
        """With nothing pending, the resume point moves up to the merge frontier's high-water
        mark."""
        hwm = high_water_mark(
            Timestamp(self.frontier >> 32, self.frontier & 0xFFFFFFFF), self.version
        )
        if token_sort_key(hwm) > token_sort_key(self.last_token):
            self.last_token = hwm

    async def _wait_for_entries(self, deadline: float) -> bool:
        """Until there is more to read or the deadline (then False)."""
        if self._more_to_read():
            if trio.current_time() >= deadline:
                return False
            await trio.lowlevel.checkpoint()  # a long catch-up must not starve other connections
            return True  # more entries to read right away
        if not self.pending:
            self._advance_to_frontier()
        if trio.current_time() >= deadline:
            return False
        await self._wait_for_a_write(deadline)
        return True

    def _more_to_read(self) -> bool:
        """Whether some shard has committed entries past where the stream read it."""
        return any(n.commit_key() > p for n, p in zip(self.nodes, self.positions, strict=True))

    async def _wait_for_a_write(self, deadline: float) -> None:
        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:
                # Wake on the first write to any shard, like a getMore waiting on its shard
                # cursors.
                for node in self.nodes:
                    nursery.start_soon(_wake, node, nursery)


def _scope(spec: dict[str, Any], coll: str | None) -> str:
    """What a stream watches: the cluster, a database or a collection."""
    if spec.get("allChangesForCluster"):
        return "cluster"
    return "database" if coll is None else "collection"


def _check_history(nodes: list[OplogSource], start: Timestamp) -> None:
    """ChangeStreamHistoryLost when some oplog no longer reaches back to `start`."""
    for node in nodes:
        if ts_key(start) < node.oplog.first_key() and node.oplog.truncated_before:
            raise MongoError(
                "ChangeStreamHistoryLost",
                "Resume of change stream was not possible, as the resume "
                "point may no longer be in the oplog.",
            )


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
        return element_text(value)

    return text(
        {k: event[k] for k in ("operationType", "ns", "clusterTime", "txnNumber") if k in event}
    )


async def _wake(node: Any, nursery: Any) -> None:
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
    check_read_concern(cmd.get("readConcern"))
    # The split stage makes a 6.0 stream write v2 tokens (fragmentNum needs them).
    version = 1 if server.version in ("5.0", "6.0") and not split else 2
    coll = cmd["aggregate"] if isinstance(cmd["aggregate"], str) else None
    check_namespace(db, coll, spec, is_view)
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
