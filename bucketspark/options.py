"""The Spark source's options, parsed and checked without Spark.

The source's own names (camelCase) and the MongoDB Spark connector's, where they mean the same
(its ReadConfig, and the "Streaming Read Configuration Options" of its documentation):
`connection.uri` (= uri), `database` and `collection` (filters: only that database's events, of
those collections; `collection` is a comma-separated list, `\\` escaping, `*` for all),
`aggregation.pipeline` (= pipeline; a list of stages or one stage, extended JSON),
`change.stream.lookup.full.document` (= fullDocument), `change.stream.publish.full.document.only`
(rows carry the changed document in `event`/`eventJson`, events without one are left out; implies
fullDocument updateLookup unless another post-image mode is set), `change.stream.startup.mode`
(latest | timestamp) and `change.stream.startup.mode.timestamp.start.at.operation.time`
(= startAtOperationTime). A connector name may also carry the SparkConf prefix
`spark.mongodb.read.`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from bucketspark.client import StreamSpec

# The `bucketBy` values the proxy's parallelChangeStream accepts (docs/commands.md); checked here so
# that a typo fails when the query is defined, not in a Spark task.
BUCKET_BY = ("namespace", "documentKey")

# Every option the source takes, by its documented name: (kind, low, high). Spark lowercases
# option names, so they are matched without case.
_INT_MAX = (1 << 63) - 1
_OPTIONS: dict[str, tuple[str, int, int]] = {
    "uri": ("str", 0, 0),
    "name": ("str", 0, 0),
    "nBuckets": ("int", 1, 1024),
    "bucketBy": ("str", 0, 0),
    "pipeline": ("pipeline", 0, 0),
    "startAtOperationTime": ("timestamp", 0, 0),
    "startTokens": ("json list", 0, 0),
    "endToken": ("str", 0, 0),  # a bounded (batch) read's range
    "showExpandedEvents": ("bool", 0, 0),
    "fullDocument": ("str", 0, 0),
    "fullDocumentBeforeChange": ("str", 0, 0),
    "maxEventsPerTrigger": ("int", 1, _INT_MAX),
    "jsonColumn": ("bool", 0, 0),
    "batchSize": ("int", 1, _INT_MAX),
    # The engine's, used when the proxy creates the stream (it checks their ranges: BadValue).
    "shardBufferBytes": ("int", 0, _INT_MAX),
    "bucketBufferBytes": ("int", 0, _INT_MAX),
    "readerProcesses": ("int", 0, _INT_MAX),
    "maxAwaitTimeMS": ("int", 0, _INT_MAX),
    # The MongoDB Spark connector's names (its ReadConfig and "Streaming Read Configuration
    # Options"), where they mean the same here.
    "database": ("str", 0, 0),
    "collection": ("collections", 0, 0),
    "change.stream.publish.full.document.only": ("bool", 0, 0),
    "change.stream.startup.mode": ("startup mode", 0, 0),
}
# The connector's name for an option that has a name of its own here: either may be given, both
# only with one value.
_ALIASES: dict[str, str] = {
    "connection.uri": "uri",
    "aggregation.pipeline": "pipeline",
    "change.stream.lookup.full.document": "fullDocument",
    "change.stream.startup.mode.timestamp.start.at.operation.time": "startAtOperationTime",
}
ENGINE_OPTIONS = ("shardBufferBytes", "bucketBufferBytes", "readerProcesses", "maxAwaitTimeMS")
# How a SparkConf spells the connector's read options; accepted on an option name as well.
_CONNECTOR_PREFIX = "spark.mongodb.read."


class Options:
    """The source's options, each checked when the query is defined: a misspelt name (Spark
    would otherwise let `nBucket` through, and the query run with 4 buckets) or a value of the
    wrong kind (`showExpandedEvents=ture` read as false) is a ValueError naming the option. An
    option given under both its names with different values is refused naming both."""

    def __init__(self, raw: Any) -> None:
        by_lower = {name.lower(): name for name in (*_OPTIONS, *_ALIASES)}
        self._values: dict[str, Any] = {}
        given_as: dict[str, tuple[str, str]] = {}  # option -> (the name it was given as, its text)
        for key, text in dict(raw).items():
            lower = str(key).lower()
            lower = (
                lower[len(_CONNECTOR_PREFIX) :] if lower.startswith(_CONNECTOR_PREFIX) else lower
            )
            spelt = by_lower.get(lower)
            if spelt is None:
                raise ValueError(
                    f"parallelchangestream: unknown option {key!r}; the options are "
                    f"{', '.join((*_OPTIONS, *_ALIASES))}"
                )
            name = _ALIASES.get(spelt, spelt)
            value = _parse_option(name, str(text), spelt)
            if name in given_as and self._values[name] != value:
                other, other_text = given_as[name]
                raise ValueError(
                    f"parallelchangestream: options {other} ({other_text!r}) and {spelt} "
                    f"({text!r}) name the same setting with different values; give one"
                )
            given_as[name] = (spelt, str(text))
            self._values[name] = value
        self._check_startup_mode()

    def _check_startup_mode(self) -> None:
        # The connector starts at a time only in mode "timestamp"; here a start time alone
        # suffices, and a mode contradicting the options given is refused rather than ignored.
        mode = self._values.pop("change.stream.startup.mode", None)
        at = self._values.get("startAtOperationTime")
        if mode == "latest" and at is not None:
            raise ValueError(
                "parallelchangestream: change.stream.startup.mode is 'latest' but a start time "
                "(startAtOperationTime) is given"
            )
        if mode == "timestamp" and at is None:
            raise ValueError(
                "parallelchangestream: change.stream.startup.mode is 'timestamp' but no start time "
                "is given (change.stream.startup.mode.timestamp.start.at.operation.time)"
            )

    def get(self, name: str, default: Any = None) -> Any:
        assert name in _OPTIONS, name
        return self._values.get(name, default)


def parse_start_time(text: str) -> Any:
    """A start time as a BSON Timestamp, from any of: "<seconds>,<increment>" or "<seconds>",
    "Timestamp(<seconds>, <increment>)" (mongosh), an ISO-8601 instant with a time zone and
    whole seconds ("2026-01-01T00:00:30Z", the connector's form), or extended JSON
    {"$timestamp": {"t": <seconds>, "i": <increment>}}. A time without an increment starts at
    the first event of that second. ValueError for anything else."""
    import datetime
    import re

    from bson import Timestamp, json_util

    text = text.strip()
    if m := re.fullmatch(r"Timestamp\(\s*(\d+)\s*,\s*(\d+)\s*\)", text):
        return Timestamp(int(m[1]), int(m[2]))
    if m := re.fullmatch(r"(\d+)\s*(?:,\s*(\d+))?", text):
        return Timestamp(int(m[1]), int(m[2] or 0))
    if text.startswith("{"):
        value = json_util.loads(text)
        if not isinstance(value, Timestamp):
            raise ValueError
        return value
    at = datetime.datetime.fromisoformat(
        text.replace("Z", "+00:00") if text.endswith("Z") else text
    )
    if at.tzinfo is None or at.microsecond:
        raise ValueError  # a local time is ambiguous; cluster times have whole seconds
    return Timestamp(int(at.timestamp()), 0)


def _parse_pipeline(text: str) -> list[Any]:
    """A pipeline as extended JSON: a list of stages, or one stage (the connector takes both)."""
    from bson import json_util

    value = json_util.loads(text)
    stages = [value] if isinstance(value, dict) else value
    if not isinstance(stages, list) or not all(isinstance(s, dict) for s in stages):
        raise ValueError
    return stages


def _parse_collections(text: str) -> tuple[str, ...]:
    r"""The connector's `collection`: names separated by commas, a backslash escaping a comma,
    an asterisk or itself; "*" alone is every collection of the database (the empty tuple)."""
    if text == "*":
        return ()
    names: list[str] = []
    current: list[str] = []
    escaped = False
    for ch in text:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            names.append("".join(current))
            current = []
        else:
            current.append(ch)
    names.append("".join(current))
    if escaped or not all(names):
        raise ValueError
    return tuple(names)


def _one_of(text: str, choices: tuple[str, ...]) -> str:
    """`text` in lower case if it is one of `choices` (lower case), else ValueError."""
    if text.lower() not in choices:
        raise ValueError
    return text.lower()


def _int_between(text: str, low: int, high: int) -> int:
    value = int(text)
    if not low <= value <= high:
        raise ValueError
    return value


def _json_list(text: str) -> list[Any]:
    value = json.loads(text)
    if not isinstance(value, list):
        raise ValueError
    return value


# How an option's text is read, by its kind: (text, low, high) -> value, or ValueError,
# TypeError or OverflowError for text that is not of the kind.
_PARSERS: dict[str, Callable[[str, int, int], Any]] = {
    "str": lambda text, low, high: text,
    "bool": lambda text, low, high: _one_of(text, ("true", "false")) == "true",
    "int": _int_between,
    "timestamp": lambda text, low, high: parse_start_time(text),
    "pipeline": lambda text, low, high: _parse_pipeline(text),
    "collections": lambda text, low, high: _parse_collections(text),
    "startup mode": lambda text, low, high: _one_of(text, ("latest", "timestamp")),
    "json list": lambda text, low, high: _json_list(text),
}


def _wanted(kind: str, low: int, high: int) -> str:
    """What an option of `kind` takes, for the error naming it."""
    span = f"between {low} and {high}" if high < _INT_MAX else f"of at least {low}"
    return {
        "bool": "true or false",
        "int": f"an integer {span}",
        "timestamp": '"<seconds>,<increment>", "Timestamp(<seconds>, <increment>)", an '
        "ISO-8601 instant with a time zone and whole seconds, or "
        '{"$timestamp": {"t": .., "i": ..}}',
        "pipeline": "a JSON list of stages (or one stage)",
        "json list": "a JSON list",
        "collections": r"collection names separated by commas (\ escapes), or *",
        "startup mode": "latest or timestamp",
    }[kind]


def _parse_option(name: str, text: str, spelt: str | None = None) -> Any:
    kind, low, high = _OPTIONS[name]
    try:
        return _PARSERS[kind](text, low, high)
    except (ValueError, TypeError, OverflowError):
        raise ValueError(
            f"parallelchangestream: option {spelt or name} must be "
            f"{_wanted(kind, low, high)}, not {text!r}"
        ) from None


def namespace_match(database: str | None, collections: tuple[str, ...]) -> dict[str, Any] | None:
    """The $match stage keeping the events of `database` (of its `collections`, if any): the
    connector's database/collection options, as a filter on the stream's namespaces. A rename
    is kept by its source namespace, a dropDatabase by its database when no collection is named
    (its collections' drop events come before it, each with its own namespace)."""
    if database is None:
        if collections:
            raise ValueError("parallelchangestream: option collection needs option database")
        return None
    if not collections:
        return {"$match": {"ns.db": database}}
    return {"$match": {"ns.db": database, "ns.coll": {"$in": list(collections)}}}


def stream_spec(options: Options) -> StreamSpec:
    uri = options.get("uri")
    if not uri:
        raise ValueError(
            "parallelchangestream: option 'connection.uri' (or 'uri': the proxy's connection "
            "string) is required"
        )
    pipeline = _pipeline_of(options)
    bucket_by = options.get("bucketBy") or "namespace"
    if bucket_by not in BUCKET_BY:
        raise ValueError(
            f"parallelchangestream: option 'bucketBy' is {bucket_by!r}; use one of "
            f"{', '.join(BUCKET_BY)}"
        )
    return StreamSpec(
        uri=uri,
        name=options.get("name") or "spark",
        n_buckets=options.get("nBuckets", 4),
        bucket_by=bucket_by,
        show_expanded_events=options.get("showExpandedEvents", True),
        pipeline=tuple(pipeline),
        full_document=_full_document(options),
        full_document_before_change=options.get("fullDocumentBeforeChange") or "off",
        engine_options=tuple((k, v) for k in ENGINE_OPTIONS if (v := options.get(k)) is not None),
    )


def _pipeline_of(options: Options) -> list[Any]:
    """The stream's pipeline: the one given, after the database/collection filter if any."""
    pipeline = list(options.get("pipeline", ()))
    match = namespace_match(options.get("database"), options.get("collection", ()))
    if match is not None:
        pipeline.insert(0, match)  # first: a $changeStreamSplitLargeEvent stays the last stage
    return pipeline


def _full_document(options: Options) -> str:
    full_document: str = options.get("fullDocument") or "default"
    if options.get("change.stream.publish.full.document.only") and full_document == "default":
        return "updateLookup"  # as the connector: rows are documents, updates' looked up
    return full_document
