"""Blocking helpers over unmodified pymongo: what a Spark task (or any Python consumer) runs.

`read_bucket` attaches to one bucket after a start token and stops exactly at the end token, so
reading (start, end] returns the same events every time: a retried Spark task returns the same
rows.
"""

from __future__ import annotations

import binascii
import gc
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pymongo
from bson.raw_bson import RawBSONDocument
from pymongo.uri_parser import split_options

from mongoformats.codecs import RAW as RAW_OPTS
from mongoformats.large_events import join_fragments

CURSOR_COLLECTION = "$cmd.parallelChangeStream"


@dataclass(frozen=True)
class StreamSpec:
    """What identifies a stream on the proxy; carried in every partition so a task is
    self-contained."""

    uri: str
    name: str
    n_buckets: int
    show_expanded_events: bool = True
    pipeline: tuple[dict[str, Any], ...] = field(default=())
    full_document: str = "default"  # or "updateLookup", "whenAvailable", "required"
    full_document_before_change: str = "off"
    # Engine options passed through when the stream is created (shardBufferBytes, bucketBufferBytes,
    # readerProcesses, maxAwaitTimeMS), as (name, value) pairs so the spec stays hashable.
    engine_options: tuple[tuple[str, int], ...] = ()
    bucket_by: str = "namespace"  # or "documentKey" (buckets/bucketing.py)

    def open_command(self, **extra: Any) -> dict[str, Any]:
        cmd: dict[str, Any] = {
            "parallelChangeStream": 1,
            "nBuckets": self.n_buckets,
            "name": self.name,
            "showExpandedEvents": self.show_expanded_events,
            "bucketBy": self.bucket_by,
        }
        if self.pipeline:
            cmd["pipeline"] = list(self.pipeline)
        if self.full_document != "default":
            cmd["fullDocument"] = self.full_document
        if self.full_document_before_change != "off":
            cmd["fullDocumentBeforeChange"] = self.full_document_before_change
        cmd.update(self.engine_options)
        cmd.update(extra)
        return cmd


def token_key(data_hex: str) -> bytes:
    return binascii.unhexlify(data_hex)


# A change event begins with its resume token: `_id` (type 3) holding `_data` (type 2), a string.
_ID_HEAD, _DATA_HEAD = b"\x03_id\x00", b"\x02_data\x00"
_SPLIT_EVENT = b"\x03splitEvent\x00"  # in a fragment's bytes: then checked at the top level


def _token_key_of(ev: RawBSONDocument) -> bytes:
    """token_key of the event's `_id._data`, read from its leading bytes where they are laid out
    as above: reading `ev["_id"]` would decode every top-level field of the event, each nested
    document an object made in Python, for every event a task reads."""
    raw = ev.raw
    if raw[4:9] == _ID_HEAD and raw[13:20] == _DATA_HEAD:
        size = int.from_bytes(raw[20:24], "little")  # the string's bytes and its closing 0
        return binascii.unhexlify(raw[24 : 23 + size])
    return token_key(ev["_id"]["_data"])


# What a task's client uses where the uri says nothing (a keyword would override the uri's own
# option, so these are only filled in). socketTimeoutMS: how long a task waits for any one reply
# of the proxy's before it fails and Spark retries it; pymongo's default is to wait forever, so a
# proxy that hangs, or a network that drops its packets, would hold the micro-batch for good.
# Generous, as a getMore waits up to maxAwaitTimeMS and may look documents up for its events.
CLIENT_DEFAULTS: dict[str, Any] = {
    "serverSelectionTimeoutMS": 10_000,
    "socketTimeoutMS": 120_000,
    "appname": "bucketspark",
}


def settle_worker_heap() -> None:
    """Keep the cyclic garbage collector out of a Spark Python worker's way while it converts
    events; called at a task's start, once the worker's modules are loaded.

    A worker holds the modules of pyspark, pyarrow and pandas (pyarrow imports pandas at its
    first conversion of Python values, made here so that they are loaded first): some hundred
    thousand objects, which every full collection walks. A task makes several short-lived
    containers per event (rows, decoded events, write requests) and holds thousands of write
    requests until their bulk write, so collections come often, and walking those modules cost
    the tasks about as much as decoding the events. So what exists now is frozen, as the proxy
    does with its own (buckets/_columnar/allocator.py): still freed when no longer referenced,
    only no longer walked. pyspark's daemon collects after each task, so what is frozen is what
    the worker keeps; a reused worker freezes again at each task, which costs little.
    """
    import pyarrow as pa

    pa.array([0])
    gc.freeze()


def client_for(uri: str) -> pymongo.MongoClient[Any]:
    # The uri's query alone, read as pymongo reads it (names in any case): a mongodb+srv name is
    # not looked up once more for this.
    query = uri.partition("?")[2]
    given = split_options(query) if query else {}
    return pymongo.MongoClient(uri, **{k: v for k, v in CLIENT_DEFAULTS.items() if k not in given})


def read_bucket(
    client: pymongo.MongoClient[Any],
    spec: StreamSpec,
    bucket: int,
    start: str,
    end: str,
    *,
    batch_size: int = 1000,
    max_await_ms: int = 500,
    max_events: int | None = None,
) -> Iterator[RawBSONDocument]:
    """Events of `bucket` with start < token <= end (tokens given as `_data` hex strings).

    A stream opened with $changeStreamSplitLargeEvent returns an event over 16 MiB in fragments,
    which may span getMores: they are joined back into the event, whose token is the one compared
    with `end` (a batch's end is an event's token, never a fragment's)."""
    end_key = token_key(end)
    if token_key(start) >= end_key:
        return
    admin = client.admin
    reply = admin.command(
        spec.open_command(bucket=bucket, resumeAfter={"_data": start}, batchSize=batch_size),
        codec_options=RAW_OPTS,
    )
    cursor = reply["cursor"]
    cid = cursor["id"]
    batch = cursor["firstBatch"]
    pbrt = cursor["postBatchResumeToken"]
    seen = 0
    fragments: list[bytes] = []
    try:
        while True:
            for ev in _whole_events(batch, fragments):
                if _token_key_of(ev) > end_key:
                    return
                yield ev
                seen += 1
                if max_events is not None and seen >= max_events:
                    return
            if token_key(pbrt["_data"]) >= end_key and not fragments:
                return
            more = admin.command(
                {
                    "getMore": cid,
                    "collection": CURSOR_COLLECTION,
                    "batchSize": batch_size,
                    "maxTimeMS": max_await_ms,
                },
                codec_options=RAW_OPTS,
            )
            batch = more["cursor"]["nextBatch"]
            pbrt = more["cursor"]["postBatchResumeToken"]
    finally:
        admin.command({"killCursors": CURSOR_COLLECTION, "cursors": [cid]})


def _whole_events(
    batch: list[RawBSONDocument], fragments: list[bytes]
) -> Iterator[RawBSONDocument]:
    """The events of `batch`, the fragments of a split event joined back into it once its last
    has come; the fragments of an event not yet whole stay in `fragments` for the next batch."""
    for ev in batch:
        # pymongo may hand the events out as memoryview slices of the reply, which a bytes
        # search does not take: bytes() copies those, and only those.
        data = bytes(ev.raw)
        if _SPLIT_EVENT in data and "splitEvent" in ev:
            fragments.append(data)
            if ev["splitEvent"]["fragment"] < ev["splitEvent"]["of"]:
                continue
            ev = RawBSONDocument(join_fragments(fragments), RAW_OPTS)
            fragments.clear()
        yield ev


def open_stream(client: pymongo.MongoClient[Any], spec: StreamSpec, **start: Any) -> list[str]:
    """Create (or join) the stream; returns each bucket's starting token (`_data`) and closes the
    cursors."""
    admin = client.admin
    reply = admin.command(spec.open_command(**start))
    cursors = list(reply["cursors"])
    admin.command({"killCursors": CURSOR_COLLECTION, "cursors": [c["id"] for c in cursors]})
    return [c["postBatchResumeToken"]["_data"] for c in cursors]


def plan_end(
    client: pymongo.MongoClient[Any], spec: StreamSpec, after: list[str], max_events: int | None
) -> str:
    cmd: dict[str, Any] = {
        "parallelChangeStreamStatus": 1,
        "name": spec.name,
        "after": [{"_data": t} for t in after],
    }
    if max_events is not None:
        cmd["maxEvents"] = max_events
    reply = client.admin.command(cmd)
    return str(reply["planEnd"]["_data"])
