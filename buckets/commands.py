"""The pure half of parallelChangeStream, parallelChangeStreamStatus and
dropParallelChangeStream: each command read and checked without I/O, failing with the codes and
messages the server's parsers give the same fields (buckets/watch_command.py reads an accelerated
watch()'s aggregate, with the pipeline checks and option values shared from here).
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bson import Decimal128, Timestamp

from buckets.bucketing import BUCKET_BY, MAX_BUCKETS
from mongoformats.errors import MongoError
from mongoformats.expressions import VARIABLES
from mongoformats.idl import SAFE_INT64, check_depth, check_lsid, type_name, wrong_type
from mongoformats.large_events import SPLIT_STAGE, without_split_stage
from mongoformats.mql import unsupported_in_query
from mongoformats.resume_token import (
    decode_token,
    token_sort_key,
)

FULL_DOCUMENT = ("default", "updateLookup", "whenAvailable", "required")
BEFORE_CHANGE = ("off", "whenAvailable", "required")

# The server's pipeline length limit (internalPipelineLengthLimit, 1000 in release builds), checked
# before any stage is parsed: Pipeline::parseCommon in src/mongo/db/pipeline/pipeline.cpp fails a
# longer one with 7749501 "Pipeline length must be no longer than 1000 stages." (jstest
# sharding/query/pipeline_length_limit.js). It bounds the $match a stream evaluates per event.
MAX_PIPELINE_STAGES = 1000


def check_pipeline(pipeline: Any, command: str) -> list[dict[str, Any]]:
    """A command's `pipeline` checked as the server's aggregate parser checks it: an array of at
    most MAX_PIPELINE_STAGES documents."""
    if pipeline is None:
        return []
    if not isinstance(pipeline, list):
        raise wrong_type(f"{command}.pipeline", pipeline, "array")
    if len(pipeline) > MAX_PIPELINE_STAGES:
        raise MongoError(
            7749501, f"Pipeline length must be no longer than {MAX_PIPELINE_STAGES} stages."
        )
    if not all(isinstance(stage, dict) for stage in pipeline):
        raise MongoError("TypeMismatch", "Each element of the 'pipeline' array must be an object")
    return pipeline


# -- parallelChangeStream and its status ----------------------------------------------------------

_OPEN_FIELDS = frozenset(
    {
        "parallelChangeStream",
        "nBuckets",
        "name",
        "bucket",
        "pipeline",
        "fullDocument",
        "showExpandedEvents",
        "showSystemEvents",
        "startAtOperationTime",
        "resumeAfter",
        "startAfter",
        "batchSize",
        "maxAwaitTimeMS",
        "shardBufferBytes",
        "bucketBufferBytes",
        "readerProcesses",
        "fullDocumentBeforeChange",
        "bucketBy",
        # generic fields drivers add to every command
        "lsid",
        "$clusterTime",
        "$readPreference",
        "txnNumber",
        "autocommit",
        "apiVersion",
        "comment",
        "$db",
        "readConcern",
        "writeConcern",
    }
)


def _mentions_full_document(stages: Any) -> bool:
    """True if a field path anywhere in `stages` starts with fullDocument (or
    fullDocumentBeforeChange), or an expression reads the whole event ($$ROOT, $$CURRENT), which
    holds those fields."""
    if isinstance(stages, Mapping):
        return any(
            str(k).startswith("fullDocument") or _mentions_full_document(v)
            for k, v in stages.items()
        )
    if isinstance(stages, list):
        return any(_mentions_full_document(v) for v in stages)
    return isinstance(stages, str) and _path_mentions_full_document(stages)


def _path_mentions_full_document(text: str) -> bool:
    """Whether a string of a pipeline is a field path into fullDocument (or
    fullDocumentBeforeChange), or a variable that holds the whole event."""
    variable, _, path = text.partition(".") if text.startswith("$$") else ("", "", text[1:])
    return (variable in VARIABLES and not path) or (
        text.startswith("$") and path.startswith("fullDocument")
    )


def int_option(
    cmd: Mapping[str, Any], name: str, low: int, high: int, *, command: str = "parallelChangeStream"
) -> int | None:
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
    if (
        isinstance(number, decimal.Decimal)
        and number.is_nan()
        or not low <= number <= high
        or int(number) != number
    ):
        raise MongoError(
            "BadValue", f"{name} must be an integer between {low} and {high}, not {shown(value)}"
        )
    return int(number)


def shown(value: Any, limit: int = 100) -> str:
    """`value` for an error message, cut to `limit` characters: a client's junk is not echoed
    whole."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


_MAX_BYTES = 1 << 50  # a byte budget above this is a typo, not memory
MAX_READER_PROCESSES = 64  # the most a stream (readerProcesses) or the engine's default may ask
# The stream settings an open command may pass, with their ranges (defaults: EngineConfig).
_SETTINGS = {
    "shardBufferBytes": (1, _MAX_BYTES),
    "bucketBufferBytes": (1, _MAX_BYTES),
    "maxAwaitTimeMS": (0, (1 << 31) - 1),
    "readerProcesses": (0, MAX_READER_PROCESSES),
}

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
            raise MongoError(
                "BadValue", f"after has {len(after)} tokens: at most {MAX_BUCKETS}, one per bucket"
            )
        for i, token in enumerate(after):
            _check_token(token, f"parallelChangeStreamStatus.after.{i}")
    int_option(cmd, "maxEvents", 1, 1 << 62, command="parallelChangeStreamStatus")


def setting(cmd: Mapping[str, Any], name: str, default: int) -> int:
    """One of _SETTINGS (checked when the command came in, check_open_command), or its default."""
    value = int_option(cmd, name, *_SETTINGS[name])
    return default if value is None else value


def check_open_command(cmd: dict[str, Any]) -> dict[str, Any]:
    """Every field of a parallelChangeStream command checked before anything is created, with the
    codes and messages of the server's parsers for the same fields of $changeStream (TypeMismatch
    for a wrong type, BadValue for a bad value, IDLUnknownField, 7749501 for a long pipeline):
    a malformed command fails, never the stream later. The command, null options left out (the
    server's parsers take a null optional field as absent)."""
    check_depth(cmd)
    _check_known_fields(cmd)
    first = next(iter(cmd))
    cmd = {k: v for k, v in cmd.items() if v is not None or k == first}
    check_lsid(cmd)
    if sum(k in cmd for k in ("startAtOperationTime", "resumeAfter", "startAfter")) > 1:
        raise MongoError(
            40674, "Only one type of resume option is allowed, but multiple were found."
        )
    _check_options(cmd)
    check_stream_name(cmd.get("name"), "parallelChangeStream")
    check_pipeline(cmd.get("pipeline"), "parallelChangeStream")
    for field in ("resumeAfter", "startAfter"):
        if field in cmd:
            _check_tokens(cmd[field], field)
    return cmd


def _check_known_fields(cmd: Mapping[str, Any]) -> None:
    for key in cmd:
        if key not in _OPEN_FIELDS:
            raise MongoError(
                "IDLUnknownField",
                f"BSON field 'parallelChangeStream.{shown(key)}' is an unknown field.",
            )


def _check_options(cmd: Mapping[str, Any]) -> None:
    """The typed options of a parallelChangeStream command, in the order the checks run."""
    for name, (low, high) in _SETTINGS.items():
        int_option(cmd, name, low, high)
    int_option(cmd, "nBuckets", 1, MAX_BUCKETS)
    int_option(cmd, "bucket", 0, MAX_BUCKETS - 1)
    int_option(cmd, "batchSize", 0, 1 << 30)
    _check_types(cmd, _OPTION_TYPES)
    if "bucketBy" in cmd and cmd["bucketBy"] not in BUCKET_BY:
        raise MongoError(
            "BadValue",
            f"'{shown(cmd['bucketBy'])}' is not a valid bucketBy option; "
            f"use one of {', '.join(BUCKET_BY)}",
        )
    _check_types(cmd, _START_TYPE)


# The typed options of a parallelChangeStream command: (field, Python type, BSON type name).
_OPTION_TYPES = (
    ("fullDocument", str, "string"),
    ("fullDocumentBeforeChange", str, "string"),
    ("showExpandedEvents", bool, "bool"),
    ("showSystemEvents", bool, "bool"),
    ("bucketBy", str, "string"),
)
_START_TYPE = (("startAtOperationTime", Timestamp, "timestamp"),)


def _check_types(cmd: Mapping[str, Any], types: tuple[tuple[str, type, str], ...]) -> None:
    """TypeMismatch (IDL's message) for the first of `types`' fields that `cmd` gives with
    another type."""
    for field, python_type, bson_type in types:
        if field in cmd and not isinstance(cmd[field], python_type):
            raise wrong_type(f"parallelChangeStream.{field}", cmd[field], bson_type)


def _check_tokens(tokens: Any, field: str) -> None:
    """resumeAfter or startAfter: one token, or a list of one per bucket."""
    if isinstance(tokens, list):
        if not tokens or len(tokens) > MAX_BUCKETS:
            raise MongoError(
                "BadValue",
                f"{field} takes one token, or a list of 1 to "
                f"{MAX_BUCKETS} bucket tokens, not {len(tokens)}",
            )
        for i, token in enumerate(tokens):
            _check_token(token, f"parallelChangeStream.{field}.{i}")
    else:
        _check_token(tokens, f"parallelChangeStream.{field}")


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
            raise MongoError(
                "BadValue",
                f"{field} has {len(tokens)} bucket tokens but nBuckets is {n}: tokens of a "
                "stream with another bucket count resume it only if they are all the same token "
                "(read every bucket up to one token first)",
            )
        return {**cmd, field: tokens[0]}
    return cmd


@dataclass(frozen=True)
class OpenRequest:
    """A parallelChangeStream command, checked: open a named stream of `n` buckets (or attach to
    one of its buckets, `bucket`), from `cmd`'s start point."""

    cmd: dict[str, Any]  # checked, null options left out, one resume token if common
    n: int | None  # nBuckets
    bucket: int | None  # attach to this bucket alone
    name: str | None
    batch_size: int | None


def read_open(cmd: dict[str, Any]) -> OpenRequest:
    """`cmd` checked (check_open_command) with the values of its fullDocument options, and a
    list of bucket tokens of another length than nBuckets taken as its common token."""
    cmd = check_open_command(cmd)
    if cmd.get("fullDocument", "default") not in FULL_DOCUMENT:
        raise MongoError(
            "BadValue",
            f"'{shown(cmd['fullDocument'])}' is not a valid "
            f"fullDocument option; use one of {', '.join(FULL_DOCUMENT)}",
        )
    if cmd.get("fullDocumentBeforeChange", "off") not in BEFORE_CHANGE:
        raise MongoError(
            "BadValue",
            f"'{shown(cmd['fullDocumentBeforeChange'])}' is not a "
            "valid fullDocumentBeforeChange option; use one of "
            f"{', '.join(BEFORE_CHANGE)}",
        )
    n = int_option(cmd, "nBuckets", 1, MAX_BUCKETS)
    bucket = int_option(cmd, "bucket", 0, MAX_BUCKETS - 1)
    cmd = _one_token_if_common(cmd, n)
    return OpenRequest(cmd, n, bucket, cmd.get("name"), int_option(cmd, "batchSize", 0, 1 << 30))


def _match_query(stage: dict[str, Any]) -> Any:
    """The query of a $match stage the engine's query language evaluates; BadValue for any
    other stage or query."""
    if set(stage) != {"$match"}:
        raise MongoError(
            "BadValue",
            "parallelChangeStream pipelines may only contain $match stages "
            f"(and a final {SPLIT_STAGE})",
        )
    if (unsupported := unsupported_in_query(stage["$match"])) is not None:
        raise MongoError(
            "BadValue", f"parallelChangeStream's $match does not support {shown(unsupported)}"
        )
    return stage["$match"]


def open_match(cmd: Mapping[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """The $match a parallelChangeStream's pipeline applies as events are dealt (None: none), and
    whether it ends with the split stage. Only $match stages, of what the engine's query language
    evaluates, and none that tests the fields lookups add (it runs before them)."""
    checked = check_pipeline(cmd.get("pipeline"), "parallelChangeStream")
    pipeline, split = without_split_stage(checked)
    queries = [_match_query(stage) for stage in pipeline]
    # One flat $and: its depth does not grow with the number of stages.
    match = None if not queries else queries[0] if len(queries) == 1 else {"$and": queries}
    if (
        cmd.get("fullDocument", "default") != "default"
        or cmd.get("fullDocumentBeforeChange", "off") != "off"
    ) and _mentions_full_document(pipeline):
        # The $match runs as events are dealt, before any lookup: it would not see post-images.
        raise MongoError(
            "BadValue",
            "with fullDocument: 'updateLookup' or fullDocumentBeforeChange, the "
            "pipeline's $match may not test those fields (it runs before the lookups)",
        )
    return match, split


def read_drop(cmd: dict[str, Any]) -> str:
    """The name a dropParallelChangeStream command names, checked."""
    check_depth(cmd)
    check_lsid(cmd)
    name = cmd["dropParallelChangeStream"]
    if not isinstance(name, str):
        raise wrong_type("dropParallelChangeStream", name, "string")
    check_stream_name(name, "dropParallelChangeStream")
    return name
