"""The pure half of an accelerated watch(): its aggregate read and checked, and the private
stream that serves it planned, without I/O (WatchCommands._accelerate_watch runs the plan).

Only streams whose every event the engine reproduces exactly are accelerated. Anything else
raises Decline, and mongos answers the aggregate unchanged; a malformed command raises the
MongoError mongos would answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bson import Int64, Timestamp

from buckets.commands import BEFORE_CHANGE, FULL_DOCUMENT, check_pipeline
from buckets.ports import Decline
from mongoformats.change_stages import unsupported_in_stages
from mongoformats.errors import MongoError
from mongoformats.idl import check_depth, check_lsid
from mongoformats.large_events import SPLIT_STAGE, without_split_stage
from mongoformats.privileges import change_stream_resource
from mongoformats.resume_token import (
    EVENT_TOKEN,
    ResumeTokenData,
    decode_token,
    fragment_of,
    high_water_mark,
)

# The fields of a watch()'s aggregate that leave its events as they are. Any other (collation,
# explain, let, hint, a transaction's, ...) changes what mongos answers, so it answers.
_WATCH_FIELDS = frozenset(
    {
        "aggregate",
        "pipeline",
        "cursor",
        "maxTimeMS",
        "comment",
        "lsid",
        "$db",
        "$clusterTime",
        "$readPreference",
        "readConcern",
        "apiVersion",
        "apiStrict",
        "apiDeprecationErrors",
        "allowDiskUse",
    }
)


_SIMPLE_COLLATION = {"locale": "simple"}  # binary comparison, the default: as if none were given


# The $changeStream options an accelerated watch() may give.
_ACCEPTED = frozenset(
    {
        "resumeAfter",
        "startAfter",
        "startAtOperationTime",
        "showExpandedEvents",
        "allChangesForCluster",
        "fullDocument",
        "fullDocumentBeforeChange",
        "showSystemEvents",
    }
)


def _well_typed_watch(cmd: Mapping[str, Any]) -> bool:
    """Whether the fields of a watch()'s aggregate that the engine reads have the types the
    server's parsers accept (what they then mean is checked where they are used)."""
    cursor = cmd.get("cursor", {})
    spec = cmd["pipeline"][0]["$changeStream"]
    if (
        not isinstance(cursor, dict)
        or not isinstance(cmd["aggregate"], (str, int, float))
        or not isinstance(spec, dict)
    ):
        return False
    if not _batch_size_ok(cursor.get("batchSize")) or not _lsid_ok(cmd):
        return False
    return all(isinstance(spec[k], t) for k, t in _SPEC_TYPES.items() if spec.get(k) is not None)


# The types of the $changeStream options the engine reads.
_SPEC_TYPES = {
    "resumeAfter": dict,
    "startAfter": dict,
    "startAtOperationTime": Timestamp,
    "showExpandedEvents": bool,
    "showSystemEvents": bool,
    "allChangesForCluster": bool,
    "fullDocument": str,
    "fullDocumentBeforeChange": str,
}


def _batch_size_ok(batch_size: Any) -> bool:
    return batch_size is None or (type(batch_size) in (int, Int64) and 0 <= batch_size <= 1 << 30)


def _lsid_ok(cmd: Mapping[str, Any]) -> bool:
    try:
        check_lsid(cmd)
    except MongoError:
        return False
    return True


def _check_read_concern(read_concern: Any) -> None:
    """A change stream reads at majority only, as mongos refuses any other level given
    (DocumentSourceChangeStream::LiteParsed::supportsReadConcern: onlySingleReadConcernSupported;
    jstests/noPassthrough/change_stream_require_majority_read_concern.js). A readConcern that is
    no document is left to mongos."""
    level = read_concern.get("level") if isinstance(read_concern, dict) else None
    if level is not None and level != "majority":
        raise MongoError(
            "InvalidOptions",
            "Aggregation stage $changeStream cannot run with a "
            f"readConcern other than 'majority'. Current readConcern: {level}",
        )


@dataclass(frozen=True)
class WatchRequest:
    """A watch() the engine can serve, once its client is found to hold the privileges."""

    db: str
    coll: str | None  # None: a database's or the whole cluster's stream
    spec: Mapping[str, Any]  # the $changeStream stage's options
    stages: list[dict[str, Any]]  # the stages after it, less a final split stage
    split: bool  # the pipeline ends with the split stage
    before_change: str

    @property
    def cluster_wide(self) -> bool:
        return bool(self.spec.get("allChangesForCluster"))

    @property
    def scope(self) -> tuple[str, str | None] | None:
        """The database and collection its stream reads (None: every one)."""
        return None if self.cluster_wide else (self.db, self.coll)

    @property
    def ns(self) -> str:
        """Its cursor's namespace, as mongos names it."""
        return f"{self.db}.{self.coll}" if self.coll is not None else f"{self.db}.$cmd.aggregate"

    @property
    def resource(self) -> dict[str, Any]:
        """What the client must hold find and changeStream on, as mongos checks it."""
        return change_stream_resource(None if self.cluster_wide else self.db, self.coll)


def read_watch(db: str, cmd: dict[str, Any]) -> WatchRequest:
    """A watch()'s aggregate `cmd` on `db`, checked as mongos checks what the engine reads;
    Decline for what the engine leaves to mongos."""
    if not _plain_fields(cmd):
        raise Decline()
    check_depth(cmd)  # mongos's own check of any command: every walk below is bounded
    pipeline = check_pipeline(cmd.get("pipeline"), "aggregate")
    if not _well_typed_watch(cmd):
        raise Decline()  # mongos answers a malformed field in its own words
    spec = pipeline[0]["$changeStream"]
    if isinstance(spec, dict):
        _check_read_concern(cmd.get("readConcern"))
    try:
        stages, split = without_split_stage(pipeline[1:])
    except MongoError:
        raise Decline() from None  # mongos answers a misplaced split stage
    if not _served(spec, stages):
        raise Decline()
    coll = cmd["aggregate"] if isinstance(cmd["aggregate"], str) else None
    _check_namespace(spec, db, coll)
    return WatchRequest(db, coll, spec, stages, split, spec.get("fullDocumentBeforeChange", "off"))


def _plain_fields(cmd: Mapping[str, Any]) -> bool:
    """Whether the aggregate gives only fields that leave its events as they are."""
    return not set(cmd) - _WATCH_FIELDS - {"collation"} and (
        cmd.get("collation", _SIMPLE_COLLATION) == _SIMPLE_COLLATION
    )


def _check_namespace(spec: Mapping[str, Any], db: str, coll: str | None) -> None:
    """Decline a stream on a namespace mongos answers with an error of its own."""
    if bool(spec.get("allChangesForCluster")) != (db == "admin" and coll is None):
        raise Decline()  # mongos answers the exact error for a misplaced stream
    if db in ("local", "config") or (coll is not None and coll.startswith("system.")):
        raise Decline()  # mongos refuses an internal namespace (InvalidNamespace)


def _served(spec: Any, stages: list[dict[str, Any]]) -> bool:
    """Whether the engine reproduces every event of a $changeStream stage with options `spec`
    followed by `stages`: known options with known values, one start point at most."""
    return (
        isinstance(spec, dict)
        and not set(spec) - _ACCEPTED
        and spec.get("fullDocument", "default") in FULL_DOCUMENT
        and spec.get("fullDocumentBeforeChange", "off") in BEFORE_CHANGE
        and unsupported_in_stages(stages) is None
        and sum(k in spec for k in ("resumeAfter", "startAfter", "startAtOperationTime")) <= 1
    )


@dataclass(frozen=True)
class WatchPlan:
    """The private one-bucket stream serving a watch(), and where its cursor starts."""

    open: dict[str, Any]  # the stream's parallelChangeStream options
    scope: tuple[str, str | None] | None  # its database and collection (None: the cluster)
    stages: tuple[dict[str, Any], ...]  # run on each returned event (): none, a $match filters
    keep_version: tuple[Timestamp, int] | None  # the resume token's version, kept by the stream
    # Resumed after an event: its token, and its fragment (sort key, number) if it was one; the
    # cursor must meet that event again before it returns anything.
    event_token: Mapping[str, Any] | None
    fragment: tuple[bytes, int] | None
    ns: str  # the cursor's namespace, as mongos names it
    batch_size: int | None


def plan_watch(request: WatchRequest, cmd: dict[str, Any], *, shard_buffer_bytes: int) -> WatchPlan:
    """The stream serving `request` (from `cmd`, the aggregate), each shard buffering up to
    `shard_buffer_bytes`; Decline for a resume mongos alone answers."""
    spec, split, before_change = request.spec, request.split, request.before_change
    token = spec.get("resumeAfter") or spec.get("startAfter")
    resumed = _resumed(token, split)
    full_document = spec.get("fullDocument", "default")
    sub: dict[str, Any] = {
        "nBuckets": 1,
        "showExpandedEvents": bool(spec.get("showExpandedEvents")),
        "showSystemEvents": bool(spec.get("showSystemEvents")),
        "fullDocument": full_document,
        "fullDocumentBeforeChange": before_change,
        "shardBufferBytes": shard_buffer_bytes,
    }
    event = _resumed_event(resumed)
    sub.update(_start(spec, token, event))
    stages = request.stages
    plain_match = _filters_as_dealt(stages, full_document, before_change)
    sub["pipeline"] = _sub_pipeline(stages, plain_match=plain_match, split=split)
    return WatchPlan(
        open=sub,
        scope=request.scope,
        stages=() if plain_match else tuple(stages),
        keep_version=None if resumed is None else (resumed.cluster_time, resumed.version),
        event_token=token if event is not None else None,
        fragment=fragment_of(event) if event is not None else None,
        ns=request.ns,
        batch_size=cmd.get("cursor", {}).get("batchSize"),
    )


def _resumed_event(resumed: ResumeTokenData | None) -> ResumeTokenData | None:
    """The resume token, if it is an event's (not a high-water mark's)."""
    return resumed if resumed is not None and resumed.token_type == EVENT_TOKEN else None


def _sub_pipeline(
    stages: list[dict[str, Any]], *, plain_match: bool, split: bool
) -> list[dict[str, Any]]:
    """The pipeline of the engine's stream: the $match stages when they filter as events are
    dealt, and the split stage when the client's pipeline ends with one."""
    return (stages if plain_match else []) + ([{SPLIT_STAGE: {}}] if split else [])


def _filters_as_dealt(stages: list[dict[str, Any]], full_document: str, before_change: str) -> bool:
    """Whether the stages are $match stages alone that filter events as they are dealt
    (cheapest); any other stage, or a lookup the stages may test, means the whole pipeline runs
    on each returned event."""
    return (
        all(set(st) == {"$match"} for st in stages)
        and full_document == "default"
        and before_change == "off"
    )


def _resumed(token: Mapping[str, Any] | None, split: bool) -> ResumeTokenData | None:
    """The resume token a watch() gives, decoded; Decline for one only mongos resumes from."""
    resumed = decode_token(token) if token is not None else None
    if resumed is not None and (
        resumed.from_invalidate or (resumed.fragment_num is not None and not split)
    ):
        # After an invalidate, or from a fragment without the split stage: mongos's rules,
        # mongos's errors.
        raise Decline()
    return resumed


def _start(
    spec: Mapping[str, Any], token: Mapping[str, Any] | None, event: ResumeTokenData | None
) -> dict[str, Any]:
    """Where a watch()'s private stream starts: the `resumeAfter` or `startAtOperationTime` of
    its open command (none: now)."""
    if event is not None:
        # From the high-water mark of its time: the stream must meet the event again.
        return {"resumeAfter": high_water_mark(event.cluster_time, event.version)}
    if token is not None:
        return {"resumeAfter": token}
    if "startAtOperationTime" in spec:
        return {"startAtOperationTime": spec["startAtOperationTime"]}
    return {}
