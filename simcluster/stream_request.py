"""What a change stream's opening aggregate may ask for: the $changeStream spec's fields and
types, the stages after it, the read concern and the namespace, each refused as the server
refuses it."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from bson import Timestamp

from mongoformats.change_stages import unsupported_in_stages
from mongoformats.errors import MongoError
from mongoformats.idl import wrong_type
from mongoformats.large_events import (
    SPLIT_STAGE,
    without_split_stage,
)

_OPTIONS = frozenset(
    {
        "fullDocument",
        "fullDocumentBeforeChange",
        "resumeAfter",
        "startAfter",
        "startAtOperationTime",
        "allChangesForCluster",
        "showExpandedEvents",
        "showMigrationEvents",
        "showSystemEvents",
        "$_generateV2ResumeTokens",
    }
)


# Stages allowed after $changeStream (the server's allow-list, minus those simcluster lacks).
_STAGES = frozenset(
    {
        "$match",
        "$project",
        "$addFields",
        "$set",
        "$unset",
        "$replaceRoot",
        "$replaceWith",
        "$redact",
        "$changeStreamSplitLargeEvent",
    }
)


# Each option's Python type and the IDL's type name (document_source_change_stream.idl): tokens are
# `resumeToken` (bson_serialization_type object), the modes are string enums, the flags bool.
_OPTION_TYPES: dict[str, tuple[type | tuple[type, ...], str]] = {
    "resumeAfter": (dict, "object"),
    "startAfter": (dict, "object"),
    "startAtOperationTime": (Timestamp, "timestamp"),
    "fullDocument": (str, "string"),
    "fullDocumentBeforeChange": (str, "string"),
    **{
        flag: (bool, "bool")
        for flag in (
            "allChangesForCluster",
            "showExpandedEvents",
            "showMigrationEvents",
            "showSystemEvents",
            "$_generateV2ResumeTokens",
        )
    },
}

# The string enums' values.
_ENUMS = {
    "fullDocument": ("default", "updateLookup", "whenAvailable", "required"),
    "fullDocumentBeforeChange": ("off", "whenAvailable", "required"),
}


def element_text(value: Any) -> str:
    """A value as BSONElement::toString prints it in an error message (the common kinds)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return "null" if value is None else str(value)


def parse_change_stream(
    cmd: dict[str, Any], version: int = 2
) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
    """The $changeStream spec, the stages after it but $changeStreamSplitLargeEvent, and whether
    that one ends the pipeline; `version` 1 is a 5.0 server (no expanded events, no pre-images)."""
    pipeline = cmd.get("pipeline", [])
    spec = pipeline[0]["$changeStream"]
    _check_unsimulated(cmd)
    if not isinstance(spec, dict):
        # DocumentSourceChangeStream::LiteParsed (document_source_change_stream.h).
        raise MongoError(
            6188500,
            f"$changeStream must take a nested object but found: $changeStream: "
            f"{element_text(spec)}",
        )
    _check_spec(spec, version)
    _check_stage_names(pipeline[1:], version)
    stages, split = without_split_stage(pipeline[1:])
    if (unsupported := unsupported_in_stages(stages)) is not None:
        # Said at once, not as some later event's error or, worse, as events shaped wrongly.
        raise MongoError(
            "NotImplemented", f"simcluster does not evaluate {unsupported} in a change stream"
        )
    return spec, stages, split


def _check_unsimulated(cmd: dict[str, Any]) -> None:
    """Said at once rather than answered as if they were not there: an explain is no cursor, and
    a collation changes what the stages' comparisons match."""
    if cmd.get("explain"):
        raise MongoError("NotImplemented", "simcluster does not explain change streams")
    if cmd.get("collation", {"locale": "simple"}) != {"locale": "simple"}:
        raise MongoError(
            "NotImplemented", "simcluster does not compare by a collation in a change stream"
        )


def _check_spec(spec: dict[str, Any], version: int) -> None:
    """The IDL parser (document_source_change_stream.idl), field by field in the spec's order:
    an unknown field, then each field's BSON type; the enums' values after that."""
    for key, value in spec.items():
        _check_field(key, value, version)
    for key, allowed in _ENUMS.items():
        if key in spec:
            _check_enum(key, spec[key], allowed)
    if sum(k in spec for k in ("resumeAfter", "startAfter", "startAtOperationTime")) > 1:
        raise MongoError(
            40674, "Only one type of resume option is allowed, but multiple were found."
        )


def _check_enum(key: str, value: object, allowed: Container[object]) -> None:
    """IDLParserContext::throwBadEnumValue for a value the enum does not have."""
    if value not in allowed:
        raise MongoError(
            "BadValue",
            f"Enumeration value '{value}' for field '$changeStream.{key}' is not a valid value.",
        )


def _check_field(key: str, value: Any, version: int) -> None:
    if not _known_option(key, version):
        raise MongoError(
            "IDLUnknownField", f"BSON field '$changeStream.{key}' is an unknown field."
        )
    wanted, type_name = _OPTION_TYPES[key]
    if not isinstance(value, wanted) or (type_name != "bool" and isinstance(value, bool)):
        raise wrong_type(f"$changeStream.{key}", value, type_name)


def _known_option(key: str, version: int) -> bool:
    """An option of $changeStream; 5.0 knows neither showExpandedEvents nor
    fullDocumentBeforeChange."""
    return key in _OPTIONS and not (
        key in ("showExpandedEvents", "fullDocumentBeforeChange") and version < 2
    )


def _check_stage_names(stages: list[dict[str, Any]], version: int) -> None:
    for stage in stages:
        if "$changeStream" in stage:
            raise MongoError(40602, "$changeStream is only valid as the first stage in a pipeline.")
        name = next(iter(stage), "")
        if name not in _STAGES or (name == SPLIT_STAGE and version < 2):  # 5.0 has no such stage
            raise MongoError(40324, f"Unrecognized pipeline stage name: '{name}'")


def check_read_concern(read_concern: Any) -> None:
    """A change stream reads at majority only: DocumentSourceChangeStream::LiteParsed::
    supportsReadConcern answers onlySingleReadConcernSupported(majority), InvalidOptions for any
    other level given (jstests/noPassthrough/change_stream_require_majority_read_concern.js:
    local and linearizable fail; majority, and none, work)."""
    level = read_concern.get("level") if isinstance(read_concern, dict) else None
    if level is not None and level != "majority":
        raise MongoError(
            "InvalidOptions",
            "Aggregation stage $changeStream cannot run with a readConcern other "
            f"than 'majority'. Current readConcern: {level}",
        )


def check_namespace(db: str, coll: str | None, spec: dict[str, Any], is_view: Any) -> None:
    """Where a change stream may be opened (DocumentSourceChangeStream::
    assertIsLegalSpecification; jstests/change_streams/invalid_namespaces.js): the admin
    database only for a whole-cluster stream, never the local or config database nor a system.
    collection (InvalidNamespace); and never on a view (CommandNotSupportedOnView, the
    "is a view, not a collection" of AutoGetCollection;
    jstests/change_streams/ddl_view_events.js)."""
    whole_cluster = bool(spec.get("allChangesForCluster"))
    if whole_cluster:
        _check_whole_cluster(db, coll)
    if db == "admin" and not whole_cluster or db in ("local", "config"):
        raise MongoError(
            "InvalidNamespace", f"$changeStream may not be opened on the internal {db} database"
        )
    if coll is not None:
        _check_collection(db, coll, is_view)


def _check_whole_cluster(db: str, coll: str | None) -> None:
    if db != "admin" or coll is not None:
        raise MongoError(
            "InvalidOptions",
            "A change stream with 'allChangesForCluster:true' may only be opened on "
            "the 'admin' database, and with no collection name",
        )


def _check_collection(db: str, coll: str, is_view: Any) -> None:
    if coll.startswith("system."):
        raise MongoError(
            "InvalidNamespace",
            f"$changeStream may not be opened on the internal {db}.{coll} collection",
        )
    if is_view is not None and is_view(f"{db}.{coll}"):
        raise MongoError(
            "CommandNotSupportedOnView", f"Namespace {db}.{coll} is a view, not a collection"
        )
